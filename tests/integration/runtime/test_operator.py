"""The operator API against the four real agents, served over gRPC on 127.0.0.1 without Ray
(see ``_served``)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from stratagem.protocol import (
    ROLES,
    AgentClient,
    AnalyzeNarrativeRequest,
    ClusterSecret,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    FailedPreconditionError,
    MissingSecretError,
    PermissionDeniedError,
    ProtocolUsageError,
    RemoteError,
    TokenCredentials,
    TokenSigner,
    UnavailableError,
)
from stratagem.runtime import (
    InputError,
    LaunchError,
    Operator,
    PlanNotFoundError,
    SyncOperator,
)
from stratagem.runtime.host._local import publish_endpoint
from tests.integration.runtime._served import (
    REPO,
    WHO_LEADS,
    RecordingDirectory,
    Served,
    gated_plan,
    serve,
    served_in_a_thread,
    settings_for,
)

TEXT = "Mira waits in the courtyard. The courtyard leads to the gate."


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    running = await serve(tmp_path / "state")
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def operator(served: Served) -> AsyncIterator[Operator]:
    async with served.operator() as op:
        yield op


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


async def _until_status(op: Operator, plan_id: str, status: str) -> None:
    for _ in range(400):
        with_status = [s for s in await op.plans(agent="strategic") if s.plan_id == plan_id]
        if with_status and with_status[0].status == status:
            return
        await asyncio.sleep(0.025)
    pytest.fail(f"plan {plan_id} never became {status}")


# -- finding the agents ----------------------------------------------------------------------------


async def test_a_call_goes_to_the_published_endpoint_without_asking_the_directory(
    served: Served,
) -> None:
    async with served.operator() as op:
        answer = await op.call("perception", "ExtractEntities", {"text": TEXT})
        assert await op.endpoints() == served.endpoints
    assert isinstance(answer, ExtractEntitiesResponse)
    assert {"mira", "courtyard", "gate"} <= {entity.id for entity in answer.entities}
    assert served.directory.asked == 0
    assert served.directory.closed


async def test_a_published_endpoint_that_does_not_answer_is_asked_again_through_the_directory(
    served: Served,
) -> None:
    publish_endpoint(
        served.settings.state_dir, "perception", f"127.0.0.1:{_closed_port()}", os.getpid()
    )
    async with served.operator() as op:
        answer = await op.call("perception", "ExtractEntities", ExtractEntitiesRequest(text=TEXT))
        assert "mira" in {entity.id for entity in answer.entities}  # type: ignore[attr-defined]
    assert served.directory.asked == 1


async def test_an_endpoint_published_by_a_dead_process_is_not_used(served: Served) -> None:
    publish_endpoint(served.settings.state_dir, "tactical", "127.0.0.1:9", _dead_pid())
    async with served.operator() as op:
        card = await op.describe("tactical")
    assert card.role == "tactical"
    assert served.directory.asked == 1


async def test_without_a_local_deployment_the_directory_answers(served: Served) -> None:
    served.settings.local_cluster_file.unlink()
    async with served.operator() as op:
        assert {s.agent for s in await op.plans()} <= set(ROLES)
    assert served.directory.asked == 1


async def test_an_agent_the_directory_lacks_or_finds_silent_is_a_launch_error(
    served: Served,
) -> None:
    served.settings.local_cluster_file.unlink()
    lacking = RecordingDirectory({"perception": served.endpoints["perception"], "tactical": ""})
    async with Operator(settings=served.settings, directory=lacking) as op:
        with pytest.raises(LaunchError, match="agents not deployed: strategic, orchestrator"):
            await op.plans()
        with pytest.raises(LaunchError, match="not answering: tactical"):
            await op.describe("tactical")
        assert (await op.describe("perception")).role == "perception"


async def test_given_endpoints_are_used_as_they_are(served: Served) -> None:
    dead = {role: f"127.0.0.1:{_closed_port()}" for role in ROLES}
    async with Operator(settings=served.settings, endpoints=dead, directory=served.directory) as op:
        with pytest.raises(UnavailableError):
            await op.describe("perception")
    assert served.directory.asked == 0


# -- bad input, refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "capability", "payload", "fragment"),
    [
        ("narrator", "ExtractEntities", {}, "unknown agent 'narrator'; valid: orchestrator, "),
        (
            "perception",
            "PlanNarrativeArc",
            {},
            "agent 'perception' has no capability 'PlanNarrativeArc'; valid: ExtractEntities, ",
        ),
        ("perception", "ExtractEntities", {"text": ""}, "invalid ExtractEntities request: text"),
    ],
)
async def test_bad_input_is_an_input_error_before_any_agent_is_asked(
    served: Served, agent: str, capability: str, payload: dict[str, Any], fragment: str
) -> None:
    os.remove(served.settings.secret_path)  # nothing may reach for credentials either
    async with served.operator() as op:
        with pytest.raises(InputError) as caught:
            await op.call(agent, capability, payload)
    assert fragment in str(caught.value)
    assert served.directory.asked == 0


async def test_a_request_of_another_model_is_an_input_error(operator: Operator) -> None:
    with pytest.raises(InputError, match="UpdateWorldState takes a UpdateWorldStateRequest"):
        await operator.call("perception", "UpdateWorldState", ExtractEntitiesRequest(text=TEXT))


async def test_no_cluster_secret_is_missing_secret_and_none_is_made(served: Served) -> None:
    missing = served.settings.state_dir / "elsewhere" / "cluster.secret"
    settings = served.settings.model_copy(update={"secret_file": missing})
    async with Operator(settings=settings, directory=served.directory) as op:
        with pytest.raises(MissingSecretError, match=f"nor a cluster secret at {missing}"):
            await op.call("perception", "ExtractEntities", {"text": TEXT})
    assert not missing.exists()
    assert not settings.operator_key_path.exists()


def test_the_operator_cannot_act_as_an_agent_or_a_name_that_is_no_identity(
    served: Served,
) -> None:
    for caller, refusal in (
        (
            "orchestrator",
            "the operator cannot act as 'orchestrator': it is one of the deployment's",
        ),
        ("Bad Name", "'Bad Name' is not an identity"),
        ("auditor", "the operator's key signs only as 'operator', not as 'auditor'"),
    ):
        with pytest.raises(InputError, match=refusal):
            served.operator(caller=caller)


async def test_a_caller_the_policy_denies_is_permission_denied(served: Served) -> None:
    # Speaking as an agent takes the cluster secret (the agents hold it; the operator does not).
    secret = ClusterSecret.load(served.settings.secret_path)
    perception = TokenCredentials(TokenSigner(secret), "perception")
    async with AgentClient(served.endpoints["strategic"], credentials=perception) as client:
        with pytest.raises(PermissionDeniedError):
            await client.call("strategic", "AnalyzeNarrative", AnalyzeNarrativeRequest(text=TEXT))


# -- an endpoint read from a file proves itself before any credentials go there -----------------


class _Recorder:
    """A gRPC server at a planted endpoint: it records every call it gets (method, metadata,
    request bytes) and answers each with ``answer`` (``None``: UNIMPLEMENTED)."""

    def __init__(self, answer: Callable[[str, bytes], Awaitable[bytes]] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, str], bytes]] = []
        self._answer = answer
        self.endpoint = ""
        self._server: Any = None

    async def __aenter__(self) -> _Recorder:
        recorder = self

        class Everything(grpc.GenericRpcHandler):
            def service(self, details: Any) -> Any:
                method = details.method

                async def handle(request: bytes, context: Any) -> bytes:
                    metadata = {k: str(v) for k, v in context.invocation_metadata() or ()}
                    recorder.calls.append((method, metadata, request))
                    if recorder._answer is None:
                        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no such method")
                    return await recorder._answer(method, request)

                return grpc.unary_unary_rpc_method_handler(handle)

        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((Everything(),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.endpoint = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._server.stop(0)


def _nothing_but_a_nonce(recorder: _Recorder) -> None:
    assert recorder.calls, "the planted endpoint was never asked"
    for method, metadata, request in recorder.calls:
        assert method == "/stratagem.v1.EndpointService/Prove", method
        assert "authorization" not in metadata, "a token reached the planted endpoint"
        assert TEXT.encode() not in request


async def test_a_planted_endpoint_receives_no_token_and_no_payload(served: Served) -> None:
    async with _Recorder() as planted:
        publish_endpoint(served.settings.state_dir, "perception", planted.endpoint, os.getpid())
        async with served.operator() as op:
            answer = await op.call("perception", "ExtractEntities", {"text": TEXT})
    assert "mira" in {entity.id for entity in answer.entities}  # type: ignore[attr-defined]
    _nothing_but_a_nonce(planted)
    assert served.directory.asked == 1  # the real endpoint came from the directory


async def test_a_relay_to_the_real_agent_cannot_pass_its_proof_on(served: Served) -> None:
    real = served.endpoints["perception"]

    async def relay(method: str, request: bytes) -> bytes:
        async with grpc.aio.insecure_channel(real) as channel:
            return bytes(await channel.unary_unary(method)(request, timeout=5))

    async with _Recorder(relay) as relaying:
        publish_endpoint(served.settings.state_dir, "perception", relaying.endpoint, os.getpid())
        async with served.operator() as op:
            await op.call("perception", "ExtractEntities", {"text": TEXT})
    _nothing_but_a_nonce(relaying)
    assert served.directory.asked == 1


async def test_a_published_agent_that_never_answers_is_unavailable_naming_it(
    served: Served,
) -> None:
    # A port that accepts connections and never answers: what a SIGSTOPped agent looks like.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        publish_endpoint(served.settings.state_dir, "tactical", endpoint, os.getpid())
        async with served.operator(timeout_s=2.0) as op:
            with pytest.raises(UnavailableError) as refused:
                await op.describe("tactical")
    assert str(refused.value).startswith(
        f"UNAVAILABLE: agent tactical at {endpoint} does not answer: no answer within 1 s"
    )
    assert served.directory.asked == 0


def test_bad_settings_and_timeouts_are_input_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError, match="timeout"):
        Operator(settings=settings_for(tmp_path), timeout_s=0)
    with pytest.raises(TypeError):
        Operator(tmp_path, settings=settings_for(tmp_path))
    monkeypatch.setenv("STRATAGEM_MAX_RESTARTS", "often")
    with pytest.raises(InputError, match="invalid settings: max_restarts"):
        Operator(tmp_path)


# -- plans -----------------------------------------------------------------------------------------


async def test_a_written_plan_runs_on_its_owner_and_is_found_there(operator: Operator) -> None:
    snapshot = await operator.run_plan(WHO_LEADS)
    assert (snapshot.plan_id, snapshot.agent, snapshot.status) == (
        "who-leads",
        "strategic",
        "succeeded",
    )
    assert await operator.owner("who-leads") == "strategic"
    assert [s.agent for s in await operator.show("who-leads")] == ["strategic"]
    listed = await operator.plans(agent="strategic", status="succeeded")
    assert [s.plan_id for s in listed] == ["who-leads"]
    assert await operator.plans(agent="strategic", status="failed") == []
    events = [event async for event in operator.watch("who-leads")]
    assert events[-1].plan_id == "who-leads"
    assert events[-1].status == "succeeded"


async def test_a_plan_no_agent_holds_is_plan_not_found(operator: Operator) -> None:
    for attempt in (operator.show, operator.owner, operator.pause, operator.replay):
        with pytest.raises(PlanNotFoundError, match="no plan 'no-such-plan' on any agent") as e:
            await attempt("no-such-plan")
        assert e.value.plan_id == "no-such-plan"


async def test_plan_listing_refuses_unknown_agents_and_statuses(operator: Operator) -> None:
    with pytest.raises(InputError, match="unknown status 'done'; valid: "):
        await operator.plans(status="done")
    with pytest.raises(InputError, match="unknown agent 'narrator'"):
        await operator.plans(agent="narrator")


@pytest.mark.parametrize(
    ("steps", "fragment"),
    [
        (
            [{"kind": "tool", "id": "apply", "tool": "apply_actions", "input": {}}],
            "step 'apply' uses tool 'apply_actions', which is not in the strategic agent's "
            "registry",
        ),
        (
            [
                {"kind": "tool", "id": a, "tool": "score_themes", "input": {}, "depends_on": [b]}
                for a, b in (("a", "b"), ("b", "a"))
            ],
            "cycle: ",
        ),
    ],
    ids=["another-agents-tool", "cycle"],
)
async def test_a_bad_plan_is_refused_before_it_is_sent(
    served: Served, steps: list[dict[str, Any]], fragment: str
) -> None:
    async with served.operator() as op:
        with pytest.raises(InputError, match="refused") as caught:
            await op.run_plan({"id": "mine", "owner": "strategic", "goal": "g", "steps": steps})
    assert fragment in str(caught.value)
    assert served.directory.asked == 0


async def test_a_gate_is_rejected_by_name_and_approved(operator: Operator) -> None:
    running = asyncio.create_task(operator.run_plan(gated_plan("gated")))
    await _until_status(operator, "gated", "blocked")
    with pytest.raises(FailedPreconditionError):
        await operator.reject("gated", "nope", "not this one")
    approved = await operator.approve("gated", "ok", "looks right")
    assert approved.agent == "strategic"
    finished = await asyncio.wait_for(running, 30)
    assert finished.status == "succeeded"


async def test_pause_resume_and_cancel_reach_the_owner(operator: Operator) -> None:
    running = asyncio.create_task(operator.run_plan(gated_plan("held")))
    await _until_status(operator, "held", "blocked")
    paused = await operator.pause("held")
    assert (paused.plan_id, paused.agent) == ("held", "strategic")
    # The caller of the paused run is told it stopped.
    with pytest.raises(RemoteError):
        await asyncio.wait_for(running, 30)
    resumed = await operator.resume("held")
    assert (resumed.plan_id, resumed.agent) == ("held", "strategic")
    await _until_status(operator, "held", "blocked")
    cancelled = await operator.cancel("held")
    assert (cancelled.plan_id, cancelled.agent) == ("held", "strategic")
    await _until_status(operator, "held", "cancelled")
    with pytest.raises(InputError, match="invalid approve of plan 'held'"):
        await operator.approve("held", "", "")


async def test_a_finished_plan_replays_and_a_replan_makes_a_revision(
    operator: Operator, tmp_path: Path
) -> None:
    await operator.run_plan(WHO_LEADS)
    replayed = await operator.replay("who-leads")
    assert (replayed.agent, replayed.diverged, replayed.decisions) == ("strategic", False, 9)
    changed = yaml.safe_load(WHO_LEADS.read_text(encoding="utf-8"))
    changed["steps"][-1]["input"]["text"] = "Oren wakes in the tower. Oren leads."
    revised = await operator.replan("who-leads", changed, "new passage")
    assert revised.revision == 2
    history = await operator.revisions("who-leads")
    assert [(r.revision, r.parent) for r in history.revisions] == [(1, 0), (2, 1)]
    assert (history.revisions[1].author, history.revisions[1].rationale) == (
        "operator",
        "new passage",
    )
    assert [c.step_id for c in history.revisions[1].changed] == ["themes"]


async def test_describe_names_an_agents_capabilities(operator: Operator) -> None:
    card = await operator.describe("perception")
    assert card.role == "perception"
    assert {"ExtractEntities", "FindSpatialContext", "UpdateWorldState"} <= {
        c.name for c in card.capabilities
    }


async def test_a_goal_is_pursued_across_the_agents(operator: Operator) -> None:
    goal = yaml.safe_load((REPO / "examples" / "crown.yaml").read_text(encoding="utf-8"))
    seen: list[str] = []
    outcome = await operator.submit(goal, on_event=lambda event: seen.append(event.agent))
    assert outcome.response.status == "succeeded"
    assert outcome.response.actions
    assert {p.agent for p in outcome.plans} == set(ROLES)
    assert len(outcome.trace_id) == 32
    assert seen
    with pytest.raises(InputError, match="invalid goal: passage"):
        await operator.submit({"goal": "g"})


# -- the blocking wrapper --------------------------------------------------------------------------


def test_the_sync_operator_calls_runs_watches_and_controls(tmp_path: Path) -> None:
    with (
        served_in_a_thread(tmp_path / "state") as served,
        SyncOperator(settings=served.settings, directory=served.directory) as op,
    ):
        answer = op.call("perception", "ExtractEntities", {"text": TEXT})
        assert "mira" in {entity.id for entity in answer.entities}  # type: ignore[attr-defined]
        assert op.run_plan(WHO_LEADS).status == "succeeded"
        assert op.owner("who-leads") == "strategic"
        events = list(op.watch("who-leads"))
        assert events[-1].status == "succeeded"
        first = next(iter(op.watch("who-leads")))  # left early: the stream is closed
        assert first.plan_id == "who-leads"
        with pytest.raises(PlanNotFoundError):
            op.cancel("no-such-plan")
        with pytest.raises(InputError, match="unknown agent"):
            op.describe("narrator")
    assert served.directory.asked == 0
    assert served.directory.closed


def test_the_operator_api_loads_neither_ray_nor_the_agents() -> None:
    code = (
        "import sys\nfrom stratagem.runtime import Operator, SyncOperator\n"
        "print('ray' in sys.modules, 'stratagem.agents' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["False", "False"]


def test_an_operator_used_from_a_second_event_loop_says_so(tmp_path: Path) -> None:
    with served_in_a_thread(tmp_path / "state") as served:
        op = served.operator()
        assert asyncio.run(op.describe("perception")).role == "perception"
        with pytest.raises(ProtocolUsageError, match="make one per loop"):
            asyncio.run(op.describe("perception"))


def test_a_stream_outliving_its_sync_operator_closes_quietly(tmp_path: Path) -> None:
    with served_in_a_thread(tmp_path / "state") as served:
        op = SyncOperator(settings=served.settings, directory=served.directory)
        op.run_plan(WHO_LEADS)
        stream = op.watch("who-leads")
        assert next(stream).plan_id == "who-leads"
        op.close()
        op.close()  # twice is fine
        stream.close()


async def test_a_control_value_that_is_not_json_is_one_input_line_naming_it(
    served: Served,
) -> None:
    # The operator and the client encode a control verb's arguments in one place
    # (ControlRequest.build): refused before any agent is asked, naming the argument.
    async with served.operator() as op:
        with pytest.raises(InputError, match=r"approve of plan 'p1': value: not JSON"):
            await op.control("p1", "approve", gate_id="g", rationale="ok", value={1, 2})
        with pytest.raises(InputError, match=r"fork of plan 'p1': outputs: not JSON"):
            await op.fork("p1", outputs={"s": {"n": object()}})
