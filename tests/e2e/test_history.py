"""The history as a user meets it: a deployment's plans, their outputs and trace ids survive
``down``/``up``; a failed goal names where it failed and its trace; ``submit --detach`` answers at
once; ``stratagem trace`` lists the recent traces."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import EXAMPLES, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def _up(state_dir: Path) -> None:
    up = run("up", "--json", state_dir=state_dir)
    assert up.returncode == 0, up.stderr[-2000:]


def _down(state_dir: Path) -> None:
    down = run("down", "--json", state_dir=state_dir)
    assert down.returncode == 0, down.stderr[-2000:]


def test_history_outputs_and_trace_ids_survive_down_and_up(tmp_path: Path) -> None:
    state = tmp_path / "state"
    nothing = tmp_path / "nothing.yaml"
    nothing.write_text(
        yaml.safe_dump({"goal": "Fly to the moon", "passage": "zzz qqq.", "beats": 1})
    )
    _up(state)
    try:
        goal = run("submit", str(EXAMPLES / "crown.yaml"), "--json", state_dir=state)
        assert goal.returncode == 0, goal.stderr[-2000:]
        done = json.loads(goal.stdout)
        # The goal's plans carry what each step did, structured.
        extract = next(p for p in done["plans"] if p["plan_id"].endswith("/extract"))
        assert all(step["output"] for step in extract["steps"])
        failed = run("submit", str(nothing), "--json", state_dir=state)
        assert failed.returncode == 1
        report = json.loads(failed.stdout)
        assert report["status"] == "failed"
        assert HEX32.match(report["trace_id"])
        assert report["trace_id"] != "0" * 32
        assert report["failure"].startswith(
            f"perception plan {report['plan_id']}/extract: step 'match' failed (logic)"
        )
        assert f"trace {report['trace_id']}" in failed.stderr
        assert f"stratagem plans show {report['plan_id']}" in failed.stderr
        ran = run(
            "plans", "run", str(EXAMPLES / "plans" / "who-leads.yaml"), "--json", state_dir=state
        )
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert HEX32.match(json.loads(ran.stdout)["trace_id"])
    finally:
        _down(state)
    _up(state)  # a real restart: new actors, nothing in their memory
    try:
        listed = run("plans", "list", "--limit", "1000", "--json", state_dir=state)
        assert listed.returncode == 0, listed.stderr[-2000:]
        ids = {p["plan_id"] for p in json.loads(listed.stdout)["plans"]}
        assert {done["plan_id"], report["plan_id"], "who-leads"} <= ids
        shown = run("plans", "show", done["plan_id"], "--json", state_dir=state)
        history = json.loads(shown.stdout)
        assert (history["status"], history["trace_id"]) == ("succeeded", done["trace_id"])
        again = next(p for p in history["plans"] if p["plan_id"].endswith("/extract"))
        assert again["steps"] == extract["steps"]
        readable = run("plans", "show", report["plan_id"], state_dir=state)
        assert readable.returncode == 0, readable.stderr[-2000:]
        first = readable.stdout.splitlines()[0]
        assert first.startswith(f"✗ failed: perception plan {report['plan_id']}/extract: step")
        replayed = run("replay", "who-leads", state_dir=state)
        assert replayed.returncode == 0, replayed.stderr[-2000:]
        assert "no divergence" in replayed.stdout
        traces = run("trace", "--json", state_dir=state)
        assert traces.returncode == 0, traces.stderr[-2000:]
        listed_traces = {t["trace_id"]: t for t in json.loads(traces.stdout)}
        assert listed_traces[report["trace_id"]]["plan_id"] == report["plan_id"]
        assert listed_traces[report["trace_id"]]["status"] == "failed"
        assert done["trace_id"] in listed_traces
        detached = run(
            "submit", str(EXAMPLES / "crown.yaml"), "--detach", "--json", state_dir=state
        )
        assert detached.returncode == 0, detached.stderr[-2000:]
        started = json.loads(detached.stdout)
        assert started["status"] in ("running", "succeeded")
        assert HEX32.match(started["trace_id"])
        watched = run("plans", "watch", started["plan_id"], "--json", state_dir=state)
        assert watched.returncode == 0, watched.stderr[-2000:]
        events = [json.loads(line) for line in watched.stdout.splitlines()]
        assert {e["agent"] for e in events} == {
            "orchestrator",
            "perception",
            "strategic",
            "tactical",
        }
        assert (events[-1]["plan_id"], events[-1]["status"]) == (started["plan_id"], "succeeded")
        shown = json.loads(
            run("plans", "show", started["plan_id"], "--json", state_dir=state).stdout
        )
        assert (shown["status"], shown["trace_id"]) == ("succeeded", started["trace_id"])
    finally:
        _down(state)
