"""The web console without a browser or agents: Starlette's TestClient in process (no socket),
an operator API that knows no endpoint (every agent read fails, as when the agents are down)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from stratagem.protocol import PlanEvent
from stratagem.runtime import load_settings
from stratagem.runtime._console import Console, ConsoleConfig, check_host, console_app
from stratagem.runtime._console._app import dom_id
from stratagem.runtime._console._assets import Assets, vendor_files
from stratagem.runtime._console._auth import Sessions
from stratagem.runtime._console._data import PlanDetail, PlansPage
from stratagem.runtime.operator._history import PlanHistory, PlanView, StepView
from stratagem.runtime.operator._input import InputError

SCRIPT = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
BASE = "http://127.0.0.1:8765"


@pytest.fixture
def console(tmp_path: Path) -> Console:
    settings = load_settings(state_dir=tmp_path, auth="none", address=None)
    return Console(ConsoleConfig(settings, endpoints={}))


@pytest.fixture
def client(console: Console) -> Iterator[TestClient]:
    with TestClient(console_app(console.config, console), base_url=BASE) as test_client:
        yield test_client


def _signed_in(client: TestClient, console: Console) -> str:
    answer = client.get(f"/login?token={console.sessions.login_token()}")
    assert answer.status_code == 200
    token = re.search(r'name="csrf-token" content="([^"]+)"', answer.text)
    assert token is not None
    return token.group(1)


# -- signing in ----------------------------------------------------------------------------------


def test_without_a_session_the_api_answers_401_and_pages_say_how_to_sign_in(
    client: TestClient,
) -> None:
    for path in ("/api/plans", "/api/plans/x", "/api/gates", "/api/agents", "/api/audit"):
        answer = client.get(path)
        assert answer.status_code == 401, path
        assert "login URL" in answer.json()["error"]
    page = client.get("/plans")
    assert page.status_code == 401
    assert "stratagem console" in page.text
    assert client.post("/api/actions/cancel", json={"plan_id": "x"}).status_code == 401
    assert client.post("/actions/cancel", data={"plan_id": "x"}).status_code == 401


def test_a_login_url_works_once_and_gives_a_strict_httponly_cookie(
    client: TestClient, console: Console
) -> None:
    token = console.sessions.login_token()
    first = client.get(f"/login?token={token}")
    assert first.status_code == 200
    cookie = first.headers["set-cookie"]
    assert cookie.startswith("stratagem_console=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Secure" not in cookie
    assert client.get("/api/plans").status_code == 502  # signed in; no agent to ask here
    client.cookies.clear()
    again = client.get(f"/login?token={token}")
    assert again.status_code == 403
    assert "set-cookie" not in again.headers
    assert client.get("/api/plans").status_code == 401
    assert client.get("/login?token=guessed").status_code == 403


def test_signing_out_ends_the_session(client: TestClient, console: Console) -> None:
    csrf = _signed_in(client, console)
    assert client.post("/logout", data={"csrf_token": "wrong"}).status_code == 403
    assert client.post("/logout", data={"csrf_token": csrf}).status_code == 200
    assert client.get("/api/plans").status_code == 401


def test_sessions_expire_when_idle() -> None:
    now = [1000.0]
    sessions = Sessions(idle_s=60, clock=lambda: now[0])
    session = sessions.sign_in(sessions.login_token())
    assert session is not None
    now[0] += 59
    assert sessions.session(session.session_id) is session
    now[0] += 61
    assert sessions.session(session.session_id) is None
    assert not session.csrf_ok("")
    assert not session.csrf_ok(None)
    assert session.csrf_ok(session.csrf_token)


def test_actions_need_the_sessions_csrf_token_and_the_consoles_origin(
    client: TestClient, console: Console
) -> None:
    csrf = _signed_in(client, console)
    form = {"plan_id": "p1", "csrf_token": csrf}
    assert client.post("/actions/pause", data={"plan_id": "p1"}).status_code == 403
    assert client.post("/actions/pause", data={**form, "csrf_token": "x"}).status_code == 403
    elsewhere = client.post("/actions/pause", data=form, headers={"Origin": "http://evil.test"})
    assert elsewhere.status_code == 403
    cross = client.post("/actions/pause", data=form, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403
    assert client.post("/api/actions/pause", json={"plan_id": "p1"}).status_code == 403
    # With the token the action reaches the operator API: no agent answers here, and the page
    # gets one line saying so (no stack trace), nothing applied.
    answer = client.post("/actions/pause", data=form, headers={"Origin": BASE})
    assert answer.status_code == 502
    assert "pause plan p1" in answer.text
    assert "Traceback" not in answer.text
    api = client.post("/api/actions/pause", json={"plan_id": "p1"}, headers={"X-CSRF-Token": csrf})
    assert api.status_code == 502
    assert api.json()["ok"] is False


def test_a_gate_decision_needs_a_gate_and_a_rationale(client: TestClient, console: Console) -> None:
    csrf = _signed_in(client, console)
    headers = {"X-CSRF-Token": csrf}
    no_gate = client.post("/api/actions/approve", json={"plan_id": "p"}, headers=headers)
    assert (no_gate.status_code, no_gate.json()["message"]) == (400, "approve needs the gate's id")
    no_why = client.post(
        "/api/actions/reject", json={"plan_id": "p", "gate_id": "g"}, headers=headers
    )
    assert no_why.status_code == 400
    assert "rationale" in no_why.json()["message"]
    unknown = client.post("/api/actions/explode", json={"plan_id": "p"}, headers=headers)
    assert unknown.status_code == 404


# -- pages with agents down, unknown names -------------------------------------------------------


def test_pages_name_what_is_down_and_unknown_names_are_404(
    client: TestClient, console: Console
) -> None:
    _signed_in(client, console)
    plans = client.get("/plans")
    assert plans.status_code == 200
    assert "no endpoint given" in plans.text
    agents = client.get("/agents")
    assert agents.status_code == 200
    for role in console.data.roles:
        assert role in agents.text
    assert agents.text.count("no endpoint given") == len(console.data.roles)
    nobody = client.get("/agents/nobody")
    assert nobody.status_code == 404
    assert "no agent &#39;nobody&#39;" in nobody.text
    page = client.get("/no/such/page")
    assert page.status_code == 404
    assert "/no/such/page" in page.text
    assert client.get("/api/no/such").json() == {"error": "no such path: /api/no/such"}
    audit = client.get("/audit")
    assert audit.status_code == 200
    assert "no audit log at" in audit.text
    assert client.get("/fragments/trace/not-a-trace").status_code == 404


def test_every_answer_carries_the_security_headers(client: TestClient) -> None:
    answer = client.get("/api/plans")
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert answer.headers["x-content-type-options"] == "nosniff"


# -- escaping ------------------------------------------------------------------------------------


def _hostile_plan() -> PlanView:
    return PlanView(
        plan_id="p1",
        agent="strategic",
        status="succeeded",
        goal=SCRIPT,
        created=datetime(2026, 1, 2, tzinfo=UTC),
        steps=[
            StepView(
                id="s1",
                kind="tool",
                does=SCRIPT,
                status="succeeded",
                input={"text": SCRIPT},
                output={"summary": SCRIPT},
                message=SCRIPT,
            )
        ],
    )


def test_goals_and_step_values_holding_markup_render_as_text(console: Console) -> None:
    view = _hostile_plan()
    listed = console.fragment(
        "plans_table.html",
        page=PlansPage([view], "", True, [SCRIPT]),
        error="",
        first_url="",
        next_url="",
    )
    detail = PlanDetail(PlanHistory(plan_id="p1", plans=[view]), [], "flowchart TD", [])
    shown = console.fragment("plan_body.html", detail=detail, csrf_token="t", plan_id="p1")
    event = PlanEvent(plan_id="p1", step_id="s1", status="failed", message=SCRIPT, timestamp=1.0)
    live = console.fragment("live_event.html", event=event, root="p1")
    for html in (listed, shown, live):
        assert "<script>" not in html
        assert "<img" not in html
        assert "&lt;script&gt;" in html


def test_element_ids_are_safe_whatever_the_plan_and_step_ids() -> None:
    for parts in (("a",), ("a/b", "c.d"), ('"><script>', "x y")):
        assert re.fullmatch(r"x[0-9a-f]{16}", dom_id(*parts))
    assert dom_id("a", "b") != dom_id("a/b")


# -- serving -------------------------------------------------------------------------------------


def test_only_loopback_is_served_without_tls_or_the_explicit_flag() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert check_host(host, tls=False, allow_remote=False) == ""
    with pytest.raises(InputError, match="--tls-cert"):
        check_host("0.0.0.0", tls=False, allow_remote=False)
    assert "in clear" in check_host("0.0.0.0", tls=False, allow_remote=True)
    assert "TLS" in check_host("192.0.2.1", tls=True, allow_remote=False)


def test_missing_scripts_are_named_with_how_to_install_them(tmp_path: Path) -> None:
    assets = Assets.find(tmp_path)
    assert not assets.complete
    assert set(assets.missing) == set(vendor_files())
    assert "make console-assets" in assets.problem()
    for name in vendor_files():
        (tmp_path / name).write_text("//")
    assert Assets.find(tmp_path).problem() == ""


def test_the_vendored_scripts_come_from_the_pinned_npm_packages() -> None:
    import json

    repo = Path(__file__).resolve().parents[3]
    pinned = json.loads((repo / "package.json").read_text())["dependencies"]
    locked = json.loads((repo / "package-lock.json").read_text())["packages"]
    for source in vendor_files().values():
        package = source.split("/dist/")[0]
        assert package in pinned, package
        assert locked[f"node_modules/{package}"]["version"] == pinned[package]


# -- what a gate's form carries ------------------------------------------------------------------


def test_a_gate_form_is_built_from_what_the_gate_asks() -> None:
    from stratagem.protocol import GateInfo
    from stratagem.runtime._console._data import Gate

    schema = {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "maximum": 500},
            "urgent": {"type": "boolean"},
            "size": {"enum": ["s", "m"]},
            "tags": {"type": "array"},
        },
        "required": ["amount"],
    }

    def gate(info: GateInfo, kind: str = "gate") -> Gate:
        step = StepView(id=info.gate_id, kind=kind, does="x", status="blocked")
        plan = PlanView(plan_id="p", agent="strategic", status="blocked", gates=[info])
        return Gate(plan, step)

    fields = gate(GateInfo(gate_id="g", input_schema_json=json.dumps(schema))).fields
    assert [(f.name, f.required) for f in fields] == [
        ("value:integer:amount", True),
        ("value:boolean:urgent", False),
        ("value:json:size", False),
        ("value:json:tags", False),
    ]
    assert fields[0].hint == "at most 500"
    assert fields[2].options == ('"s"', '"m"')
    picked = gate(GateInfo(gate_id="g", choices_json='["north", 2]')).fields
    assert [(f.name, f.options) for f in picked] == [("value:json:", ('"north"', "2"))]
    whole = gate(GateInfo(gate_id="g", input_schema_json='{"type": "integer"}')).fields
    assert [f.name for f in whole] == ["value:integer:"]
    assert gate(GateInfo(gate_id="g")).fields == []
    tool = gate(GateInfo(gate_id="s", kind="tool", tool="t", arguments_json='{"a": 1}'), "tool")
    assert [(f.name, json.loads(f.initial)) for f in tool.fields] == [("arguments", {"a": 1})]
    reconcile = gate(GateInfo(gate_id="s", kind="reconcile"), "tool")
    assert [f.name for f in reconcile.fields] == ["output"]


def test_a_gate_forms_fields_are_read_back_or_refused_naming_the_field() -> None:
    from stratagem.runtime._console._data import decision_from_form

    read = decision_from_form(
        {"value:integer:amount": "200", "value:boolean:urgent": "true", "value:string:note": ""}
    )
    assert (read.has_value, read.value) == (True, {"amount": 200, "urgent": True})
    assert decision_from_form({"value:json:": '"south"'}).value == "south"
    assert decision_from_form({"value:json:": "null"}).has_value  # a null is a value
    assert not decision_from_form({"rationale": "ok"}).has_value
    output = decision_from_form({"output": '{"done": true}', "arguments": ""})
    assert (output.output, output.arguments) == ({"done": True}, None)
    for form, field in (
        ({"value:integer:amount": "lots"}, "value.amount: 'lots' is not an integer"),
        ({"value:number:": "nan"}, "value: 'nan' is not a finite number"),
        ({"value:boolean:urgent": "yes"}, "value.urgent: 'yes' is not true or false"),
        ({"arguments": "[1]"}, "arguments must be a JSON object"),
        ({"output": "{"}, "output is not valid JSON"),
    ):
        with pytest.raises(InputError, match=re.escape(field)):
            decision_from_form(form)


class _RecordingOperator:
    """An operator API that records the control calls (and refuses as an agent would)."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.calls: list[dict[str, object]] = []
        self.refuse = refuse

    async def control(self, plan_id: str, action: str, **given: object) -> object:
        from stratagem.protocol import PlanSnapshot

        self.calls.append({"plan_id": plan_id, "action": action, **given})
        if self.refuse is not None:
            raise self.refuse
        return PlanSnapshot(plan_id=plan_id, agent="strategic", status="running")


def test_an_approval_carries_the_value_arguments_and_output_and_a_refusal_names_the_field() -> None:
    import asyncio

    from stratagem.protocol import FieldViolation, InvalidArgumentError
    from stratagem.runtime._console._data import ConsoleData, Decision, act

    operator = _RecordingOperator()
    data = ConsoleData(operator)  # type: ignore[arg-type]  # only control is used
    decided = Decision(value=None, has_value=True, arguments={"a": 1}, output={"o": 2})
    outcome = asyncio.run(act(data, "approve", "p", "g", "ok", decided))
    assert outcome.ok
    assert operator.calls[-1] == {
        "plan_id": "p",
        "action": "approve",
        "gate_id": "g",
        "rationale": "ok",
        "value": None,
        "arguments": {"a": 1},
        "output": {"o": 2},
    }
    asyncio.run(act(data, "reject", "p", "g", "no", decided))  # a rejection carries nothing
    assert operator.calls[-1] == {
        "plan_id": "p",
        "action": "reject",
        "gate_id": "g",
        "rationale": "no",
    }
    refused = InvalidArgumentError(
        "the value does not fit",
        violations=(FieldViolation("value.amount", "900 is greater than the maximum of 500"),),
    )
    data = ConsoleData(_RecordingOperator(refused))  # type: ignore[arg-type]
    outcome = asyncio.run(act(data, "approve", "p", "g", "ok", decided))
    assert (outcome.ok, outcome.status_code) == (False, 400)
    assert "value.amount: 900 is greater than the maximum of 500" in outcome.message


def test_the_json_api_decides_what_the_cli_can_and_lists_what_a_gate_asks(
    client: TestClient, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stratagem.protocol import GateInfo
    from stratagem.runtime._console._data import Gate

    headers = {"X-CSRF-Token": _signed_in(client, console)}
    operator = _RecordingOperator()
    monkeypatch.setattr(console.data, "operator", operator)
    body = {"plan_id": "p", "gate_id": "g", "rationale": "ok"}
    decided = {"value": {"amount": 200}, "arguments": {"a": 1}, "output": {"o": 2}}
    answer = client.post("/api/actions/approve", json={**body, **decided}, headers=headers)
    assert answer.status_code == 200, answer.text
    assert operator.calls[-1] == {"plan_id": "p", "action": "approve", **body, **decided}
    null = client.post("/api/actions/approve", json={**body, "value": None}, headers=headers)
    assert null.status_code == 200
    assert operator.calls[-1]["value"] is None  # null is a value
    client.post("/api/actions/approve", json=body, headers=headers)
    assert "value" not in operator.calls[-1]  # none sent: none carried
    sent = len(operator.calls)
    for extra, action, why in (
        ({"arguments": [1]}, "approve", "arguments must be a JSON object"),
        ({"output": "done"}, "approve", "output must be a JSON object"),
        ({"value": 1}, "reject", "value: only an approval carries it, not reject"),
        ({"valeu": 1}, "approve", "unknown field 'valeu'"),
        ({"gate_id": 7}, "approve", "gate_id must be a string"),
    ):
        refused = client.post(f"/api/actions/{action}", json={**body, **extra}, headers=headers)
        assert refused.status_code == 400, extra
        assert why in refused.json()["error"], refused.json()
    assert len(operator.calls) == sent  # nothing refused reached an agent

    def blocked(info: GateInfo, kind: str) -> Gate:
        step = StepView(id=info.gate_id, kind=kind, does="decide", status="blocked")
        plan = PlanView(plan_id="p", agent="strategic", status="blocked", gates=[info])
        return Gate(plan, step)

    schema = {"type": "object", "properties": {"amount": {"type": "integer"}}}
    found = [
        blocked(
            GateInfo(gate_id="g", prompt="how much?", input_schema_json=json.dumps(schema)), "gate"
        ),
        blocked(GateInfo(gate_id="c", choices_json='["north", 2]'), "gate"),
        blocked(GateInfo(gate_id="s", kind="tool", tool="t", arguments_json='{"a": 1}'), "tool"),
    ]

    async def gates() -> tuple[list[Gate], list[str]]:
        return found, []

    monkeypatch.setattr(console.data, "gates", gates)
    listed = {g["gate_id"]: g for g in client.get("/api/gates").json()["gates"]}
    assert listed["g"]["input_schema"] == schema
    assert (listed["g"]["prompt"], listed["g"]["carries"]) == ("how much?", ["value"])
    assert listed["c"]["choices"] == ["north", 2]
    assert (listed["s"]["kind"], listed["s"]["tool"]) == ("tool", "t")
    assert (listed["s"]["arguments"], listed["s"]["carries"]) == ({"a": 1}, ["arguments"])


# -- the agents' status --------------------------------------------------------------------------


def test_the_agents_status_is_asked_in_process_and_names_an_agent_that_gave_up(
    client: TestClient, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the console started a child process: {args}")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", no_child)
    settings = console.config.settings
    reason = "gave up: restarted 6 times within 60 s, more than STRATAGEM_MAX_RESTARTS=5"
    restarts = {"restarts": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "gave_up": reason}
    settings.restarts_path("tactical").write_text(json.dumps(restarts))
    _signed_in(client, console)
    page = client.get("/agents")
    assert page.status_code == 200
    assert 'hx-get="/fragments/status"' in page.text
    answer = client.get("/fragments/status")
    assert answer.status_code == 200
    rows = dict(re.findall(r'<tr data-role="(\w+)">(.*?)</tr>', answer.text, re.S))
    assert set(rows) == {"orchestrator", "perception", "strategic", "tactical"}
    assert "<td>gave up</td>" in rows["tactical"]
    assert reason in rows["tactical"]
    assert "<td>6</td>" in rows["tactical"]  # its recent restarts
    assert "<td>down</td>" in rows["strategic"]  # no endpoint known: named, not hidden


# -- bounds: action bodies, live streams ---------------------------------------------------------


def test_an_action_body_is_bounded_in_size_and_depth_without_a_traceback(
    client: TestClient, console: Console
) -> None:
    limit = 64 * 1024  # _api.MAX_ACTION_BYTES, as docs/console.md gives it
    headers = {"X-CSRF-Token": _signed_in(client, console), "Content-Type": "application/json"}
    big = b'{"plan_id": "p1", "rationale": "' + b"x" * (2 * limit) + b'"}'
    declared = client.post("/api/actions/pause", content=big, headers=headers)
    assert declared.status_code == 413
    assert declared.json() == {"error": f"the body is larger than {limit} bytes"}

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"plan_id": "p1", "rationale": "'
        for _ in range(64):
            yield b"x" * 4096
        yield b'"}'

    streamed = client.post("/api/actions/pause", content=chunks(), headers=headers)
    assert streamed.status_code == 413
    deep = b"[" * 30_000 + b"]" * 30_000  # within the size bound, far past the depth bound
    nested = client.post("/api/actions/pause", content=deep, headers=headers)
    assert nested.status_code == 400
    assert nested.json() == {"error": "the body is nested deeper than 64 levels"}
    objects = client.post(
        "/api/actions/pause", content=b'{"a":' * 100 + b"1" + b"}" * 100, headers=headers
    )
    assert (objects.status_code, "Traceback" in objects.text) == (400, False)
    for junk, why in ((b"\xff\xfe", "not UTF-8"), (b"[1]", "must be a JSON object")):
        refused = client.post("/api/actions/pause", content=junk, headers=headers)
        assert refused.status_code == 400
        assert why in refused.json()["error"]


def test_live_streams_are_capped_per_session_and_say_so(
    client: TestClient, console: Console
) -> None:
    _signed_in(client, console)
    session_id = client.cookies.get(console.config.cookie_name)
    assert session_id
    per_session = console.config.max_live_per_session
    held = [console.live.take(session_id) for _ in range(per_session)]
    assert all(callable(release) for release in held)
    refused = client.get("/live/p1")
    assert refused.status_code == 429
    assert f"this session has {per_session} live streams open" in refused.text
    # Another session still gets a stream.
    other = console.live.take("another session")
    assert callable(other)
    other()
    release = held.pop()
    assert callable(release)
    release()
    # A slot free: the stream opens (no agent answers here: it says so and ends), and its slot
    # is given back when it ends.
    answer = client.get("/live/p1")
    assert answer.status_code == 200
    assert "event: end" in answer.text
    assert len(console.live) == per_session - 1


def test_a_session_cannot_take_every_watch_slot_with_live_streams(
    client: TestClient, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    _signed_in(client, console)
    opened: list[str] = []
    ends: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def watching(plan_id: str) -> AsyncIterator[PlanEvent]:
        opened.append(plan_id)  # one Watch stream on the plan's agent, open until it ends
        ended = asyncio.Event()
        ends.append((asyncio.get_running_loop(), ended))
        await ended.wait()
        yield PlanEvent(plan_id=plan_id, status="succeeded")

    monkeypatch.setattr(console.data.operator, "watch", watching)
    answers: list[int] = []
    live = []
    with contextlib.ExitStack() as streams:
        for n in range(20):
            answer = streams.enter_context(client.stream("GET", f"/live/p{n}"))
            answers.append(answer.status_code)
            live.append(answer)
            if answer.status_code == 429:
                refusal = answer.read().decode()
                break
        # The session's 17th stream is refused before it opens a Watch, and says why.
        assert answers == [200] * 16 + [429]
        assert "this session has 16 live streams open" in refusal
        for _ in range(500):
            if len(opened) == 16:
                break
            time.sleep(0.01)
        assert len(opened) == 16
        for loop, ended in ends:  # the plans end: so do their streams
            loop.call_soon_threadsafe(ended.set)
        for answer in live[:16]:
            assert "event: end" in answer.read().decode()
    # Ended streams give their slots back.
    for _ in range(500):
        if not len(console.live):
            break
        time.sleep(0.01)
    assert len(console.live) == 0


def test_the_console_caps_its_live_streams_together() -> None:
    from stratagem.runtime._console._app import LiveStreams

    streams = LiveStreams(limit=3, per_session=2)
    taken = [streams.take("a"), streams.take("a"), streams.take("b")]
    assert all(callable(t) for t in taken)
    full = streams.take("c")
    assert isinstance(full, str)
    assert "the console has 3 live streams open" in full
    first = taken[0]
    assert callable(first)
    first()
    first()  # given back once, however often it is called
    assert len(streams) == 2
    assert callable(streams.take("c"))


def test_a_plain_words_goals_route_scores_and_revision_are_on_its_plan_page(
    console: Console,
) -> None:
    assignments = [
        {"step": "get_weather", "agent": "weather", "capability": "GetWeather",
         "purpose": "'check the weather in Atlantis' matched 'check the weather in {city}'",
         "score": 1.0, "dropped": "get_weather failed: no weather for 'Atlantis'"},
        {"step": "set_timer", "agent": "timer", "capability": "SetTimer",
         "purpose": "'set a timer for 10 minutes' matched 'set a timer for {minutes} minutes'",
         "score": 0.875, "dropped": ""},
    ]  # fmt: skip
    view = PlanView(
        plan_id="ask-1",
        agent="orchestrator",
        revision=2,
        status="succeeded",
        goal="check the weather in Atlantis and set a timer for 10 minutes",
        steps=[
            StepView(id="set_timer", kind="cross_agent", does="timer.SetTimer", status="succeeded")
        ],
        plan={"id": "ask-1", "assignments": assignments},
    )
    detail = PlanDetail(PlanHistory(plan_id="ask-1", plans=[view]), [], "flowchart TD", [])
    html = console.fragment("plan_body.html", detail=detail, csrf_token="t", plan_id="ask-1")
    route = html[html.index('id="goal-route"') :]
    assert 'id="route-kind">plan<' in route
    assert "replanned: revision 2" in route
    weather_id, timer_id = (
        f'id="route-{dom_id("get_weather")}"',
        f'id="route-{dom_id("set_timer")}"',
    )
    weather = route[route.index(weather_id) : route.index(timer_id)]
    assert "weather.GetWeather" in weather
    assert ">1.00<" in weather
    assert "dropped" in weather
    assert "no weather for &#39;Atlantis&#39;" in weather
    timer = route[route.index(timer_id) :]
    assert ">0.88<" in timer
    assert "s-succeeded" in timer
    # A plan that is no goal in plain words has no route.
    story = PlanDetail(PlanHistory(plan_id="p1", plans=[_hostile_plan()]), [], "flowchart TD", [])
    plain = console.fragment("plan_body.html", detail=story, csrf_token="t", plan_id="p1")
    assert "goal-route" not in plain
