"""One trace per goal in a real backend: Arize Phoenix, started by this module on 127.0.0.1.

``scripts/otel_backend.sh`` installs Phoenix into its own virtual environment (``.otel-venv``, once:
it takes minutes) and starts it on free loopback ports. The driver and the four agents export their
spans with the real OTLP gRPC exporter; the test reads them back through Phoenix's REST API
(``GET /v1/projects/{project}/spans?trace_id=…``) and checks the trace's shape. Where Phoenix
cannot be installed the module is skipped, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

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

from agents import DEMO_GOAL
from protocol import OPERATOR, ROLES, AgentClient, PermissionDeniedError, SubmitGoalRequest
from runtime import Deployment, Settings, load_settings, run_goal
from runtime._backend import BackendState, PhoenixTraces
from runtime._telemetry import SpanRecord, setup_telemetry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "otel_backend.sh"


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
        "OTEL_BACKEND_VENV": str(REPO / ".otel-venv"),
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
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert tools
    for tool in tools:
        attrs = _attrs(tool)
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert tool.name == f"execute_tool {attrs['gen_ai.tool.name']}"
        assert attrs["gen_ai.tool.call.id"]
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
    (client,) = [s for s in spans if s.kind == "CLIENT"]
    (server,) = [s for s in spans if s.kind == "SERVER"]
    assert server.parent_id == client.span_id
    assert _attrs(client)["rpc.grpc.status_code"] == _attrs(server)["rpc.grpc.status_code"] == 7
    assert (client.status, server.status) == ("ERROR", "UNSET")
