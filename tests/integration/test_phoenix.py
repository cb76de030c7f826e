"""One trace per goal in a real backend: Arize Phoenix, started by this module on 127.0.0.1.

``scripts/otel_backend.sh`` installs Phoenix into its own virtual environment (under
``~/.cache/stratagem``, once: it takes minutes) and starts it on free loopback ports. The driver
and the four agents export their spans with the real OTLP gRPC exporter; the test reads them back
through Phoenix's REST API
(``GET /v1/projects/{project}/spans?trace_id=…``) and checks the trace's shape. Where Phoenix
cannot be installed the module is skipped, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from stratagem.agents import DEMO_GOAL
from stratagem.planning import PlanStatus, SqliteStateStore
from stratagem.protocol import (
    OPERATOR,
    ROLES,
    AgentClient,
    PermissionDeniedError,
    RemoteError,
    SubmitGoalRequest,
)
from stratagem.runtime import Deployment, Settings, load_settings, run_goal
from stratagem.runtime.telemetry._backend import BackendState, PhoenixTraces
from stratagem.runtime.telemetry._telemetry import SpanRecord, setup_telemetry
from tests.integration._agents import file_lines, kill_and_wait, pid_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "otel_backend.sh"
FINAL = {status.value for status in PlanStatus if status.is_final}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendState]:
    """Phoenix on free ports of 127.0.0.1, stopped (by its PID) at the module's end."""
    folder = tmp_path_factory.mktemp("phoenix")
    env = {
        **os.environ,
        "OTEL_BACKEND_DIR": str(folder),
        "PHOENIX_PORT": str(_free_port()),
        "PHOENIX_GRPC_PORT": str(_free_port()),
    }
    started = subprocess.run(
        ["bash", str(SCRIPT), "start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    if started.returncode != 0:
        reason = f"Phoenix could not be installed or started: {started.stderr.strip()[-2000:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield BackendState(**json.loads((folder / "backend.json").read_text()))
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, timeout=60, check=False)


@pytest.fixture(scope="module")
def exported(
    phoenix: BackendState,
    deployment: Deployment,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    """Four agents (on the session's Ray, in their own namespace) exporting to Phoenix over OTLP,
    the driver's spans too. The tactical agent has the test tools (``refuse`` fails a step)."""
    # The driver: the session's provider (or a new one) gets a real OTLP exporter.
    provider = setup_telemetry("stratagem-tests")
    assert isinstance(provider, TracerProvider)
    exporting = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=phoenix.otlp_endpoint, insecure=True),
        schedule_delay_millis=200,
    )
    provider.add_span_processor(exporting)
    # The agents: the launcher forwards OTEL_* from this environment to the actors it creates.
    patch = pytest.MonkeyPatch()
    patch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    patch.delenv("OTEL_SDK_DISABLED", raising=False)
    patch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", phoenix.otlp_endpoint)
    patch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    patch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    settings: Settings = load_settings(
        state_dir=tmp_path_factory.mktemp("phoenix-state"),
        namespace="stratagem-phoenix",
        grpc_host="127.0.0.1",
        auth="none",  # the caller metadata is trusted: this module is about traces
        extensions=["tests.integration.compensation_extension"],
        extension_paths=[REPO],
        default_deadline_s=30.0,
        request_timeout_s=30.0,
    )
    ours = Deployment(settings)
    try:
        ours.deploy(detached=False)
        yield ours
    finally:
        ours.teardown()
        patch.undo()
        # Stop exporting before Phoenix stops: an exporter left behind keeps retrying in a
        # background thread (drawing on the global ``random``, which later hypothesis tests see).
        exporting.shutdown()


def _flush(dep: Deployment) -> None:
    dep.flush_telemetry()
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.force_flush()


def _settled_spans(backend: BackendState, trace_id: str, *, at_least: int) -> list[SpanRecord]:
    """The trace's spans once Phoenix has ingested them (its count stops growing)."""
    traces = PhoenixTraces(backend.url, project=backend.project)
    deadline = time.monotonic() + 60
    last: list[SpanRecord] = []
    while time.monotonic() < deadline:
        spans = traces.spans(trace_id)
        if len(spans) >= at_least and len(spans) == len(last):
            return spans
        last = spans
        time.sleep(1.0)
    return last


def _attrs(span: SpanRecord) -> dict[str, Any]:
    return span.attributes


async def test_a_goal_is_one_whole_trace_in_phoenix(
    exported: Deployment, phoenix: BackendState
) -> None:
    endpoints = {info.role: info.endpoint for info in exported.status()}
    request = SubmitGoalRequest(
        goal=DEMO_GOAL.goal,
        passage=DEMO_GOAL.passage,
        beats=DEMO_GOAL.beats,
        plan_id=f"phoenix-{uuid.uuid4().hex[:8]}",
    )
    outcome = await run_goal(endpoints, request, timeout_s=60)
    assert outcome.response.status == "succeeded"
    _flush(exported)

    spans = _settled_spans(phoenix, outcome.trace_id, at_least=20)
    assert spans, "Phoenix has no span of the goal's trace"
    assert {s.trace_id for s in spans} == {outcome.trace_id}

    # Spans from the driver and the four agents, each its own process.
    services = {s.service for s in spans}
    assert {"stratagem-tests", *(f"stratagem-{role}" for role in ROLES)} <= services, services
    instances = {_attrs(s)["stratagem.service.instance.id"] for s in spans}
    assert len(instances) >= 5, instances

    # Every cross-agent client span is the parent of exactly one server span.
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans)
    clients = [s for s in spans if s.kind == "CLIENT"]
    servers = [s for s in spans if s.kind == "SERVER"]
    assert len(clients) >= 4
    children = Counter(s.parent_id for s in servers)
    for client in clients:
        assert children[client.span_id] == 1, client.name
    for server in servers:
        assert by_id[server.parent_id].kind == "CLIENT"
        assert by_id[server.parent_id].service != server.service
    cross_agent = [c for c in clients if c.service == "stratagem-orchestrator"]
    assert cross_agent, "no cross-agent client span"
    for client in cross_agent:
        assert by_id[client.parent_id].name.startswith("step ")

    # The GenAI and RPC conventions.
    for span in clients + servers:
        attrs = _attrs(span)
        assert span.name == f"stratagem.v1.AgentService/{attrs['rpc.method']}"
        assert attrs["rpc.system"] == "grpc"
        assert attrs["rpc.service"] == "stratagem.v1.AgentService"
        assert attrs["rpc.grpc.status_code"] == 0
    plans = [s for s in spans if s.name.startswith("invoke_agent ")]
    assert {_attrs(s)["gen_ai.agent.name"] for s in plans} == set(ROLES)
    for plan in plans:
        attrs = _attrs(plan)
        assert attrs["gen_ai.operation.name"] == "invoke_agent"
        assert attrs["stratagem.plan.id"].startswith(request.plan_id or "")
        assert attrs["stratagem.plan.status"] == "succeeded"
    # A tool step's attempt is its tool call: the step span carries GenAI's execute_tool.
    tools = [s for s in spans if _attrs(s).get("gen_ai.operation.name") == "execute_tool"]
    assert tools
    for tool in tools:
        attrs = _attrs(tool)
        assert tool.name == f"step {attrs['stratagem.step.id']}"
        assert attrs["stratagem.step.kind"] == "tool"
        assert attrs["gen_ai.tool.name"]
        assert attrs["gen_ai.tool.call.id"]
    assert not [s for s in spans if s.name.startswith("execute_tool ")]
    assert all(s.status != "ERROR" for s in spans)


async def test_a_failed_step_has_an_error_status_in_phoenix(
    exported: Deployment, phoenix: BackendState
) -> None:
    endpoint = exported.endpoint("tactical")
    plan_id = f"refused-{uuid.uuid4().hex[:8]}"
    plan = {
        "id": plan_id,
        "owner": "tactical",
        "goal": "fail on purpose",
        "steps": [{"kind": "tool", "id": "no", "tool": "refuse", "input": {"reason": "no"}}],
    }
    tracer = trace.get_tracer("tests.phoenix")
    with tracer.start_as_current_span("failing plan") as root:
        trace_id = f"{root.get_span_context().trace_id:032x}"
        async with AgentClient(endpoint, caller=OPERATOR) as client:
            with pytest.raises(PermissionDeniedError, match="refused"):  # a policy failure
                await client.run_plan(json.dumps(plan), timeout=30, request_id=plan_id)
    _flush(exported)

    spans = _settled_spans(phoenix, trace_id, at_least=5)
    (step,) = [s for s in spans if s.name == "step no"]
    assert step.status == "ERROR"
    assert _attrs(step)["stratagem.failure.class"] == "policy"
    assert step.service == "stratagem-tactical"
    (plan_span,) = [s for s in spans if s.name == "invoke_agent tactical"]
    assert plan_span.status == "ERROR"
    assert _attrs(plan_span)["stratagem.plan.status"] == "failed"
    # PERMISSION_DENIED is the caller's error: the client span says so, the server span does not.
    (client_span,) = [s for s in spans if s.kind == "CLIENT"]
    (server_span,) = [s for s in spans if s.kind == "SERVER"]
    assert server_span.parent_id == client_span.span_id
    codes = {_attrs(span)["rpc.grpc.status_code"] for span in (client_span, server_span)}
    assert codes == {7}
    assert (client_span.status, server_span.status) == ("ERROR", "UNSET")


async def _final_status(endpoint: str, plan_id: str) -> str:
    """Poll the (restarted) agent until the resumed plan has a final status."""
    deadline = time.monotonic() + 120
    async with AgentClient(endpoint, caller=OPERATOR) as client:
        while time.monotonic() < deadline:
            found = [s for s in await client.plans(plan_id) if s.plan_id == plan_id]
            if found and found[0].status in FINAL:
                return found[0].status
            await asyncio.sleep(0.2)
    raise AssertionError(f"plan {plan_id} did not finish after the restart")


async def _trace_contexts(dep: Deployment, plan_id: str) -> list[str]:
    async with SqliteStateStore(dep.settings.plans_path("tactical")) as store:
        state = await store.load(plan_id)
    assert state is not None, plan_id
    return state.trace_contexts


def _ids(traceparent: str) -> tuple[str, str]:
    """(trace id, span id) of a W3C ``traceparent``."""
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


async def test_a_killed_agent_keeps_its_exported_spans_and_the_resumed_plan_links_back(
    exported: Deployment, phoenix: BackendState
) -> None:
    """SIGKILL the tactical agent mid-plan; Ray restarts it and it resumes the plan from its store.

    The agents export every ``OTEL_BSP_SCHEDULE_DELAY`` = 200 ms (set by ``exported``). The steps
    that had ended three seconds (fifteen export intervals: a loaded machine's exporter thread
    lagged past one second) before the kill are in Phoenix; the resumed
    run's plan span, in a new trace and a new process, links to the original run's plan span.
    """
    state_dir = exported.settings.state_dir
    plan_id = f"killed-{uuid.uuid4().hex[:8]}"
    ledger, calls = state_dir / f"{plan_id}.ledger", state_dir / f"{plan_id}.calls"
    steps = 100
    plan = {
        "id": plan_id,
        "owner": "tactical",
        "goal": "a chain of slow idempotent steps, killed half-way",
        "steps": [
            {
                "kind": "tool",
                "id": f"s{i:02d}",
                "tool": "undo_append",  # idempotent: resumed without a reconcile gate
                "input": {"ledger": str(ledger), "calls": str(calls), "pause_s": 0.1},
                "depends_on": [f"s{i - 1:02d}"] if i else [],
            }
            for i in range(steps)
        ],
    }
    pid, endpoint = pid_endpoint(exported)
    tracer = trace.get_tracer("tests.phoenix")
    with tracer.start_as_current_span("killed plan") as root:
        trace_id = f"{root.get_span_context().trace_id:032x}"
        async with AgentClient(endpoint, caller=OPERATOR) as client:
            run = asyncio.create_task(
                client.run_plan(json.dumps(plan), timeout=120, request_id=plan_id)
            )
            while len(file_lines(ledger)) < 8:  # the ledger has a line once a step's tool ended
                assert not run.done(), "the plan ended before the kill"
                await asyncio.sleep(0.02)
            ended = {line.split()[1] for line in file_lines(ledger)}  # step ids, ended by now
            await asyncio.sleep(3.0)  # fifteen export intervals
            assert not run.done(), "the plan ended before the kill"
            endpoint = await asyncio.to_thread(kill_and_wait, exported, pid)
            with pytest.raises(RemoteError):  # the agent died under the call
                await run
    assert await _final_status(endpoint, plan_id) == "succeeded"
    _flush(exported)

    # The original run: what the killed process had exported is in Phoenix, under its plan span.
    original, resumed = await _trace_contexts(exported, plan_id)
    original_trace, original_span = _ids(original)
    assert original_trace == trace_id
    spans = _settled_spans(phoenix, trace_id, at_least=2 + 2 * len(ended))
    tactical = [s for s in spans if s.service == "stratagem-tactical"]
    killed = {_attrs(s)["stratagem.service.instance.id"] for s in tactical}
    assert killed == {f"tactical-{pid}"}, killed
    step_spans = {s.name.removeprefix("step "): s for s in tactical if s.name.startswith("step ")}
    assert ended <= set(step_spans), sorted(ended - set(step_spans))
    for step_id in ended:
        assert step_spans[step_id].parent_id == original_span
        assert step_spans[step_id].status != "ERROR"
    for step_id in ended:  # each attempt's span is its tool call
        assert _attrs(step_spans[step_id])["gen_ai.tool.name"] == "undo_append"
    # The plan span and the server span were open when the process died: lost with it.
    assert not [s for s in tactical if s.name == "invoke_agent tactical"]

    # The resumed run: a new trace, from the restarted process, linked to the original run.
    resumed_trace, resumed_span = _ids(resumed)
    assert resumed_trace != trace_id
    after = _settled_spans(phoenix, resumed_trace, at_least=2)
    (plan_span,) = [s for s in after if s.span_id == resumed_span]
    assert plan_span.name == "invoke_agent tactical"
    attrs = _attrs(plan_span)
    assert attrs["stratagem.plan.id"] == plan_id
    assert attrs["stratagem.plan.status"] == "succeeded"
    assert attrs["stratagem.service.instance.id"] != f"tactical-{pid}"
    assert list(attrs["stratagem.links"]) == [f"{original_trace}-{original_span}"]
    # The steps left at the kill ran in the resumed trace (the one in flight again: idempotent),
    # under the resumed plan span; each step's effect happened once.
    rerun = [s for s in after if s.name.startswith("step ")]
    first = min(int(s.name.removeprefix("step s")) for s in rerun)
    assert {s.name for s in rerun} == {f"step s{i:02d}" for i in range(first, steps)}
    assert f"s{first:02d}" not in ended
    assert all(s.parent_id == resumed_span for s in rerun)
    assert Counter(line.split()[1] for line in file_lines(ledger)) == {
        f"s{i:02d}": 1 for i in range(steps)
    }
    print(
        f"killed tactical-{pid}: {len(step_spans)} step spans of its run in Phoenix "
        f"({len(ended)} ended a second before the kill), {len(rerun)} steps run after the restart"
    )
