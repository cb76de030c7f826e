"""The history API over the four real agents on 127.0.0.1 (real gRPC, real SQLite stores; see
``_served``): plans listed, shown, watched and replayed after the agents are re-created on the
same stores, paging and filters across agents, what ran in ``--json``, trace ids of failed goals,
a gated ``plans run``, watch following sub-plans, and bad input in one line."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from stratagem.protocol import FailedPreconditionError, InvalidArgumentError, PlansQuery
from stratagem.runtime import InputError, PlanNotFoundError, SyncOperator
from stratagem.runtime._cli import app
from stratagem.runtime.operator._history import HistoryFilter, encode_page_token
from tests.integration.runtime._served import (
    WHO_LEADS,
    Served,
    gated_plan,
    serve,
    served_in_a_thread,
)

runner = CliRunner()

GOAL = {
    "goal": "Mira reaches the tower",
    "passage": "Mira waits in the courtyard. The courtyard leads to the tower.",
    "beats": 1,
}
# Perception reads no fact in it: the goal fails in perception's plan for its 'extract' step.
NOTHING = {"goal": "Fly to the moon", "passage": "zzz qqq.", "beats": 1}


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


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with served_in_a_thread(tmp_path / "state") as running:
        yield running


def test_the_history_survives_agents_recreated_on_their_stores(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with (
        served_in_a_thread(state) as first,
        SyncOperator(settings=first.settings, directory=first.directory) as op,
    ):
        ran = op.run_plan(WHO_LEADS)
        goal = op.submit(GOAL)
        with pytest.raises(FailedPreconditionError):
            op.submit(NOTHING)
        before = op.plan(goal.plan_id)
    # A real restart: new agents, new servers and ports, nothing in memory, the same files.
    with served_in_a_thread(state) as second:
        assert second.endpoints != first.endpoints
        with SyncOperator(settings=second.settings, directory=second.directory) as op:
            listed = op.plans()
            assert {v.plan_id for v in listed} >= {"who-leads", goal.plan_id}
            assert len([v for v in listed if v.plan_id.startswith(goal.plan_id)]) == len(goal.plans)
            after = op.plan(goal.plan_id)
            assert after.status == "succeeded"
            assert after.trace_id == goal.trace_id == before.trace_id
            assert [v.plan_id for v in after.plans] == [v.plan_id for v in before.plans]
            assert after.plans[0].steps == before.plans[0].steps
            extract = next(v for v in after.plans if v.plan_id.endswith("/extract"))
            assert extract.agent == "perception"
            assert extract.steps[0].output is not None
            # Watch replays a finished plan's stored events, and ends with show's status.
            events = list(op.watch("who-leads"))
            assert events[-1].step_id == ""
            assert events[-1].status == op.plan("who-leads").status == ran.status
            # Replay and revisions read the stores too.
            assert not op.replay("who-leads").diverged
            assert [r.revision for r in op.revisions("who-leads").revisions] == [1]
            # The failed goal is there, with where it went wrong and its trace.
            failed = op.history(status="failed", agent="orchestrator").plans
            assert len(failed) == 1
            assert failed[0].trace_id
            assert failed[0].failure.startswith("step 'extract' failed (logic)")


def test_pages_and_filters_across_agents(served: Served) -> None:
    with SyncOperator(settings=served.settings, directory=served.directory) as op:
        goal = op.submit(GOAL)
        op.run_plan(WHO_LEADS)
        everything = op.plans()
        seen: list[str] = []
        token = ""
        while True:
            page = op.history(page_size=3, page_token=token)
            assert len(page.plans) <= 3
            seen.extend(f"{v.agent}:{v.plan_id}" for v in page.plans)
            token = page.next_page_token
            if not token:
                break
        assert sorted(seen) == sorted(f"{v.agent}:{v.plan_id}" for v in everything)
        assert len(seen) == len(set(seen))
        created = [v.created for v in op.history(page_size=1000).plans]
        assert created == sorted(created, reverse=True)  # newest first
        assert [v.plan_id for v in op.history(agent="strategic", goal="WHO LEADS").plans] == [
            "who-leads"
        ]
        by_trace = op.history(trace_id=goal.trace_id).plans
        assert {v.plan_id.split("/")[0] for v in by_trace} == {goal.plan_id}
        assert len(by_trace) == len(goal.plans)
        assert [v.plan_id for v in op.history(plan_id=goal.plan_id, agent="tactical").plans] == [
            f"{goal.plan_id}/beat_1"
        ]
        assert op.history(text="courtyard", agent="perception").plans
        future = op.history(since=created[0].timestamp() + 3600).plans
        assert future == []
        traces = op.traces(limit=5)
        assert [t.trace_id for t in traces][:2] == [
            op.plan("who-leads").trace_id,
            goal.trace_id,
        ]
        assert traces[1].plan_id == goal.plan_id
        assert traces[1].plans == len(goal.plans)


def test_bad_filters_tokens_and_ids_are_one_line_naming_the_valid_form(served: Served) -> None:
    with SyncOperator(settings=served.settings, directory=served.directory) as op:
        op.run_plan(WHO_LEADS)
        op.submit(GOAL)
        token = op.history(page_size=1).next_page_token
        assert token
        with pytest.raises(InputError, match="made for other filters"):
            op.history(page_size=1, page_token=token, agent="strategic")
        with pytest.raises(InputError, match="is malformed: pass the next_page_token"):
            op.history(page_token="not-a-token")
        with pytest.raises(InputError, match="32 lowercase hex"):
            op.history(trace_id="abc")
        with pytest.raises(InputError, match=r"ends .* before it starts"):
            op.history(since=2_000_000_000, until=1_000_000_000)
        with pytest.raises(InputError, match="unknown status 'done'"):
            op.history(status="done")
        with pytest.raises(InputError, match="is malformed: a plan id is"):
            op.plan("no such plan")
        with pytest.raises(PlanNotFoundError):
            op.plan("no-such-plan")

    # Over the wire, a status the agent does not know is INVALID_ARGUMENT naming the field.
    async def ask() -> None:
        async with served.operator() as op:
            client = op._link.client(served.endpoints["strategic"])
            await client.history(PlansQuery(status="done"))

    with pytest.raises(InvalidArgumentError) as info:
        asyncio.run(ask())
    assert info.value.violations[0].field == "status"

    # A page token past 2^63 - 1 (the agent's plans are numbered by a 64-bit SQL integer), sent
    # as is: INVALID_ARGUMENT naming the field (before: INTERNAL on every agent).
    async def ask_past() -> None:
        async with served.operator() as op:
            client = op._link.client(served.endpoints["strategic"])
            await client.history(PlansQuery.model_construct(page_token=str(2**63)))

    with pytest.raises(InvalidArgumentError) as info:
        asyncio.run(ask_past())
    assert info.value.violations[0].field == "page_token"
    past = encode_page_token(HistoryFilter(), {"strategic": "9" * 20})
    for args, fragment in (
        (("plans", "list", "--since", "yesterday"), "--since 'yesterday' is not a time"),
        (("plans", "list", "--page-token", "xyz"), "page token 'xyz' is malformed"),
        (("plans", "list", "--page-token", past), f"page token '{past[:40]}"),
        (("plans", "list", "--trace", "abc"), "trace id 'abc' is malformed"),
        (("plans", "show", "a b"), "plan id 'a b' is malformed"),
        (("plans", "watch", "no-such-plan"), "no plan 'no-such-plan' on any agent"),
    ):
        result = stratagem(served, *args)
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert fragment in result.stderr


def test_what_ran_is_in_the_json_of_run_show_and_list(served: Served) -> None:
    ran = stratagem(served, "plans", "run", str(WHO_LEADS), "--json")
    assert ran.exit_code == 0, ran.output
    view = json.loads(ran.stdout)
    assert view["status"] == "succeeded"
    assert len(view["trace_id"]) == 32
    protagonist = view["steps"][0]
    assert protagonist["output"] == {"protagonist": "mira"}  # structured, not a JSON string
    assert protagonist["input"]["text"].startswith("Mira waits")
    assert protagonist["attempts"] == 1
    assert protagonist["started"] <= protagonist["ended"]
    assert isinstance(view["plan"], dict)
    assert "plan_json" not in view
    shown = stratagem(served, "plans", "show", "who-leads", "--json")
    assert shown.exit_code == 0, shown.output
    history = json.loads(shown.stdout)
    assert history["status"] == "succeeded"
    assert history["trace_id"] == view["trace_id"]
    assert [p["agent"] for p in history["plans"]] == ["strategic"]
    assert history["plans"][0]["steps"] == view["steps"]
    readable = stratagem(served, "plans", "show", "who-leads")
    assert 'output {"protagonist": "mira"}' in readable.stdout
    assert f"trace {view['trace_id']}" in readable.stdout
    listed = stratagem(served, "plans", "list", "--agent", "strategic", "--json")
    page = json.loads(listed.stdout)
    assert [(p["plan_id"], p["status"]) for p in page["plans"]] == [("who-leads", "succeeded")]
    assert page["next_page_token"] == ""


def test_a_failed_goal_names_where_and_its_trace(served: Served) -> None:
    with SyncOperator(settings=served.settings, directory=served.directory) as op:
        with pytest.raises(FailedPreconditionError) as info:
            op.submit(NOTHING | {"plan_id": "goal-fails"})
        trace_id = info.value.trace_id
        assert len(trace_id) == 32
        assert trace_id != "0" * 32
        shown = op.plan("goal-fails")
        assert shown.status == "failed"
        assert shown.trace_id == trace_id
        # The deepest failed step, in the sub-plan on the perception agent.
        assert shown.failure.startswith(
            "perception plan goal-fails/extract: step 'match' failed (logic): no sentence"
        )
        assert {v.trace_id for v in shown.plans} == {trace_id}  # every agent's plan of it
    readable = stratagem(served, "plans", "show", "goal-fails")
    first = readable.stdout.splitlines()[0]
    assert first.startswith("✗ failed: perception plan goal-fails/extract: step 'match' failed")


def test_a_gated_plans_run_returns_with_the_approve_command(served: Served, tmp_path: Path) -> None:
    path = tmp_path / "gated.json"
    path.write_text(json.dumps(gated_plan("cli-gated")))
    ran = stratagem(served, "plans", "run", str(path))
    assert ran.exit_code == 3, ran.output
    assert "stratagem approve cli-gated ok --rationale" in ran.stdout
    again = tmp_path / "gated-again.json"
    again.write_text(json.dumps(gated_plan("cli-gated-json")))
    as_json = stratagem(served, "plans", "run", str(again), "--json")
    assert as_json.exit_code == 3
    blocked = json.loads(as_json.stdout)
    assert blocked["status"] == "blocked"
    assert blocked["approve"] == [
        "stratagem approve cli-gated-json ok --rationale 'why it may go on'"
    ]
    approved = stratagem(served, "approve", "cli-gated", "ok", "--rationale", "fine")
    assert approved.exit_code == 0, approved.output
    watched = stratagem(served, "plans", "watch", "cli-gated")
    assert watched.exit_code == 0, watched.output
    assert "step ok -> blocked, waiting for approval: Go on?" in watched.stdout
    assert "(: " not in watched.stdout
    shown = json.loads(stratagem(served, "plans", "show", "cli-gated", "--json").stdout)
    assert shown["status"] == "succeeded"
    assert f"the plan ended {shown['status']}" in watched.stdout


def test_watch_follows_sub_plans_and_waits_for_a_plan_about_to_exist(served: Served) -> None:
    seen: list[tuple[str, str, str]] = []
    ready = threading.Event()

    def follow() -> None:
        with SyncOperator(settings=served.settings, directory=served.directory) as op:
            ready.set()
            for event in op.watch("goal-watched", wait_s=30):
                seen.append((event.agent, event.plan_id, event.status))

    watcher = threading.Thread(target=follow)
    watcher.start()
    ready.wait(10)
    with SyncOperator(settings=served.settings, directory=served.directory) as op:
        op.submit(GOAL | {"plan_id": "goal-watched"})
    watcher.join(60)
    assert not watcher.is_alive()
    agents = {agent for agent, _, _ in seen}
    assert agents == {"orchestrator", "perception", "strategic", "tactical"}
    assert ("tactical", "goal-watched/beat_1", "succeeded") in seen
    assert seen[-1] == ("orchestrator", "goal-watched", "succeeded") or any(
        entry == ("orchestrator", "goal-watched", "succeeded") for entry in seen
    )


def test_submit_detach_answers_at_once_with_the_plan_and_trace(served: Served) -> None:
    async def start() -> Any:
        async with served.operator() as op:
            return await op.start(GOAL)

    started = asyncio.run(start())
    assert started.plan_id.startswith("goal-")
    assert len(started.trace_id) == 32
    with SyncOperator(settings=served.settings, directory=served.directory) as op:
        events = list(op.watch(started.plan_id))
        assert events[-1].status == "succeeded"
        assert op.plan(started.plan_id).trace_id == started.trace_id


def test_an_agent_that_does_not_answer_is_named_and_the_others_listed(tmp_path: Path) -> None:
    async def scenario() -> None:
        served = await serve(tmp_path / "state")
        try:
            async with served.operator() as op:
                await op.run_plan(WHO_LEADS)
            # The tactical agent goes away; its published endpoint stays.
            dead = dict(served.endpoints, tactical="127.0.0.1:1")
            async with served.operator(endpoints=dead) as op:
                page = await op.history()
                assert [v.plan_id for v in page.plans] == ["who-leads"]
                assert len(page.unreadable) == 1
                assert page.unreadable[0].startswith("tactical: UNAVAILABLE")
        finally:
            await served.stop()

    asyncio.run(scenario())
