"""The artifact tools: granted by policy, saved with provenance, exactly once across a kill -9
(a real process killed inside a save, then the plan resumed by another)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stratagem.agents import ToolRegistry, artifact_grants, artifact_tools
from stratagem.planning import (
    ArtifactStore,
    Engine,
    Plan,
    PlanStatus,
    ToolStep,
    ref,
)
from stratagem.protocol import Policy

GRANT = """
version = 1
[[allow]]
caller = "tactical"
target = "artifact"
capabilities = ["save", "load"]

[[allow]]
caller = "strategic"
target = "*"
capabilities = ["*"]
"""


def test_the_policy_grants_the_tools_deny_by_default() -> None:
    policy = Policy.from_toml(GRANT)
    assert artifact_grants(policy, "tactical") == ("save", "load")
    # a "*" target never covers the artifact tools, nor does the default policy grant them
    assert artifact_grants(policy, "strategic") == ()
    assert artifact_grants(Policy.default(), "tactical") == ()
    assert artifact_grants(Policy.default(), "orchestrator") == ()


def _engine(store: ArtifactStore) -> Engine:
    registry = ToolRegistry("tactical")
    for item in artifact_tools(store):
        registry.register(item)
    return Engine(tools=registry, agent="tactical")


async def test_a_plan_saves_lists_and_loads_with_provenance(tmp_path: Path) -> None:
    store = ArtifactStore.open(tmp_path / "a")
    plan = Plan(
        id="report-1",
        owner="tactical",
        goal="write",
        steps=[
            ToolStep(
                id="save",
                tool="artifact.save",
                input={"name": "notes.json", "json": {"b": 1, "a": [1, 2]}, "inputs": ["f" * 64]},
            ),
            ToolStep(
                id="load",
                tool="artifact.load",
                input={"name": "notes.json", "as": "json"},
                depends_on=["save"],
            ),
            ToolStep(id="list", tool="artifact.list", input={}, depends_on=["save"]),
            ToolStep(
                id="again",
                tool="artifact.save",
                input={"name": "notes.txt", "text": ref("load.artifact.digest")},
                depends_on=["load", "list"],  # after the list, which then shows notes.json alone
            ),
        ],
    )
    result = await _engine(store).run(plan)
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    saved = result.outputs["save"]["artifact"]
    assert saved["name"] == "notes.json"
    assert saved["version"] == 1
    assert saved["scope"] == "plan"
    assert saved["scope_id"] == "report-1"
    assert saved["media_type"] == "application/json"
    assert result.outputs["load"]["data"] == {"a": [1, 2], "b": 1}
    assert [a["name"] for a in result.outputs["list"]["artifacts"]] == ["notes.json"]
    record = await store.record("notes.json", scope="plan", scope_id="report-1")
    prov = record.provenance
    assert (prov.agent, prov.plan_id, prov.revision, prov.step_id, prov.attempt) == (
        "tactical",
        "report-1",
        1,
        "save",
        1,
    )
    assert prov.inputs == ("f" * 64,)
    assert prov.tool == "artifact.save"
    assert prov.tool_version


@pytest.mark.parametrize(
    ("step_input", "words"),
    [
        ({"name": "../x", "text": "t"}, "name"),
        ({"name": "x.png", "text": "t", "media_type": "image/png"}, "media_type"),
        ({"name": "x", "text": "t", "json": 1}, "exactly one"),
        ({"name": "x", "base64": "***"}, "base64"),
        ({"name": "x", "text": "t", "scope": "goal"}, "goal id"),
    ],
)
async def test_bad_input_fails_the_step_as_logic_naming_it(
    tmp_path: Path, step_input: dict[str, object], words: str
) -> None:
    store = ArtifactStore.open(tmp_path / "a")
    plan = Plan(
        id="bad",
        owner="tactical",
        goal="g",
        steps=[ToolStep(id="s", tool="artifact.save", input=step_input)],
    )
    result = await _engine(store).run(plan)
    assert result.status is PlanStatus.FAILED
    [failure] = result.failures
    assert failure.failure_class == "logic"
    assert words in failure.message
    assert "\n" not in failure.message
    assert await store.list() == []


_RUN = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from stratagem.agents import ToolRegistry, artifact_tools
    from stratagem.planning import ArtifactStore, Engine, Plan, SqliteStateStore, ToolStep

    mode, root, pause = sys.argv[1], sys.argv[2], sys.argv[3]
    # A small artifact's bytes are kept with its record (no blob): one write to kill after.
    size = 1000 if pause == "after_small_record" else 100000
    store = ArtifactStore.open(root + "/artifacts")

    def paused(fn):
        def wrapper(*args):
            result = fn(*args)
            print("PAUSED", flush=True)
            time.sleep(600)  # killed here
            return result
        return wrapper

    if mode == "run" and pause == "after_blob":
        store.blobs.put = paused(store.blobs.put)
    if mode == "run" and pause in ("after_record", "after_small_record"):
        store.index.add = paused(store.index.add)
    registry = ToolRegistry("tactical")
    for item in artifact_tools(store):
        registry.register(item)
    plans = SqliteStateStore(root + "/plans.sqlite3")
    engine = Engine(tools=registry, agent="tactical", store=plans)
    plan = Plan(
        id="kill-me",
        owner="tactical",
        goal="g",
        steps=[
            ToolStep(id="save", tool="artifact.save",
                     input={"name": "out.txt", "text": "x" * size}),
            ToolStep(id="after", tool="artifact.list", input={}, depends_on=["save"]),
        ],
    )

    async def main():
        if mode == "run":
            await engine.run(plan)
        else:
            result = await engine.resume("kill-me")
            print(json.dumps({"status": str(result.status), "outputs": result.outputs}))

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("pause", ["after_blob", "after_record", "after_small_record"])
def test_kill_9_during_a_save_then_resume_one_version_no_orphan(tmp_path: Path, pause: str) -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", _RUN, "run", str(tmp_path), pause],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout is not None
        line = run.stdout.readline()
        assert line.strip() == "PAUSED", run.stderr.read() if run.stderr else ""
    finally:
        os.kill(run.pid, signal.SIGKILL)  # no close, no flush, no cleanup
        run.wait(timeout=60)
    assert run.returncode == -signal.SIGKILL
    resumed = subprocess.run(
        [sys.executable, "-c", _RUN, "resume", str(tmp_path), pause],
        capture_output=True,
        text=True,
        timeout=90,  # a step held at a reconcile gate would wait here for ever
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    answer = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert answer["status"] == "succeeded"
    assert answer["outputs"]["save"]["artifact"]["version"] == 1
    assert [a["version"] for a in answer["outputs"]["after"]["artifacts"]] == [1]
    store = ArtifactStore.open(tmp_path / "artifacts")
    assert [(r.name, r.version) for r in store.index.list()] == [("out.txt", 1)]
    assert store.sweep_blocking(grace_s=0).blobs == ()  # no orphan blob
    assert os.listdir(tmp_path / "artifacts" / "blobs" / "tmp") == []
    record, data = store.load_blocking("out.txt", scope="plan", scope_id="kill-me")
    assert data == b"x" * (1000 if pause == "after_small_record" else 100000)
    assert record.provenance.step_id == "save"
    blob_files = [p for p in (tmp_path / "artifacts" / "blobs").rglob("*") if p.is_file()]
    assert len(blob_files) == (0 if pause == "after_small_record" else 1)


async def test_the_step_span_carries_the_artifact_digest(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = ArtifactStore.open(tmp_path / "a")
    registry = ToolRegistry("tactical")
    for item in artifact_tools(store):
        registry.register(item)
    plan = Plan(
        id="traced",
        owner="tactical",
        goal="g",
        steps=[
            ToolStep(id="save", tool="artifact.save", input={"name": "t.txt", "text": "hi"}),
            ToolStep(id="load", tool="artifact.load", input={"name": "t.txt"}, depends_on=["save"]),
        ],
    )
    result = await Engine(tools=registry, agent="tactical", tracer_provider=provider).run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    digest = result.outputs["save"]["artifact"]["digest"]
    steps = {
        s.attributes["stratagem.step.id"]: s
        for s in exporter.get_finished_spans()
        if s.attributes and "stratagem.step.id" in s.attributes
    }
    for step in ("save", "load"):
        attributes = steps[step].attributes or {}
        assert attributes["stratagem.artifact.digest"] == digest
        assert attributes["stratagem.artifact.name"] == "t.txt"
        assert attributes["stratagem.artifact.version"] == 1
    provider.shutdown()
