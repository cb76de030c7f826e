"""An agent of one's own, as a user runs it: ``stratagem up`` with the critic extension on a local
Ray, then the commands docs/extending.md's "Write your own agent" section gives, and every bad
definition refused before anything starts."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratagem.runtime import SpanRecord, read_spans

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STRATAGEM = str(Path(sys.executable).parent / "stratagem")
REPO = Path(__file__).resolve().parents[2]
CRITIC = "examples.extensions.critic"
BUILT_IN = {"orchestrator", "perception", "strategic", "tactical"}
# A strategic plan with a step using the perception agent's tool.
BORROWING = {
    "id": "borrowing",
    "owner": "strategic",
    "goal": "g",
    "steps": [
        {"kind": "tool", "id": "a", "tool": "score_themes", "input": {"text": "Mira waits."}},
        {"kind": "tool", "id": "b", "tool": "match_patterns", "depends_on": ["a"], "input": {}},
    ],
}


def run(
    *args: str, state_dir: Path, timeout: float = 240, **env_extra: str
) -> subprocess.CompletedProcess[str]:
    """``stratagem ARGS`` with the critic extension loaded (as every command must load it)."""
    env = dict(os.environ, STRATAGEM_STATE_DIR=str(state_dir), COLUMNS="160")
    env["STRATAGEM_EXTENSIONS"] = CRITIC
    env.update(env_extra)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [STRATAGEM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        cwd=REPO,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def critic_port() -> int:
    return _free_port()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory, critic_port: int) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("own-agent")
    up = run(
        "up", "--json", state_dir=state_dir, STRATAGEM_PORTS=json.dumps({"critic": critic_port})
    )
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        assert {a["role"] for a in json.loads(up.stdout)["agents"]} == {*BUILT_IN, "critic"}
        yield state_dir
    finally:
        down = run("down", "--json", state_dir=state_dir)
        assert down.returncode == 0, down.stderr[-2000:]
        assert "critic" in json.loads(down.stdout)["removed"]


def _status(state_dir: Path) -> dict[str, dict[str, object]]:
    result = run("status", "--json", state_dir=state_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    return {agent["role"]: agent for agent in json.loads(result.stdout)["agents"]}


def test_status_lists_five_agents_the_critic_on_its_fixed_port(
    deployed: Path, critic_port: int
) -> None:
    agents = _status(deployed)
    assert set(agents) == {*BUILT_IN, "critic"}
    assert len({agent["pid"] for agent in agents.values()}) == 5
    assert agents["critic"]["health"] == "serving"
    assert agents["critic"]["endpoint"] == f"127.0.0.1:{critic_port}"
    # Its endpoint is published like the built-in agents', and its stores are its own.
    assert (deployed / "endpoints" / "critic.json").is_file()
    assert (deployed / "critic.plans.sqlite3").is_file()


def test_describe_shows_the_critics_capability_and_tools(deployed: Path) -> None:
    result = run("describe", "critic", "--json", state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]
    card = json.loads(result.stdout)
    assert card["role"] == "critic"
    assert card["tools"] == ["outline_plan", "check_rules", "assess_risks", "weigh_findings"]
    [capability] = card["capabilities"]
    assert capability["name"] == "ReviewPlan"
    assert set(capability["request_schema"]["properties"]) == {"plan", "plan_json"}


def test_request_critic_review_plan(deployed: Path) -> None:
    payload = json.dumps({"plan": BORROWING})
    result = run("request", "critic", "ReviewPlan", "--json", payload, state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert (answer["plan_id"], answer["verdict"], answer["depth"]) == ("borrowing", "unsound", 2)
    assert any("the perception agent's" in f["message"] for f in answer["findings"])


def test_a_caller_the_critic_does_not_name_is_denied(deployed: Path) -> None:
    payload = json.dumps({"plan": BORROWING})
    # The operator may not pose as an agent: refused before anything is sent.
    posing = run(
        "request",
        "critic",
        "ReviewPlan",
        "--json",
        payload,
        "--as",
        "strategic",
        state_dir=deployed,
    )
    assert posing.returncode == 2, posing.stderr[-2000:]
    assert posing.stderr.strip().splitlines() == [
        "error: the operator cannot act as 'strategic': it is one of the deployment's agents, "
        "which sign with keys the operator does not hold"
    ]
    # With the strategic agent's own credentials (made from the cluster secret, as the agents'
    # are), the critic's policy entry refuses it.
    from stratagem.protocol import (
        AgentClient,
        ClusterSecret,
        PermissionDeniedError,
        TokenCredentials,
        TokenSigner,
        capability_for,
    )
    from stratagem.runtime import deployment_roles

    deployment_roles([CRITIC])
    spec = capability_for("critic", "ReviewPlan")
    assert spec is not None
    status = json.loads(run("status", "--json", state_dir=deployed).stdout)
    [endpoint] = [a["endpoint"] for a in status["agents"] if a["role"] == "critic"]
    strategic = TokenCredentials(
        TokenSigner(ClusterSecret.load(deployed / "cluster.secret")), "strategic"
    )

    async def as_strategic() -> None:
        async with AgentClient(endpoint, credentials=strategic) as client:
            await client.call(
                "critic", "ReviewPlan", spec.request.model_validate({"plan": BORROWING})
            )

    with pytest.raises(PermissionDeniedError, match="'strategic' may not call 'ReviewPlan'"):
        asyncio.run(as_strategic())


def test_the_cli_knows_the_critic_only_with_its_extension(deployed: Path) -> None:
    unknown = run("request", "narrator", "ReviewPlan", state_dir=deployed)
    assert unknown.returncode == 2
    [line] = unknown.stderr.strip().splitlines()
    assert "unknown agent 'narrator'; valid: critic, orchestrator, perception," in line
    without = run("describe", "critic", state_dir=deployed, STRATAGEM_EXTENSIONS="")
    assert without.returncode == 2
    assert "unknown agent 'critic'" in without.stderr


def _spans_of(path: Path, plan_id: str) -> tuple[str, list[SpanRecord]]:
    """The trace of the orchestrator's run of ``plan_id`` and its spans, once the critic's
    spans reached the file (agents export every half second)."""
    for _ in range(120):
        spans = read_spans(path) if path.exists() else []
        runs = [
            s
            for s in spans
            if s.service == "stratagem-orchestrator"
            and s.attributes.get("stratagem.plan.id") == plan_id
            and s.name == "invoke_agent orchestrator"
        ]
        if runs:
            trace = [s for s in spans if s.trace_id == runs[0].trace_id]
            if any(
                s.service == "stratagem-critic"
                and s.attributes.get("gen_ai.operation.name") == "execute_tool"
                for s in trace
            ):
                return runs[0].trace_id, trace
        time.sleep(0.5)
    pytest.fail(f"no critic span reached {path} in the trace of {plan_id}")


def test_the_orchestrator_reaches_the_critic_through_a_cross_agent_step(deployed: Path) -> None:
    plan = REPO / "examples" / "plans" / "critic-review.yaml"
    ran = run("plans", "run", str(plan), "--json", state_dir=deployed)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (json.loads(ran.stdout)["agent"], json.loads(ran.stdout)["status"]) == (
        "orchestrator",
        "succeeded",
    )
    shown = run("plans", "show", "critic-review", "--json", state_dir=deployed)
    assert shown.returncode == 0, shown.stderr[-2000:]
    held = {(s["agent"], s["plan_id"], s["status"]) for s in json.loads(shown.stdout)["plans"]}
    assert ("critic", "critic-review/review", "succeeded") in held
    assert ("strategic", "critic-review/analyze", "succeeded") in held
    listed = run("plans", "list", "--agent", "critic", "--json", state_dir=deployed)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "critic-review/review" in {p["plan_id"] for p in json.loads(listed.stdout)["plans"]}

    # The critic's spans are in the trace of the orchestrator's plan, below its call.
    _, trace = _spans_of(deployed / "spans.jsonl", "critic-review")
    by_id = {s.span_id: s for s in trace}
    critic = [s for s in trace if s.service == "stratagem-critic"]
    assert "invoke_agent critic" in {s.name for s in critic}
    # The critic's tool ran in a step whose span is the tool call.
    assert "outline_plan" in {s.attributes.get("gen_ai.tool.name") for s in critic}
    [server] = [s for s in critic if s.kind == "SERVER"]
    assert by_id[server.parent_id].service == "stratagem-orchestrator"
    assert by_id[server.parent_id].kind == "CLIENT"

    # Its target audited the call, with the orchestrator as the caller.
    with sqlite3.connect(deployed / "audit.sqlite3") as audit:
        rows = audit.execute(
            "SELECT actor, target, capability FROM audit WHERE action = 'call.accepted' "
            "AND target = 'critic'"
        ).fetchall()
    assert ("orchestrator", "critic", "ReviewPlan") in rows


def test_a_goal_still_runs_with_the_critic_deployed(deployed: Path) -> None:
    result = run("submit", str(REPO / "examples" / "crown.yaml"), "--json", state_dir=deployed)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["response"]["status"] == "succeeded"
    # Every agent was watched and asked for the goal's plans; the built-in pipeline used four.
    assert {p["agent"] for p in out["plans"]} == BUILT_IN


def test_a_killed_critic_resumes_its_plan_from_its_store(deployed: Path, tmp_path: Path) -> None:
    plan = {
        "id": "critic-gated",
        "owner": "critic",
        "goal": "outline a plan once a person says so",
        "reviewed": "borrowing",
        "steps": [
            {"kind": "gate", "id": "ask", "prompt": "Outline it?"},
            {
                "kind": "tool",
                "id": "outline",
                "tool": "outline_plan",
                "depends_on": ["ask"],
                "input": {"plan_json": json.dumps(BORROWING)},
            },
        ],
    }
    path = tmp_path / "critic-gated.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    ran = run("plans", "run", str(path), state_dir=deployed)
    assert ran.returncode == 3, ran.stderr  # it waits at its gate
    assert "stratagem approve critic-gated ask" in ran.stdout
    before = _status(deployed)["critic"]
    os.kill(int(str(before["pid"])), signal.SIGKILL)
    for _ in range(120):
        after = _status(deployed).get("critic", {})
        if after.get("pid") not in (None, before["pid"]) and after.get("health") == "serving":
            break
    else:
        pytest.fail("the critic did not come back")
    assert after["endpoint"] == before["endpoint"]  # its fixed port again
    shown = run("plans", "show", "critic-gated", "--json", state_dir=deployed)
    assert shown.returncode == 0, shown.stderr[-2000:]
    [snapshot] = json.loads(shown.stdout)["plans"]
    assert (snapshot["agent"], snapshot["status"]) == ("critic", "blocked")
    approved = run("approve", "critic-gated", "ask", "--rationale", "go", state_dir=deployed)
    assert approved.returncode == 0, approved.stderr[-2000:]
    for _ in range(100):
        shown = run("plans", "show", "critic-gated", "--json", state_dir=deployed)
        if json.loads(shown.stdout)["status"] == "succeeded":
            break
    else:
        pytest.fail(f"the approved plan did not go on: {shown.stdout[-500:]}")


def _readme_commands() -> tuple[dict[str, str], list[list[str]]]:
    """The environment and the commands of the "Write your own agent" block (docs/extending.md,
    which the README links to)."""
    page = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    section = page[page.index("## Write your own agent") :]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    [block] = re.findall(r"```bash\n(.*?)```", section, re.S)
    env: dict[str, str] = {}
    commands = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value
        elif words:
            assert words[0] == "stratagem", line
            commands.append(words[1:])
    return env, commands


def test_the_readme_commands_run_against_the_deployment(deployed: Path) -> None:
    env, commands = _readme_commands()
    assert env == {}  # named once, to `up`: every later command takes it from the state dir
    assert commands[0] == ["up", "--extensions", CRITIC]
    assert [c[:2] for c in commands][:4] == [
        ["up", "--extensions"],
        ["status"],
        ["describe", "critic"],
        ["request", "critic"],
    ]
    outputs = {}
    for args in commands:
        result = run(*args, state_dir=deployed, **env)
        assert result.returncode == 0, (args, result.stderr[-2000:])
        outputs[" ".join(args[:2])] = result.stdout
    assert "critic" in outputs["status"]
    assert "ReviewPlan" in outputs["describe critic"]
    assert json.loads(outputs["request critic"])["verdict"] == "unsound"
    # The critic's sub-plan critic-review/review, named by its tail under the plan's own id.
    assert "critic plan …/review" in outputs["plans show"]


# Last of the deployment's tests: every call above is in the chain.
def test_audit_verify_passes(deployed: Path) -> None:
    verify = run("audit", "verify", state_dir=deployed)
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert "records" in verify.stdout


# --- definitions refused before anything starts ------------------------------------------------

_HEADER = (
    "from examples.extensions import critic\n"
    "from stratagem.agents import define_agent, tool\n"
    "from stratagem.protocol import CapabilitySpec\n"
    "class MinePlan(critic.CriticPlan): pass\n"
    "def spec(name='Judge', role='judge'):\n"
    "    return CapabilitySpec(name, role, 'extension', critic.ReviewPlanRequest,\n"
    "                          critic.ReviewPlanResponse)\n"
)
BAD = {
    "duplicate-role": (
        "BAD = define_agent('critic', plan_type=MinePlan, planner=critic.CriticPlanner)\n",
        "agent 'critic': the role is defined already",
    ),
    "built-in-role": (
        "BAD = define_agent('tactical', plan_type=MinePlan, planner=critic.CriticPlanner)\n",
        "agent 'tactical': the role is a built-in agent's",
    ),
    "another-agents-tool": (
        "@tool(name='ground_actions')\n"
        "async def mine(text: str) -> str:\n"
        "    return text\n"
        "BAD = define_agent('judge', plan_type=MinePlan, planner=critic.CriticPlanner,\n"
        "                   tools=[mine])\n",
        "agent 'judge': its plan type would admit tool 'ground_actions', which is the tactical "
        "agent's",
    ),
    "capability-without-policy": (
        "BAD = define_agent('judge', plan_type=MinePlan, planner=critic.CriticPlanner,\n"
        "                   capabilities=[spec()])\n",
        "agent 'judge': capability 'Judge' has no policy entry",
    ),
    "planner-not-async-capable": (
        "class Planner(critic.CriticPlanner):\n"
        "    async def respond(self, capability, request, result):\n"
        "        return super().respond(capability, request, result)\n"
        "BAD = define_agent('judge', plan_type=MinePlan, planner=Planner)\n",
        "agent 'judge': its planner Planner's respond is async",
    ),
    "role-not-an-identifier": (
        "BAD = define_agent('Judge-1', plan_type=MinePlan, planner=critic.CriticPlanner)\n",
        "agent 'Judge-1': the role is not a lowercase identifier",
    ),
    "capability-name-clash": (
        "BAD = define_agent('judge', plan_type=MinePlan, planner=critic.CriticPlanner,\n"
        "                   capabilities=[spec('ReviewPlan')], callers={'*': ['*']})\n",
        "agent 'judge': capability 'ReviewPlan' clashes with the one the critic agent serves",
    ),
}


@pytest.mark.parametrize(("body", "problem"), BAD.values(), ids=BAD.keys())
def test_a_bad_definition_is_refused_at_up_in_one_line_and_nothing_starts(
    tmp_path: Path, body: str, problem: str
) -> None:
    extension = tmp_path / "bad_agent.py"
    extension.write_text(_HEADER + body, encoding="utf-8")
    state_dir = tmp_path / "state"
    result = run(
        "up", state_dir=state_dir, timeout=120, STRATAGEM_EXTENSIONS=f"{CRITIC},{extension}"
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: extension {str(extension)!r}: {problem}"), lines[0]
    # Refused before anything started: no Ray head, no agent, nothing written.
    assert not (state_dir / "local-ray.json").exists()
    assert not (state_dir / "audit.sqlite3").exists()
