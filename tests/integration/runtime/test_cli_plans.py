"""The plan commands over the operator API, run in this process against the four real agents
served on 127.0.0.1 (see ``_served``): they reach the agents through their published endpoints
(the directory behind them would be Ray's, which this process never joins), and every verb on one
plan answers the same under ``plans`` as at the top level."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from stratagem.agents import tool
from stratagem.planning import LogicError, TransientError
from stratagem.protocol import AbortedError, ExtractEntitiesResponse, RemoteError
from stratagem.runtime import SyncOperator
from stratagem.runtime._cli import app
from tests.integration.runtime._served import WHO_LEADS, Served, gated_plan, served_in_a_thread

runner = CliRunner()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with served_in_a_thread(tmp_path / "state") as running:
        yield running


def stratagem(served: Served, *args: str) -> Result:
    env = {
        "STRATAGEM_STATE_DIR": str(served.settings.state_dir),
        "STRATAGEM_SECRET_FILE": str(served.settings.secret_path),
        "STRATAGEM_AUTH": "token",
        "STRATAGEM_ADDRESS": None,
        "RAY_ADDRESS": None,
        "COLUMNS": "160",
    }
    return runner.invoke(app, list(args), env=env)


def test_plans_run_show_list_watch_replay_and_describe(served: Served) -> None:
    ran = stratagem(served, "plans", "run", str(WHO_LEADS), "--json")
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["status"] == "succeeded"
    shown = stratagem(served, "plans", "show", "who-leads", "--json")
    assert [s["agent"] for s in json.loads(shown.stdout)["plans"]] == ["strategic"]
    listed = stratagem(served, "plans", "list", "--agent", "strategic", "--json")
    assert [
        (p["plan_id"], p["agent"], p["revision"], p["status"])
        for p in json.loads(listed.stdout)["plans"]
    ] == [("who-leads", "strategic", 1, "succeeded")]
    watched = stratagem(served, "plans", "watch", "who-leads")
    assert watched.exit_code == 0, watched.output
    assert "strategic who-leads -> succeeded" in watched.stdout
    assert "the plan ended succeeded;" in watched.stdout
    for replay in (("replay",), ("plans", "replay")):
        replayed = stratagem(served, *replay, "who-leads")
        assert replayed.exit_code == 0, replayed.output
        assert "no divergence: 9 decisions re-derived (plan who-leads revision 1 on strategic" in (
            replayed.stdout
        )
    described = stratagem(served, "describe", "perception", "ExtractEntities", "--json")
    assert described.exit_code == 0, described.output
    assert [c["name"] for c in json.loads(described.stdout)["capabilities"]] == ["ExtractEntities"]


def test_a_plan_no_agent_holds_is_one_line_and_exit_2(served: Served) -> None:
    for verb in (("cancel",), ("plans", "cancel"), ("plans", "show"), ("replay",)):
        result = stratagem(served, *verb, "no-such-plan")
        assert result.exit_code == 2, (verb, result.output)
        assert result.stderr.strip() == "error: no plan 'no-such-plan' on any agent"


def test_the_control_verbs_answer_the_same_under_plans(served: Served) -> None:
    ended: list[str] = []

    def run_gated() -> None:
        with SyncOperator(settings=served.settings, directory=served.directory) as op:
            try:
                ended.append(op.run_plan(gated_plan("held")).status)
            except RemoteError as exc:  # the paused run's caller is told it stopped
                ended.append(exc.code.name)

    running = threading.Thread(target=run_gated)
    running.start()
    try:
        with SyncOperator(settings=served.settings, directory=served.directory) as op:
            for _ in range(400):
                if any(s.plan_id == "held" and s.status == "blocked" for s in op.plans()):
                    break
                time.sleep(0.025)
            else:
                pytest.fail("the plan never blocked at its gate")
        wrong = stratagem(served, "plans", "reject", "held", "nope", "--rationale", "x")
        # A decision the agent refuses as such (no open gate of that id) is bad input: exit 2.
        assert wrong.exit_code == 2
        assert "FAILED_PRECONDITION" in wrong.stderr
        for verb in (("pause",), ("plans", "pause")):
            result = stratagem(served, *verb, "held", "--json")
            assert result.exit_code == 0, (verb, result.output)
            assert (json.loads(result.stdout)["plan_id"], json.loads(result.stdout)["agent"]) == (
                "held",
                "strategic",
            )
        said = stratagem(served, "plans", "resume", "held")
        assert said.stdout.startswith("resume: plan held revision 1 on strategic is "), said.output
        cancelled = stratagem(served, "cancel", "held")
        assert cancelled.stdout.startswith("cancel: plan held revision 1 on strategic is ")
    finally:
        running.join(30)
    assert ended
    assert served.directory.asked == 0


def test_plans_run_of_a_plan_that_fails_transiently_runs_it_once_and_exits_1(
    served: Served, tmp_path: Path
) -> None:
    # Issue 31: a tactical plan whose second step (an MCP tool slower than its call timeout)
    # fails transiently three times. Its RunPlan was answered UNAVAILABLE, the client sent it
    # again, and the agent ran revision 2 (the first step again); the command said "running"
    # and exited 0.
    ran: list[str] = []

    async def note(text: str) -> ExtractEntitiesResponse:
        ran.append(text)
        return ExtractEntitiesResponse(entities=[])

    async def fetch(text: str) -> ExtractEntitiesResponse:
        ran.append("fetch")
        raise TransientError("slow.fetch: no answer within its 5 s call timeout")

    assert served.agents is not None
    registry = served.agents["tactical"].registry
    registry.register(tool(note, name="slow.note"))
    registry.register(tool(fetch, name="slow.fetch"))
    registry.register(tool(fetch, name="late.fetch"))  # its own circuit breaker
    retry = {"max_attempts": 3, "initial_backoff_s": 0.0, "max_backoff_s": 0.0}
    plan = {
        "id": "twice",
        "owner": "tactical",
        "goal": "note, then fetch",
        "steps": [
            {"kind": "tool", "id": "first", "tool": "slow.note", "input": {"text": "once"}},
            {
                "kind": "tool",
                "id": "second",
                "tool": "slow.fetch",
                "depends_on": ["first"],
                "input": {"text": "x"},
                "retry": retry,
            },
        ],
    }
    # Through the operator API, whose client asks the directory again and resends the same
    # request when the published endpoint answers UNAVAILABLE (the directory here answers as
    # Ray's would: the same endpoint).
    with SyncOperator(settings=served.settings, directory=served.directory) as op:
        try:
            view = op.run_plan(plan, until_blocked=True)
            # Before: the resent request ran revision 2 and answered 'running'.
            outcome = f"answered {view.status!r} for revision {view.revision}"
        except AbortedError as exc:
            outcome = exc.message
    assert "step 'second' failed (transient)" in outcome, (outcome, ran)
    assert ran == ["once", "fetch", "fetch", "fetch"]  # the first step ran once
    assert served.directory.asked == 0  # the plan's failure is not the transport's: no resend
    # The command: exit 1 and the plan's real status.
    path = tmp_path / "twice.json"
    again = json.loads(json.dumps(plan).replace("slow.fetch", "late.fetch"))
    path.write_text(json.dumps(again | {"id": "twice-again"}), encoding="utf-8")
    result = stratagem(served, "plans", "run", str(path), "--json")
    assert result.exit_code == 1, result.output
    said = json.loads(result.stdout)
    assert (said["plan_id"], said["status"]) == ("twice-again", "failed")
    assert said["error"].startswith("ABORTED: plan 'twice-again' step 'second' failed (transient)")
    for plan_id in ("twice", "twice-again"):
        shown = stratagem(served, "plans", "show", plan_id, "--json")
        (one,) = json.loads(shown.stdout)["plans"]
        assert (one["revision"], one["status"]) == (1, "failed")


def test_a_failed_plans_run_says_its_failure_once_then_where_the_trace_and_the_show_command(
    served: Served, tmp_path: Path
) -> None:
    # Issue 32 point 7 for `plans run`: it printed the error's own text (the agent's status, the
    # plan's and the step's copies of one reason) and no "where:".
    async def refuse(text: str) -> ExtractEntitiesResponse:
        raise LogicError("the ledger is closed for the day")

    assert served.agents is not None
    served.agents["tactical"].registry.register(tool(refuse, name="ledger.post"))
    plan = {
        "id": "closed-ledger",
        "owner": "tactical",
        "goal": "post to the ledger",
        "steps": [{"kind": "tool", "id": "post", "tool": "ledger.post", "input": {"text": "x"}}],
    }
    path = tmp_path / "closed-ledger.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    result = stratagem(served, "plans", "run", str(path))
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0] == ("error: step 'post' failed (logic): the ledger is closed for the day"), (
        result.stderr
    )
    assert lines[1] == "  where: tactical plan closed-ledger", result.stderr
    assert lines[2].startswith("  trace "), result.stderr
    assert lines[3] == "  stratagem plans show closed-ledger", result.stderr
    assert result.stderr.count("the ledger is closed for the day") == 1, result.stderr


def test_plans_run_past_its_deadline_prints_the_plans_real_status(
    served: Served, tmp_path: Path
) -> None:
    # The call ends at its deadline, the plan runs on at its owner: it is "running", not
    # "failed" (what the command printed for any error before).
    async def linger(text: str) -> ExtractEntitiesResponse:
        await asyncio.sleep(3)
        return ExtractEntitiesResponse(entities=[])

    assert served.agents is not None
    served.agents["tactical"].registry.register(tool(linger, name="slow.linger"))
    plan = {
        "id": "lingering",
        "owner": "tactical",
        "goal": "take a while",
        "steps": [{"kind": "tool", "id": "only", "tool": "slow.linger", "input": {"text": "x"}}],
    }
    path = tmp_path / "lingering.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    result = stratagem(served, "plans", "run", str(path), "--json", "--timeout", "1")
    assert result.exit_code == 1, result.output
    said = json.loads(result.stdout)
    assert (said["plan_id"], said["status"]) == ("lingering", "running"), said
    assert said["error"].startswith("DEADLINE_EXCEEDED"), said
