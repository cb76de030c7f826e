"""MCP through a real deployment, as a user runs it: ``stratagem up`` with MCP servers attached in
the config file (one over stdio, one over Streamable HTTP) and allowed by a policy file, an
agent's MCP face on a port ``STRATAGEM_MCP_PORTS`` names, and ``up`` refused in one line when a
server's tools do not load.

The servers are ``tests/integration/mcp/servers.py`` (made with the ``mcp`` SDK): the stdio one is
started by the agent, the HTTP one by this module on a free loopback port. One deployment serves
every check but the refusal of a fresh ``up``; its last test redeploys it with a broken server.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STRATAGEM = str(Path(sys.executable).parent / "stratagem")
REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "integration" / "mcp" / "servers.py"
DEFAULT_POLICY = REPO / "protocol" / "default_policy.toml"
# The default policy, and which MCP tools each agent may use: the tactical agent three tools of
# its stdio server 'calc', the perception agent every tool of its HTTP server 'web'.
MCP_RULES = """
[[allow]]
caller = "tactical"
target = "mcp.calc"
capabilities = ["add", "echo", "append_note"]

[[allow]]
caller = "perception"
target = "mcp.web"
capabilities = ["*"]

[[allow]]
caller = "strategic"
target = "mcp.broken"
capabilities = ["*"]
"""


def run(
    *args: str, state_dir: Path, config: Path | None = None, timeout: float = 240, **env: str
) -> subprocess.CompletedProcess[str]:
    """``stratagem ARGS`` on the deployment of ``state_dir``, with ``config`` as its config file."""
    environ = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="200")
    environ["STRATAGEM_CONFIG"] = str(config or state_dir.parent / "config.toml")
    environ.update(env)
    environ.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
        check=False,
        cwd=REPO,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _toml_string(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def _stdio_server(name: str, agent: str, state: Path, *, broken: str = "") -> str:
    env = {"MCP_TEST_STATE": str(state), **({"MCP_TEST_BROKEN": broken} if broken else {})}
    inline = ", ".join(f"{key} = {_toml_string(value)}" for key, value in env.items())
    return (
        f"[default.mcp_servers.{name}]\n"
        f"agent = {_toml_string(agent)}\n"
        f"command = {_toml_string(sys.executable)}\n"
        f"args = [{_toml_string(SERVER)}, 'stdio']\n"
        f"env = {{ {inline} }}\n"
        "call_timeout_s = 20\n"
    )


def _write_config(folder: Path, *tables: str) -> Path:
    policy = folder / "policy.toml"
    policy.write_text(DEFAULT_POLICY.read_text(encoding="utf-8") + MCP_RULES, encoding="utf-8")
    config = folder / "config.toml"
    config.write_text(
        f"[default]\npolicy_file = {_toml_string(policy)}\n\n" + "\n".join(tables),
        encoding="utf-8",
    )
    config.chmod(0o600)
    return config


def _started_pids(state: Path) -> set[int]:
    """The processes the test server ran as (each start leaves ``started.<pid>``)."""
    return {int(path.suffix[1:]) for path in state.glob("started.*")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone but for its parent's wait.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rpartition(")")[2].split()[0] == "Z")


def _processes_of(state_dir: Path) -> list[int]:
    """Processes started for the deployment of ``state_dir`` (its agents, its Ray head): those
    whose environment names it (the CLI passes STRATAGEM_STATE_DIR on to both)."""
    marker = f"STRATAGEM_STATE_DIR={state_dir}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        if pid == os.getpid():
            continue
        try:
            if marker in environ.read_bytes().split(b"\0") and _alive(pid):
                found.append(pid)
        except OSError:
            continue
    return found


def _wait_until_gone(pids: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := [pid for pid in pids() if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"{what} still running: {left}"


@pytest.fixture(scope="module")
def http_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-http-server")


@pytest.fixture(scope="module")
def http_url(http_state: Path) -> Iterator[str]:
    """A Streamable HTTP MCP server on a free loopback port, for the deployment's lifetime."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        env={"MCP_TEST_STATE": str(http_state), "PATH": "/usr/bin:/bin"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5):
                    break
            except OSError:
                assert process.poll() is None, "the MCP test server exited"
                assert time.monotonic() < deadline, "the MCP test server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def stdio_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-stdio-server")


@pytest.fixture(scope="module")
def deployed(
    tmp_path_factory: pytest.TempPathFactory, http_url: str, stdio_state: Path
) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("mcp-deployment")
    web = f'[default.mcp_servers.web]\nagent = "perception"\nurl = {_toml_string(http_url)}\n'
    _write_config(folder, _stdio_server("calc", "tactical", stdio_state), web)
    state_dir = folder / "state"
    up = run("up", "--json", state_dir=state_dir, STRATAGEM_MCP_PORTS='{"perception": 0}')
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        yield state_dir
    finally:
        down = run("down", "--json", state_dir=state_dir)
        assert down.returncode == 0, down.stderr[-2000:]


@pytest.fixture(scope="module")
def agents(deployed: Path) -> dict[str, dict[str, Any]]:
    """``stratagem status --json`` of the deployment, by role (asked once: it takes seconds)."""
    result = run("status", "--json", state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]
    return {agent["role"]: agent for agent in json.loads(result.stdout)["agents"]}


def test_describe_lists_the_mcp_tools_the_policy_allows(deployed: Path) -> None:
    result = run("describe", "tactical", "--json", state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]
    tools = json.loads(result.stdout)["tools"]
    # Its own tools, then the stdio server's three the policy names (not set_flag, flood...).
    assert [t for t in tools if t.startswith("calc.")] == [
        "calc.add",
        "calc.echo",
        "calc.append_note",
    ]
    assert "ground_actions" in tools
    web = run("describe", "perception", state_dir=deployed)
    assert web.returncode == 0, web.stderr[-2000:]
    for tool in ("web.add", "web.echo", "web.append_note", "web.flood"):
        assert tool in web.stdout  # every tool of the HTTP server, in the human view too
    assert "calc." not in web.stdout


def _plan(folder: Path, plan: dict[str, Any]) -> Path:
    path = folder / f"{plan['id']}.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    return path


def test_a_written_plan_runs_the_stdio_servers_tools(
    deployed: Path, tmp_path: Path, stdio_state: Path
) -> None:
    plan = _plan(
        tmp_path,
        {
            "id": "mcp-calc",
            "owner": "tactical",
            "goal": "add with an MCP tool, then note the sum with another",
            "steps": [
                {"kind": "tool", "id": "sum", "tool": "calc.add", "input": {"a": 2, "b": 40}},
                {
                    "kind": "tool",
                    "id": "note",
                    "tool": "calc.append_note",
                    "depends_on": ["sum"],
                    # The first tool's output (its outputSchema's 'sum') feeds the second's input.
                    "input": {"text": {"$expr": "join('', ['the sum is ', to_string(sum.sum)])"}},
                },
            ],
        },
    )
    ran = run("plans", "run", str(plan), "--json", state_dir=deployed)
    assert ran.returncode == 0, ran.stderr[-2000:]
    snapshot = json.loads(ran.stdout)
    assert (snapshot["agent"], snapshot["status"]) == ("tactical", "succeeded"), snapshot
    steps = {step["id"]: step["status"] for step in snapshot["plan"]["steps"]}
    assert steps == {"sum": "succeeded", "note": "succeeded"}
    assert (stdio_state / "add.count").read_text() == "1"
    assert (stdio_state / "append_note.txt").read_text() == "the sum is 42\n"
    # The human view of the same run.
    shown = run("plans", "show", "mcp-calc", state_dir=deployed)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "calc.append_note" in shown.stdout
    assert "succeeded" in shown.stdout


def test_a_written_plan_runs_the_http_servers_tools(
    deployed: Path, tmp_path: Path, http_state: Path
) -> None:
    plan = _plan(
        tmp_path,
        {
            "id": "mcp-web",
            "owner": "perception",
            "goal": "note something through an MCP tool over HTTP",
            "steps": [
                {
                    "kind": "tool",
                    "id": "note",
                    "tool": "web.append_note",
                    "input": {"text": "over http"},
                }
            ],
        },
    )
    ran = run("plans", "run", str(plan), state_dir=deployed)
    assert ran.returncode == 0, ran.stderr[-2000:]
    [header] = [line for line in ran.stdout.splitlines() if "perception plan mcp-web" in line]
    assert "✓ succeeded" in header
    assert "✓ succeeded  note  tool web.append_note" in ran.stdout
    assert (http_state / "append_note.txt").read_text() == "over http\n"


def test_a_tool_the_policy_does_not_allow_is_refused_before_the_plan_runs(
    deployed: Path, tmp_path: Path, stdio_state: Path
) -> None:
    plan = _plan(
        tmp_path,
        {
            "id": "mcp-denied",
            "owner": "tactical",
            "goal": "write a note",
            "steps": [{"kind": "tool", "id": "n", "tool": "calc.set_flag", "input": {"text": "x"}}],
        },
    )
    ran = run("plans", "run", str(plan), state_dir=deployed)
    assert ran.returncode == 2, ran.stderr[-2000:]
    [line] = ran.stderr.strip().splitlines()
    assert "uses tool 'calc.set_flag', which is not in the tactical agent's registry" in line
    assert not (stdio_state / "set_flag.count").exists()


def test_status_gives_the_mcp_face_url_of_the_role_named(
    deployed: Path, agents: dict[str, dict[str, Any]]
) -> None:
    assert agents["perception"]["mcp_url"].startswith("http://127.0.0.1:")
    assert agents["perception"]["mcp_url"].endswith("/mcp")
    assert {role: a["mcp_url"] for role, a in agents.items() if role != "perception"} == {
        "orchestrator": "",
        "strategic": "",
        "tactical": "",
    }
    # Every agent is among the processes the deployment's environment marks (the check that
    # nothing is left after a refused 'up' relies on this).
    assert {int(a["pid"]) for a in agents.values()} <= set(_processes_of(deployed))


async def _face_call(url: str, token: str) -> tuple[set[str], Any]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    async with Client(streamable_http_client(url, http_client=http)) as mcp:
        listed = await mcp.list_tools()
        result = await mcp.call_tool("ExtractEntities", {"text": "Mira waits in the courtyard."})
    return {tool.name for tool in listed.tools}, result


def test_an_mcp_client_with_a_token_calls_a_capability_through_the_face(
    deployed: Path, agents: dict[str, dict[str, Any]]
) -> None:
    url = agents["perception"]["mcp_url"]
    token = run("token", "--ttl", "120", state_dir=deployed)
    assert token.returncode == 0, token.stderr[-2000:]
    tools, result = asyncio.run(_face_call(url, token.stdout.strip()))
    assert tools == {
        "ExtractEntities",
        "FindSpatialContext",
        "UpdateWorldState",
        "ListWorlds",
        "ShowWorld",
        "ResetWorld",
    }
    assert not result.is_error, result.content
    names = {entity["name"] for entity in result.structured_content["entities"]}
    assert "Mira" in names


async def _post_without_token(url: str) -> httpx2.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx2.AsyncClient() as http:
        return await http.post(
            url, json=body, headers={"Accept": "application/json, text/event-stream"}
        )


def test_the_face_without_a_token_answers_401(agents: dict[str, dict[str, Any]]) -> None:
    url = agents["perception"]["mcp_url"]
    answer = asyncio.run(_post_without_token(url))
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")


def _audit_rows(state_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(state_dir / "audit.sqlite3") as audit:
        return audit.execute(sql).fetchall()


# After the calls above: each is in the chain, which verifies.
def test_every_mcp_call_is_audited_and_the_chain_verifies(deployed: Path) -> None:
    calls = _audit_rows(
        deployed,
        "SELECT actor, target, capability, request_id, code FROM audit WHERE action = 'mcp.call'",
    )
    assert {row[:3] for row in calls} == {
        ("tactical", "mcp.calc", "add"),
        ("tactical", "mcp.calc", "append_note"),
        ("perception", "mcp.web", "append_note"),
    }
    assert all(row[4] == "OK" for row in calls)
    # The step's call id: plan, revision, step and attempt.
    assert {"mcp-calc@1:note#1", "mcp-web@1:note#1"} <= {row[3] for row in calls}
    # The face's call was served as a Call: accepted and audited with the token's identity.
    served = _audit_rows(
        deployed,
        "SELECT actor, action FROM audit WHERE target = 'perception' "
        "AND capability = 'ExtractEntities'",
    )
    assert ("operator", "call.accepted") in served
    refused = _audit_rows(
        deployed,
        "SELECT action FROM audit WHERE target = 'perception' AND code = 'UNAUTHENTICATED'",
    )
    assert ("call.refused",) in refused
    verify = run("audit", "verify", state_dir=deployed)
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert "records" in verify.stdout


# Last of the deployment's tests: it removes the deployment's agents.
def test_redeployed_with_a_server_whose_schema_is_broken_nothing_keeps_running(
    deployed: Path, agents: dict[str, dict[str, Any]], tmp_path: Path, stdio_state: Path
) -> None:
    before = _started_pids(stdio_state)
    assert any(map(_alive, before))  # the tactical agent's stdio server runs
    broken = tmp_path / "broken-state"
    broken.mkdir()
    config = _write_config(
        tmp_path,
        _stdio_server("calc", "tactical", stdio_state),
        _stdio_server("broken", "strategic", broken, broken="schema"),
    )
    up = run("up", "--replace", state_dir=deployed, config=config)
    assert up.returncode == 1, up.stderr[-3000:]
    lines = [line for line in up.stderr.splitlines() if line.strip()]
    assert lines[-1] == (
        "error: agent strategic: MCP server 'broken' (stdio) did not load its tools: tool "
        "'broken', inputSchema: not a valid JSON Schema: minLength: 'x' is not of type 'integer'"
    ), up.stderr
    assert "Traceback" not in up.stderr
    assert "(raylet)" not in up.stderr
    assert lines[:-1] == ["deploying the agents: strategic, tactical, perception, orchestrator…"]
    # No agent is left: the old ones were replaced, the new ones removed with their servers.
    _wait_until_gone(lambda: [int(a["pid"]) for a in agents.values()], "the old agents")
    _wait_until_gone(lambda: _started_pids(stdio_state) | _started_pids(broken), "MCP servers")
    status = run("status", state_dir=deployed)
    assert status.returncode == 1
    assert "agents not deployed: strategic" in status.stderr


def test_up_with_a_server_that_exits_at_once_is_refused_in_one_line(tmp_path: Path) -> None:
    dead = (
        "[default.mcp_servers.dead]\n"
        'agent = "tactical"\n'
        f"command = {_toml_string(sys.executable)}\n"
        "args = ['-c', 'raise SystemExit(\"no such folder: /srv/data\")']\n"
    )
    _write_config(tmp_path, dead)
    state_dir = tmp_path / "state"
    up = run("up", state_dir=state_dir)
    assert up.returncode == 1, up.stderr[-3000:]
    lines = [line for line in up.stderr.splitlines() if line.strip()]
    assert lines == [
        "starting a local Ray head…",
        "deploying the agents: strategic, tactical, perception, orchestrator…",
        lines[-1],
    ], up.stderr
    assert lines[-1] == (
        "error: agent tactical: MCP server 'dead' (stdio) did not load its tools: Connection "
        "closed (the server exited with status 1: no such folder: /srv/data)"
    )
    assert up.stdout == ""
    # Nothing keeps running: no agent, and not the Ray head this 'up' started either.
    assert not (state_dir / "local-ray.json").exists()
    _wait_until_gone(lambda: _processes_of(state_dir), "the deployment's processes")
    status = run("status", state_dir=state_dir)
    assert status.returncode == 1
    assert status.stderr.strip() == (
        "error: no Stratagem deployment found: run 'stratagem up' or pass --address"
    )
