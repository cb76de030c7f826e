"""``python -m tests.bench.model_load_agent JOB``: one agent of the model-load benchmark, in a
process of its own as a deployment's actor is: its role's agent with the model planner a deployment
gives it (``runtime.host._models.attach_model_planner``, from the settings in ``JOB``), asked to
plan the same request ``plans`` times, one after another, each under its caller's deadline. Prints
one JSON line per planning: how it ended, its wall time, its model calls."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from typing import Any

from stratagem.agents import build_agent
from stratagem.protocol import CAPABILITIES, CallContext, current_call
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.host._models import attach_model_planner


async def plan_once(agent: Any, job: dict[str, Any], number: int) -> dict[str, Any]:
    spec = CAPABILITIES[job["capability"]]
    request = spec.request.model_validate(job["request"])
    deadline_s = float(job["deadline_s"])
    current_call.set(
        CallContext(
            caller="orchestrator",
            target=job["role"],
            capability=job["capability"],
            request_id=uuid.uuid4().hex,
            deadline=time.monotonic() + deadline_s,
        )
    )
    started = time.perf_counter()
    outcome: dict[str, Any] = {"role": job["role"], "number": number}
    try:
        async with asyncio.timeout(deadline_s):  # the caller stops waiting at its deadline
            made = agent.planner.plan(job["capability"], request, plan_id=f"bench-{number}")
            plan = await made if asyncio.iscoroutine(made) else made
    except TimeoutError:
        outcome["outcome"] = "deadline"
    except Exception as exc:  # the benchmark records how a planning ended, whatever it was
        outcome["outcome"] = f"failed: {type(exc).__name__}"
        outcome["message"] = str(exc)[:300]
    else:
        provenance = plan.provenance
        author = provenance.author if provenance is not None else ""
        outcome["outcome"] = "model" if author.startswith("model:") else "fallback"
        outcome["calls"] = len(provenance.calls) if provenance is not None else 0
        outcome["accepted"] = sum(
            1
            for c in (provenance.calls if provenance is not None else [])
            if c.outcome == "accepted"
        )
    outcome["wall_s"] = round(time.perf_counter() - started, 3)
    return outcome


async def main(job: dict[str, Any]) -> None:
    logging.getLogger("stratagem").setLevel(logging.ERROR)
    settings = Settings.model_validate(job["settings"])
    agent = build_agent(job["role"], entry_points=False)
    if not attach_model_planner(agent, settings):
        raise SystemExit(f"no model planner for {job['role']}")
    print(json.dumps({"role": job["role"], "ready": True}), flush=True)
    sys.stdin.readline()  # every agent starts planning at once
    for number in range(int(job["plans"])):
        print(json.dumps(await plan_once(agent, job, number)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
