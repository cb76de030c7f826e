"""Real MCP servers (stdio and Streamable HTTP, made with the ``mcp`` SDK) give an agent tools.

The server is ``servers.py`` beside this file, run as a subprocess; nothing of the protocol is
mocked. Each test gets a fresh server and a state folder where the server counts its calls.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from stratagem.agents import McpToolset, ToolRegistry, build_agent
from stratagem.planning import FailureClass, PlanStatus
from stratagem.protocol import InMemoryAuditLog, McpServerConfig, Policy
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.host._mcp import McpSetupError, attach_mcp_servers

SERVER = Path(__file__).with_name("servers.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        env={"MCP_TEST_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the MCP test server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def stdio_config(state: Path, **extra: Any) -> McpServerConfig:
    return McpServerConfig(
        agent="tactical",
        command=sys.executable,
        args=[str(SERVER), "stdio"],
        env={"MCP_TEST_STATE": str(state)},
        **extra,
    )


@pytest.fixture(params=["stdio", "http"])
async def toolset(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[McpToolset, ToolRegistry, InMemoryAuditLog]]:
    if request.param == "stdio":
        config = stdio_config(tmp_path, call_timeout_s=3.0)
    else:
        url = request.getfixturevalue("http_server")
        config = McpServerConfig(agent="tactical", url=url, call_timeout_s=3.0)
    audit = InMemoryAuditLog()
    registry = ToolRegistry("tactical")
    tools = McpToolset("t", config, audit=audit)
    await tools.start(registry)
    yield tools, registry, audit
    await tools.aclose()


def counted(state: Path, tool: str) -> int:
    path = state / f"{tool}.count"
    return int(path.read_text()) if path.exists() else 0


def tool_plan(*steps: dict[str, Any], plan_id: str = "mcp-plan") -> dict[str, Any]:
    return {"id": plan_id, "owner": "tactical", "goal": "use MCP tools", "steps": list(steps)}


async def test_tools_are_listed_typed_and_annotated(toolset: Any) -> None:
    _, registry, _ = toolset
    names = registry.names()
    assert {"t.add", "t.echo", "t.append_note", "t.set_flag"} <= set(names)
    add, note, flag = (
        registry.get("t.add"),
        registry.get("t.append_note"),
        registry.get("t.set_flag"),
    )
    assert (add.side_effects, add.idempotent) == (False, True)  # readOnlyHint
    assert (note.side_effects, note.idempotent) == (True, False)  # no annotations
    assert (flag.side_effects, flag.idempotent) == (True, True)  # idempotentHint
    assert add.input_model.model_json_schema()["properties"]["a"] == {"type": "integer"}
    assert add.output_model.model_json_schema()["required"] == ["sum"]


async def test_a_plan_runs_mcp_tools_end_to_end(tmp_path: Path) -> None:
    agent = build_agent("tactical", entry_points=False)
    audit = InMemoryAuditLog()
    tools = McpToolset("calc", stdio_config(tmp_path), audit=audit)
    await tools.start(agent.registry)
    try:
        assert "calc.add" in agent.card().tools
        result = await agent.submit_plan(
            tool_plan(
                {"kind": "tool", "id": "first", "tool": "calc.add", "input": {"a": 2, "b": 3}},
                {
                    "kind": "tool",
                    "id": "second",
                    "tool": "calc.add",
                    "depends_on": ["first"],
                    "input": {"a": {"$ref": "first.sum"}, "b": 10},
                },
            )
        )
    finally:
        await tools.aclose()
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["second"] == {"sum": 15}
    records = [r for r in audit.records() if r.action == "mcp.call"]
    assert [(r.actor, r.target, r.capability, r.code) for r in records] == [
        ("tactical", "mcp.calc", "add", "OK"),
        ("tactical", "mcp.calc", "add", "OK"),
    ]
    assert records[0].request_id == "mcp-plan@1:first#1"


async def test_a_plan_naming_an_mcp_tool_the_agent_lacks_is_refused(tmp_path: Path) -> None:
    agent = build_agent("tactical", entry_points=False)
    with pytest.raises(Exception, match=r"calc\.add"):
        await agent.submit_plan(
            tool_plan(
                {"kind": "tool", "id": "first", "tool": "calc.add", "input": {"a": 1, "b": 2}}
            )
        )


async def test_bad_input_and_bad_output_are_logic_failures_in_one_line(toolset: Any) -> None:
    from stratagem.planning import LogicError, ToolContext

    _, registry, _ = toolset
    ctx = ToolContext("p", "s", 1, "tactical", 1)
    with pytest.raises(LogicError) as bad_input:
        await registry.run_tool("t.add", {"a": "1", "b": 2}, ctx)
    assert str(bad_input.value) == "tool 't.add': invalid input: a: '1' is not of type 'integer'"
    with pytest.raises(LogicError) as bad_output:
        await registry.run_tool("t.bad_sum", {"a": 1, "b": 2}, ctx)
    message = str(bad_output.value)
    assert message.startswith("tool 't.bad_sum': invalid output:")
    assert "'many' is not of type 'integer'" in message
    assert "\n" not in message
    with pytest.raises(LogicError, match=r"tool 't.fail' failed: no such file: /tmp/nothing$"):
        await registry.run_tool("t.fail", {}, ctx)


async def test_a_backtracking_output_pattern_neither_holds_the_loop_nor_the_step(
    toolset: Any,
) -> None:
    # ``^(a+)+$`` against 28 a's and a '!': Python's re takes many seconds (a minute at 30),
    # holding the GIL; it ran on the event loop twice (the SDK's check and the registry's).
    from stratagem.planning import LogicError, ToolContext

    _, registry, _ = toolset
    ctx = ToolContext("p", "s", 1, "tactical", 1)
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        with pytest.raises(LogicError) as refused:
            await registry.run_tool("t.greedy", {"n": 28}, ctx)
    finally:
        ticker.cancel()
    took = time.monotonic() - started
    # Generous bounds: the loop went on answering, and the call ended well before a freeze's time.
    assert max(gaps, default=0.0) < 2.0, f"the event loop was held {max(gaps):.1f} s"
    assert took < 10.0
    assert str(refused.value).startswith("tool 't.greedy': invalid output: word: 'aaaa")
    assert "does not match '^(a+)+$'" in str(refused.value)


async def test_a_schema_violation_fails_the_step_as_logic_without_retry(tmp_path: Path) -> None:
    agent = build_agent("tactical", entry_points=False)
    tools = McpToolset("t", stdio_config(tmp_path))
    await tools.start(agent.registry)
    try:
        result = await agent.submit_plan(
            tool_plan({"kind": "tool", "id": "bad", "tool": "t.bad_sum", "input": {"a": 1, "b": 2}})
        )
    finally:
        await tools.aclose()
    assert result.status is PlanStatus.FAILED
    (failure,) = result.failures
    assert failure.failure_class is FailureClass.LOGIC
    assert failure.attempts == 1
    assert counted(tmp_path, "bad_sum") == 1


async def test_a_crash_of_an_idempotent_tool_is_transient_retried_and_restarts_the_server(
    tmp_path: Path,
) -> None:
    agent = build_agent("tactical", entry_points=False)
    tools = McpToolset("t", stdio_config(tmp_path))
    await tools.start(agent.registry)
    events: list[Any] = []
    try:
        result = await agent.submit_plan(
            tool_plan({"kind": "tool", "id": "crash", "tool": "t.crash_once", "input": {}})
        )
        events = agent.record(result.plan.id).events
    finally:
        await tools.aclose()
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert result.outputs["crash"]["text"] == "back"
    assert counted(tmp_path, "crash_once") == 2
    assert tools.restarts == 1
    started = await asyncio.to_thread(lambda: list(tmp_path.glob("started.*")))
    assert len(started) == 2  # a second server process
    retried = [e for e in events if e.status == "retrying"]
    assert retried
    assert retried[0].failure_class == "transient"
    assert "failed during 'crash_once'" in retried[0].message


async def test_a_crash_of_a_tool_that_is_not_idempotent_is_not_repeated(tmp_path: Path) -> None:
    agent = build_agent("tactical", entry_points=False)
    tools = McpToolset("t", stdio_config(tmp_path))
    await tools.start(agent.registry)
    try:
        result = await agent.submit_plan(
            tool_plan(
                {"kind": "tool", "id": "note", "tool": "t.crash_note", "input": {"text": "x"}}
            )
        )
    finally:
        await tools.aclose()
    assert result.status is PlanStatus.FAILED
    (failure,) = result.failures
    assert failure.failure_class is FailureClass.POLICY
    assert failure.attempts == 1
    assert "is not idempotent, so it is not repeated by itself" in failure.message
    assert (tmp_path / "crash_note.txt").read_text() == "x\n"  # the effect happened once


async def test_a_hung_server_is_transient_and_restarted(toolset: Any, tmp_path: Path) -> None:
    from stratagem.planning import ToolContext, TransientError

    tools, registry, _ = toolset
    ctx = ToolContext("p", "s", 1, "tactical", 1)
    with pytest.raises(TransientError, match=r"did not answer 'hang_once' within 3s \(hung\)"):
        await registry.run_tool("t.hang_once", {}, ctx)
    assert tools.restarts == 1
    assert (await registry.run_tool("t.hang_once", {}, ctx))["text"] == "awake"


async def test_a_flood_fails_the_call_as_logic_within_the_bound(tmp_path: Path) -> None:
    from stratagem.planning import LogicError, ToolContext

    registry = ToolRegistry("tactical")
    tools = McpToolset("t", stdio_config(tmp_path, max_output_bytes=64 * 1024))
    await tools.start(registry)
    ctx = ToolContext("p", "s", 1, "tactical", 1)
    try:
        with pytest.raises(LogicError, match=r"sent a message over 65536 bytes"):
            await registry.run_tool("t.flood", {"n": 50_000_000}, ctx)
        assert tools.restarts == 1
        small = await registry.run_tool("t.flood", {"n": 10}, ctx)
    finally:
        await tools.aclose()
    assert small["text"] == "x" * 10


async def test_the_policy_decides_which_mcp_tools_an_agent_gets(tmp_path: Path) -> None:
    policy = Policy.from_toml(
        '[[allow]]\ncaller = "tactical"\ntarget = "mcp.calc"\ncapabilities = ["add", "echo"]\n'
        '[[allow]]\ncaller = "tactical"\ntarget = "*"\ncapabilities = ["*"]\n'
    )
    agent = build_agent("tactical", entry_points=False)
    settings = Settings(mcp_servers={"calc": stdio_config(tmp_path)})
    started = await attach_mcp_servers(agent, settings, policy, InMemoryAuditLog())
    try:
        assert sorted(n for n in agent.registry.names() if n.startswith("calc.")) == [
            "calc.add",
            "calc.echo",
        ]
        assert "append_note" in started[0].denied
    finally:
        for toolset in started:
            await toolset.aclose()
    default = build_agent("tactical", entry_points=False)
    started = await attach_mcp_servers(default, settings, Policy.default(), None)
    for toolset in started:
        await toolset.aclose()
    assert not [n for n in default.registry.names() if n.startswith("calc.")]


async def test_a_server_whose_tools_do_not_load_is_refused_in_one_line(tmp_path: Path) -> None:
    agent = build_agent("tactical", entry_points=False)
    broken = McpServerConfig(
        agent="tactical",
        command=sys.executable,
        args=[str(SERVER), "stdio"],
        env={"MCP_TEST_STATE": str(tmp_path), "MCP_TEST_BROKEN": "schema"},
    )
    missing = McpServerConfig(agent="tactical", command=str(tmp_path / "no-such-server"))
    # A server that says why it cannot start on its standard error, and exits.
    exits = McpServerConfig(
        agent="tactical",
        command=sys.executable,
        args=["-c", "import sys; print('starting', file=sys.stderr); sys.exit('no /srv/data')"],
    )
    allow_files = Policy.from_toml(
        '[[allow]]\ncaller = "tactical"\ntarget = "mcp.files"\ncapabilities = ["*"]\n'
    )
    for config, reason in (
        (broken, "tool 'broken', inputSchema: not a valid JSON Schema: minLength: 'x' is not"),
        (missing, "did not load"),
        (
            exits,
            "did not load its tools: Connection closed (the server exited with status 1: "
            "no /srv/data)",
        ),
    ):
        settings = Settings(mcp_servers={"files": config})
        with pytest.raises(McpSetupError) as refused:
            await attach_mcp_servers(agent, settings, allow_files, None)
        message = str(refused.value)
        assert message.startswith("agent tactical: MCP server 'files'")
        assert reason in message
        assert "\n" not in message


async def test_calls_in_flight_share_one_session(toolset: Any) -> None:
    from stratagem.planning import ToolContext

    _, registry, _ = toolset
    ctx = ToolContext("p", "s", 1, "tactical", 1)
    answers = await asyncio.gather(
        *(registry.run_tool("t.add", {"a": i, "b": 1}, ctx) for i in range(8))
    )
    assert [a["sum"] for a in answers] == [i + 1 for i in range(8)]


# --- what a stdio server gets of the agent: not its secrets, not unbounded log space ----------


async def test_a_stdio_server_runs_outside_the_agents_folder_without_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent runs in its state folder, with its settings in its environment.
    state = tmp_path / "state"
    state.mkdir()
    (state / "cluster.secret").write_text("c2VjcmV0\n")
    (state / "audit.key").write_text("key\n")
    monkeypatch.chdir(state)
    monkeypatch.setenv("STRATAGEM_STATE_DIR", str(state))
    monkeypatch.setenv("STRATAGEM_SECRET_FILE", str(state / "cluster.secret"))
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ray-token")
    registry = ToolRegistry("tactical")
    tools = McpToolset("t", stdio_config(tmp_path / "traces"), audit=InMemoryAuditLog())
    (tmp_path / "traces").mkdir()
    from stratagem.planning import ToolContext

    await tools.start(registry)
    try:
        seen = await registry.run_tool("t.where", {}, ToolContext("p", "s", 1, "tactical", 1))
    finally:
        await tools.aclose()
    where, home = _resolved(seen["structured"]["cwd"]), _resolved(str(state))
    assert where != home
    assert home not in where.parents
    assert "cluster.secret" not in seen["structured"]["files"]
    assert seen["structured"]["env"] == []


def _resolved(path: str) -> Path:
    return Path(path).resolve()


def test_agent_settings_are_refused_in_a_servers_environment() -> None:
    for name in ("STRATAGEM_SECRET_FILE", "RAY_AUTH_TOKEN"):
        with pytest.raises(ValueError, match=rf"env: {name} is one of the agent's settings"):
            McpServerConfig(agent="tactical", command="server", env={name: "x"})


async def test_a_stdio_servers_standard_error_is_bounded_with_a_note(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from stratagem.planning import ToolContext

    registry = ToolRegistry("tactical")
    tools = McpToolset("t", stdio_config(tmp_path), audit=InMemoryAuditLog())
    await tools.start(registry)
    try:
        ctx = ToolContext("p", "s", 1, "tactical", 1)
        for _ in range(3):
            said = await registry.run_tool("t.shout", {"n": 1 << 20}, ctx)
            assert said["text"] == "shouted"
    finally:
        await tools.aclose()
    err = capfd.readouterr().err
    # 3 MiB written; the agent's standard error got a bounded part of it, and a note.
    assert len(err) < 128 * 1024, len(err)
    assert "standard error" in err
    assert "bytes dropped" in err
