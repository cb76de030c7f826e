"""Gates that ask, time out, escalate and say who decides; tool approvals; forks.

Deadlines here are short real times (tens of milliseconds): nothing asserts how long anything
took, only what happened and how often. A restart is simulated as in ``test_durable.py``: the
task running the plan is cancelled (an interruption: nothing more is recorded) and a fresh
engine resumes it from the same SQLite file.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from stratagem.planning import (
    TIMEOUT_APPROVER,
    Engine,
    ForkError,
    GateDeciderError,
    GateDecision,
    GateDecisionError,
    GateKind,
    GateNotice,
    GateRecord,
    GateStep,
    GateValueError,
    InMemoryStateStore,
    Plan,
    PlanState,
    PlanStatus,
    PlanValidationError,
    Record,
    SqliteStateStore,
    StateStore,
    StepEvent,
    StepStatus,
    ToolApproval,
    ToolContext,
    ToolStep,
    expr,
    ref,
    replay,
    validate_plan,
)

from ._support import DictToolRunner


class Effects(DictToolRunner):
    """A runner whose one tool, ``effect``, counts its calls by idempotency key and echoes its
    input; ``input_problems`` checks that ``n`` is an integer, as a tool's model would."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.inputs: list[tuple[str, dict[str, Any]]] = []
        super().__init__({"effect": self._effect})

    async def _effect(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.effects[ctx.call_id] += 1
        self.inputs.append((ctx.step_id, dict(input)))
        return {"step": ctx.step_id, **input}

    def input_problems(self, name: str, input: dict[str, Any]) -> list[str]:
        n = input.get("n")
        if not isinstance(n, int) or isinstance(n, bool):
            return ["n: Input should be a valid integer"]
        return []


class Notices:
    """A ``GateNotifier`` that keeps what it is told, by key (as a durable outbox would)."""

    def __init__(self) -> None:
        self.kept: dict[str, GateNotice] = {}
        self.told: list[GateNotice] = []

    async def notify(self, notice: GateNotice) -> None:
        self.told.append(notice)
        self.kept.setdefault(notice.key, notice)

    def events(self) -> list[str]:
        return [notice.event for notice in self.kept.values()]


def engine(
    runner: Effects,
    store: StateStore | None = None,
    notices: Notices | None = None,
    approvals: Sequence[ToolApproval] = (),
) -> Engine:
    return Engine(
        tools=runner, agent="perception", store=store, notifier=notices, approvals=approvals
    )


def plan(*steps: ToolStep | GateStep, plan_id: str = "g") -> Plan:
    return Plan(id=plan_id, owner="perception", goal="gates", steps=list(steps))


async def until(events: list[StepEvent], status: PlanStatus | StepStatus, count: int = 1) -> None:
    for _ in range(20_000):
        if sum(1 for e in events if e.status is status) >= count:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"no {status} event")


async def committed(store: StateStore, holds: Any) -> PlanState:
    """Plan ``g``'s stored state once ``holds(state)`` (its journal commits after the events)."""
    for _ in range(20_000):
        state = await store.load("g")
        if state is not None and holds(state):
            return state
        await asyncio.sleep(0.001)
    raise AssertionError("never committed")


def only(name: str) -> Any:
    """A ``may_decide`` that lets ``name`` decide when the gate names it (or names no one)."""
    return lambda deciders: not deciders or name in deciders


ASK = GateStep(
    id="ask",
    prompt="How many?",
    input_schema={
        "type": "object",
        "properties": {"count": {"type": "integer", "minimum": 1}},
        "required": ["count"],
    },
)


# --- gates that ask ---------------------------------------------------------------------------


async def test_a_typed_value_reaches_a_later_step() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    eng = engine(runner, store)
    events: list[StepEvent] = []
    steps: list[ToolStep | GateStep] = [
        ASK,
        ToolStep(id="use", tool="effect", input={"n": ref("ask.value.count")}, depends_on=["ask"]),
    ]
    task = asyncio.create_task(eng.run(plan(*steps), on_event=events.append))
    await until(events, PlanStatus.BLOCKED)
    blocked = next(e for e in events if e.step_id == "ask")
    assert blocked.gate is not None
    assert blocked.gate.input_schema == ASK.input_schema
    with pytest.raises(GateValueError) as info:
        await eng.decide(
            "g", "ask", approve=True, approver="ann", rationale="", revision=1, value={"count": "x"}
        )
    assert (info.value.field, info.value.reason) == ("value.count", "'x' is not of type 'integer'")
    with pytest.raises(GateValueError, match="asks a value of its input_schema") as info:
        await eng.decide("g", "ask", approve=True, approver="ann", rationale="", revision=1)
    assert info.value.field == "value"
    state = await store.load("g")
    assert state is not None
    assert state.gates["ask"].decision is GateDecision.OPEN
    await eng.decide(
        "g", "ask", approve=True, approver="ann", rationale="three", revision=1, value={"count": 3}
    )
    result = await task
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["ask"] == {
        "approved": True,
        "approver": "ann",
        "rationale": "three",
        "value": {"count": 3},
    }
    assert runner.inputs == [("use", {"n": 3})]


async def test_a_choice_not_offered_is_refused_and_an_offered_one_is_read_by_an_expression() -> (
    None
):
    runner = Effects()
    eng = engine(runner, InMemoryStateStore())
    pick = GateStep(id="pick", prompt="Which?", choices=["north", "south"])
    use = ToolStep(
        id="go", tool="effect", input={"n": 1, "way": expr("pick.value")}, depends_on=["pick"]
    )
    events: list[StepEvent] = []
    task = asyncio.create_task(eng.run(plan(pick, use), on_event=events.append))
    await until(events, PlanStatus.BLOCKED)
    with pytest.raises(GateValueError, match="'west' is not one of the choices 'north', 'south'"):
        await eng.decide(
            "g", "pick", approve=True, approver="a", rationale="", revision=1, value="west"
        )
    with pytest.raises(GateDecisionError, match="a value may only come with the approval"):
        await eng.decide(
            "g", "pick", approve=False, approver="a", rationale="", revision=1, value="north"
        )
    await eng.decide(
        "g", "pick", approve=True, approver="a", rationale="", revision=1, value="south"
    )
    assert (await task).status is PlanStatus.SUCCEEDED
    assert runner.inputs == [("go", {"n": 1, "way": "south"})]


async def test_a_value_given_before_the_gate_is_reached_is_checked_and_kept() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    eng = engine(runner, store)
    first = ToolStep(id="first", tool="effect", input={"n": 1})
    later = ASK.model_copy(update={"depends_on": ["first"]})
    after = ToolStep(
        id="use", tool="effect", input={"n": ref("ask.value.count")}, depends_on=["ask"]
    )
    gated = plan(first, later, after)
    await store.save_plan(gated)
    with pytest.raises(GateValueError):
        await eng.decide("g", "ask", approve=True, approver="a", rationale="", revision=1, value={})
    await eng.decide(
        "g", "ask", approve=True, approver="a", rationale="", revision=1, value={"count": 7}
    )
    result = await eng.resume("g")
    assert result.status is PlanStatus.SUCCEEDED
    assert ("use", {"n": 7}) in runner.inputs


# --- who decides ------------------------------------------------------------------------------


async def test_a_deny_for_an_identity_the_gate_does_not_name() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    eng = engine(runner, store)
    gate = GateStep(id="ok", prompt="Ship?", deciders=["ann", "role:leads"])
    events: list[StepEvent] = []
    task = asyncio.create_task(eng.run(plan(gate), on_event=events.append))
    await until(events, PlanStatus.BLOCKED)
    seen: list[Sequence[str]] = []

    def bo(deciders: Sequence[str]) -> bool:
        seen.append(deciders)
        return "bo" in deciders

    with pytest.raises(GateDeciderError) as info:
        await eng.decide(
            "g", "ok", approve=True, approver="bo", rationale="", revision=1, may_decide=bo
        )
    assert seen == [("ann", "role:leads")]
    assert (
        str(info.value) == "'bo' may not decide gate 'ok' of plan 'g' (it is for: ann, role:leads)"
    )
    state = await store.load("g")
    assert state is not None
    assert state.gates["ok"].decision is GateDecision.OPEN
    await eng.decide(
        "g", "ok", approve=True, approver="ann", rationale="", revision=1, may_decide=only("ann")
    )
    assert (await task).status is PlanStatus.SUCCEEDED


async def test_the_deciders_of_a_stored_plan_are_checked_too(tmp_path: Path) -> None:
    runner = Effects()
    path = tmp_path / "plans.db"
    async with SqliteStateStore(path) as store:
        eng = engine(runner, store)
        events: list[StepEvent] = []
        gate = GateStep(id="ok", prompt="Ship?", deciders=["ann"])
        task = asyncio.create_task(eng.run(plan(gate), on_event=events.append))
        await until(events, PlanStatus.BLOCKED)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with SqliteStateStore(path) as store:
        eng = engine(runner, store)
        with pytest.raises(GateDeciderError):
            await eng.decide(
                "g",
                "ok",
                approve=True,
                approver="bo",
                rationale="",
                revision=1,
                may_decide=only("bo"),
            )
        await eng.decide(
            "g",
            "ok",
            approve=True,
            approver="ann",
            rationale="",
            revision=1,
            may_decide=only("ann"),
        )
        assert (await eng.resume("g")).status is PlanStatus.SUCCEEDED


# --- gates that time out ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("on_timeout", "status", "output"),
    [
        ("reject", PlanStatus.FAILED, None),
        (
            "approve",
            PlanStatus.SUCCEEDED,
            {"approved": True, "approver": TIMEOUT_APPROVER, "timed_out": True},
        ),
    ],
)
async def test_a_gate_times_out(on_timeout: str, status: PlanStatus, output: Any) -> None:
    runner = Effects()
    store = InMemoryStateStore()
    notices = Notices()
    eng = engine(runner, store, notices)
    gate = GateStep(id="ok", prompt="Ship?", timeout_s=0.05, on_timeout=on_timeout)
    events: list[StepEvent] = []
    result = await eng.run(plan(gate), on_event=events.append)
    assert result.status is status
    state = await store.load("g")
    assert state is not None
    assert (state.gates["ok"].approver, state.gates["ok"].timed_out) == (TIMEOUT_APPROVER, True)
    if output is None:
        assert result.failures[0].message == (
            "timed out: no decision within 0.05s (on_timeout: reject)"
        )
    else:
        assert {k: result.outputs["ok"][k] for k in output} == output
    assert notices.events() == ["opened", "timed_out"]
    outcome = next(e for e in events if e.step_id == "ok" and e.status is not StepStatus.BLOCKED)
    assert outcome.gate is not None
    assert outcome.gate.event == "timed_out"


async def test_a_timeout_with_a_default_value_feeds_it_to_the_next_step() -> None:
    runner = Effects()
    eng = engine(runner, InMemoryStateStore())
    gate = ASK.model_copy(
        update={"timeout_s": 0.05, "on_timeout": "default", "default": {"count": 2}}
    )
    use = ToolStep(id="use", tool="effect", input={"n": ref("ask.value.count")}, depends_on=["ask"])
    result = await eng.run(plan(gate, use))
    assert result.status is PlanStatus.SUCCEEDED
    assert runner.inputs == [("use", {"n": 2})]


async def test_a_deadline_runs_on_from_its_opening_across_a_restart_and_fires_once(
    tmp_path: Path,
) -> None:
    runner = Effects()
    path = tmp_path / "plans.db"
    notices = Notices()
    gate = GateStep(id="ok", prompt="Ship?", timeout_s=0.3, on_timeout="approve")
    after = ToolStep(id="after", tool="effect", input={"n": 1}, depends_on=["ok"])
    async with SqliteStateStore(path) as store:
        events: list[StepEvent] = []
        task = asyncio.create_task(
            engine(runner, store, notices).run(plan(gate, after), on_event=events.append)
        )
        await until(events, PlanStatus.BLOCKED)
        task.cancel()  # the agent goes down with the gate open
        with pytest.raises(asyncio.CancelledError):
            await task
    first = await _gate_records(path)
    assert [(r.decision, r.deadline is not None) for r in first] == [(GateDecision.OPEN, True)]
    await asyncio.sleep(0.35)  # the deadline passes while no engine runs
    async with SqliteStateStore(path) as store:
        result = await engine(runner, store, notices).resume("g")
    assert result.status is PlanStatus.SUCCEEDED
    records = await _gate_records(path)
    decisions = [r for r in records if r.decision is not GateDecision.OPEN]
    assert [(r.decision, r.approver) for r in decisions] == [
        (GateDecision.APPROVED, TIMEOUT_APPROVER)
    ]
    assert records[0].deadline == first[0].deadline  # journaled once, kept across the restart
    assert runner.effects == Counter({"g@1:after": 1})
    assert Counter(notices.events()) == Counter({"opened": 1, "timed_out": 1})
    # A third engine finds the plan finished: nothing fires again.
    async with SqliteStateStore(path) as store:
        assert (await engine(runner, store, notices).resume("g")).status is PlanStatus.SUCCEEDED
    assert len([r for r in await _gate_records(path) if r.decision is not GateDecision.OPEN]) == 1


async def test_a_timeout_decided_but_not_acted_on_before_a_restart_is_acted_on_once(
    tmp_path: Path,
) -> None:
    runner = Effects()
    path = tmp_path / "plans.db"
    notices = Notices()
    gate = GateStep(id="ok", prompt="Ship?", timeout_s=30, on_timeout="reject")
    async with SqliteStateStore(path) as store:
        events: list[StepEvent] = []
        task = asyncio.create_task(engine(runner, store).run(plan(gate), on_event=events.append))
        await until(events, PlanStatus.BLOCKED)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        opened = (await store.load("g")).gates["ok"]  # type: ignore[union-attr]
        # The deadline's decision committed, then the process died before acting on it.
        await store.commit(
            [
                GateRecord(
                    "g",
                    1,
                    "ok",
                    GateDecision.REJECTED,
                    approver=TIMEOUT_APPROVER,
                    rationale="no decision within 30s (on_timeout: reject)",
                )
            ]
        )
    async with SqliteStateStore(path) as store:
        result = await engine(runner, store, notices).resume("g")
    assert result.status is PlanStatus.FAILED
    assert len([r for r in await _gate_records(path) if r.decision is not GateDecision.OPEN]) == 1
    assert notices.events() == ["timed_out"]  # told, since the run could not have been sure
    assert notices.told[0].deadline == opened.deadline


class HeldDecisionStore(InMemoryStateStore):
    """Holds the commit of a person's decision until released: the deadline passes meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def commit(self, records: Sequence[Record]) -> None:
        if any(isinstance(r, GateRecord) and r.approver == "ann" for r in records):
            self.holding.set()
            await self.release.wait()
        await super().commit(records)


async def test_a_deadline_passing_while_a_decision_commits_does_not_decide_too() -> None:
    runner = Effects()
    store = HeldDecisionStore()
    eng = engine(runner, store)
    gate = GateStep(id="ok", prompt="Ship?", timeout_s=0.05, on_timeout="reject")
    events: list[StepEvent] = []
    task = asyncio.create_task(eng.run(plan(gate), on_event=events.append))
    await until(events, PlanStatus.BLOCKED)
    decided = asyncio.create_task(
        eng.decide("g", "ok", approve=True, approver="ann", rationale="yes", revision=1)
    )
    await asyncio.wait_for(store.holding.wait(), 10)
    await asyncio.sleep(0.2)  # the deadline passes while ann's decision is being committed
    store.release.set()
    await decided
    result = await task
    assert result.status is PlanStatus.SUCCEEDED
    decisions = [
        r
        for r in await store.journal("g")
        if isinstance(r, GateRecord) and r.decision is not GateDecision.OPEN
    ]
    assert [(r.decision, r.approver) for r in decisions] == [(GateDecision.APPROVED, "ann")]


async def _gate_records(path: Path) -> list[GateRecord]:
    async with SqliteStateStore(path) as store:
        return [r for r in await store.journal("g") if isinstance(r, GateRecord)]


# --- escalation -------------------------------------------------------------------------------


async def test_an_undecided_gate_escalates() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    notices = Notices()
    eng = engine(runner, store, notices)
    gate = GateStep(
        id="ok", prompt="Ship?", deciders=["ann"], escalate_after_s=0.05, escalate_to=["bo"]
    )
    events: list[StepEvent] = []
    task = asyncio.create_task(eng.run(plan(gate), on_event=events.append))
    await until(events, StepStatus.BLOCKED, count=2)  # opened, then escalated
    escalated = [e for e in events if e.step_id == "ok"][-1]
    assert escalated.message == "escalated to bo (undecided after 0.05s): Ship?"
    assert escalated.gate is not None
    assert escalated.gate.deciders == ("bo",)
    with pytest.raises(GateDeciderError, match="'ann' may not decide gate 'ok'"):
        await eng.decide(
            "g",
            "ok",
            approve=True,
            approver="ann",
            rationale="",
            revision=1,
            may_decide=only("ann"),
        )
    state = await committed(store, lambda s: s.gates["ok"].escalated)
    assert state.gates["ok"].deciders == ("bo",)
    await eng.decide(
        "g", "ok", approve=True, approver="bo", rationale="", revision=1, may_decide=only("bo")
    )
    assert (await task).status is PlanStatus.SUCCEEDED
    assert notices.events() == ["opened", "escalated"]
    assert [n.deciders for n in notices.kept.values()] == [("ann",), ("bo",)]


async def test_a_timeout_that_escalates_hands_the_gate_over_and_it_waits() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    eng = engine(runner, store)
    gate = GateStep(
        id="ok", prompt="Ship?", timeout_s=0.05, on_timeout="escalate", escalate_to=["role:leads"]
    )
    events: list[StepEvent] = []
    task = asyncio.create_task(eng.run(plan(gate), on_event=events.append))
    await until(events, StepStatus.BLOCKED, count=2)
    assert not task.done()
    state = await committed(store, lambda s: s.gates["ok"].escalated)
    assert state.gates["ok"].deciders == ("role:leads",)
    await eng.decide("g", "ok", approve=False, approver="cy", rationale="no", revision=1)
    assert (await task).status is PlanStatus.FAILED


# --- validation -------------------------------------------------------------------------------


def test_what_a_gate_cannot_use_is_refused_at_validation() -> None:
    bad = Plan(
        id="v",
        owner="perception",
        goal="g",
        steps=[
            GateStep(id="a", prompt="?", retry={"max_attempts": 2}),
            GateStep(id="b", prompt="?", on_timeout="approve"),
            GateStep(id="c", prompt="?", input_schema={"type": "nope"}),
            GateStep(id="d", prompt="?", choices=["x", "x"]),
            GateStep(id="e", prompt="?", choices=["x"], timeout_s=1, on_timeout="approve"),
            GateStep(
                id="f", prompt="?", choices=["x"], timeout_s=1, on_timeout="default", default="y"
            ),
            GateStep(id="h", prompt="?", escalate_after_s=1),
            GateStep(id="i", prompt="?", timeout_s=1, escalate_after_s=2, escalate_to=["bo"]),
            GateStep(id="j", prompt="?", input_schema={}, choices=["x"]),
        ],
    )
    with pytest.raises(PlanValidationError) as info:
        validate_plan(bad, tools=set())
    assert info.value.problems == [
        "gate 'a' cannot retry: a gate is decided, not attempted (use timeout_s and on_timeout)",
        "gate 'b' has on_timeout but no timeout_s",
        "gate 'c' input_schema is not a valid JSON Schema: 'nope' is not valid under any of the "
        "given schemas (at type)",
        "gate 'd' choices: the choice 'x' is given twice",
        "gate 'e' asks a value, so on_timeout 'approve' has none to give: use on_timeout 'default' "
        "with a default value",
        "gate 'f' default does not fit the gate: value: 'y' is not one of the choices 'x'",
        "gate 'h' escalates but names no one in escalate_to",
        "gate 'i' escalate_after_s (2) must be less than its timeout_s (1)",
        "gate 'j' asks with input_schema or with choices, not both",
    ]


def test_gates_stay_valid_through_their_json() -> None:
    """A plan travels as its whole JSON (every default written out): its gates must pass."""
    good = plan(
        GateStep(id="a", prompt="?"),
        ASK.model_copy(update={"timeout_s": 5.0, "on_timeout": "default", "default": {"count": 1}}),
        GateStep(id="c", prompt="?", timeout_s=9, escalate_after_s=3, escalate_to=["bo"]),
    )
    again = Plan.model_validate_json(good.model_dump_json())
    validate_plan(again, tools=set())


# --- approval per tool ------------------------------------------------------------------------


async def test_per_tool_approval_with_edited_arguments_runs_the_tool_once_with_them() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    notices = Notices()
    rule = ToolApproval("effect", when="arguments.n > `1`", deciders=("ann",))
    eng = engine(runner, store, notices, approvals=[rule])
    steps = [
        ToolStep(id="small", tool="effect", input={"n": 1}),
        ToolStep(id="big", tool="effect", input={"n": expr("small.n")}, depends_on=["small"]),
        ToolStep(id="bigger", tool="effect", input={"n": 5}, depends_on=["big"]),
    ]
    events: list[StepEvent] = []
    # "big" resolves to n=1: no approval; "bigger" (n=5) waits at its tool gate.
    task = asyncio.create_task(eng.run(plan(*steps), on_event=events.append))
    await until(events, PlanStatus.BLOCKED)
    blocked = next(e for e in events if e.status is StepStatus.BLOCKED)
    assert blocked.step_id == "bigger"
    assert blocked.gate is not None
    assert (blocked.gate.kind, blocked.gate.tool, blocked.gate.arguments) == (
        GateKind.TOOL,
        "effect",
        {"n": 5},
    )
    assert blocked.message.startswith("step 'bigger' calls tool 'effect' with {\"n\":5}")
    with pytest.raises(GateValueError) as info:
        await eng.decide(
            "g",
            "bigger",
            approve=True,
            approver="ann",
            rationale="",
            revision=1,
            arguments={"n": "five"},
        )
    assert (info.value.field, info.value.reason) == (
        "arguments.n",
        "Input should be a valid integer",
    )
    with pytest.raises(GateDeciderError):
        await eng.decide(
            "g",
            "bigger",
            approve=True,
            approver="bo",
            rationale="",
            revision=1,
            arguments={"n": 3},
            may_decide=only("bo"),
        )
    await eng.decide(
        "g",
        "bigger",
        approve=True,
        approver="ann",
        rationale="3 is enough",
        revision=1,
        arguments={"n": 3},
        may_decide=only("ann"),
    )
    result = await task
    assert result.status is PlanStatus.SUCCEEDED
    assert result.submitted.revision == 2
    assert result.outputs["bigger"] == {"step": "bigger", "n": 3}
    assert [args for step, args in runner.inputs if step == "bigger"] == [{"n": 3}]
    assert runner.effects == Counter({"g@1:small": 1, "g@1:big": 1, "g@2:bigger": 1})
    history = await store.revisions("g")
    assert (history[-1].revision, history[-1].author) == (2, "ann")
    assert history[-1].rationale == (
        "the arguments of step 'bigger' (tool 'effect') were edited at its approval by ann: "
        "3 is enough"
    )
    assert set(history[-1].carried) == {"small", "big"}
    assert notices.events() == ["opened"]


async def test_per_tool_approval_approve_runs_and_reject_fails() -> None:
    for approve in (True, False):
        runner = Effects()
        eng = engine(runner, InMemoryStateStore(), approvals=[ToolApproval("effect")])
        events: list[StepEvent] = []
        task = asyncio.create_task(
            eng.run(plan(ToolStep(id="s", tool="effect", input={"n": 1})), on_event=events.append)
        )
        await until(events, PlanStatus.BLOCKED)
        assert runner.calls == []
        await eng.decide("g", "s", approve=approve, approver="ann", rationale="r", revision=1)
        result = await task
        outcome = [e for e in events if e.step_id == "s" and e.gate is not None][-1]
        assert outcome.gate is not None
        assert (outcome.gate.event, outcome.gate.decision, outcome.gate.approver) == (
            "decided",
            "approved" if approve else "rejected",
            "ann",
        )
        assert outcome.status is (StepStatus.RUNNING if approve else StepStatus.FAILED)
        assert result.status is (PlanStatus.SUCCEEDED if approve else PlanStatus.FAILED)
        assert len(runner.calls) == (1 if approve else 0)
        assert result.submitted.revision == 1


async def test_a_tool_gate_survives_a_restart_and_an_approval_is_not_asked_again(
    tmp_path: Path,
) -> None:
    runner = Effects()
    path = tmp_path / "plans.db"
    rules = [ToolApproval("effect")]
    async with SqliteStateStore(path) as store:
        events: list[StepEvent] = []
        gated = plan(ToolStep(id="s", tool="effect", input={"n": 1}))
        task = asyncio.create_task(
            engine(runner, store, approvals=rules).run(gated, on_event=events.append)
        )
        await until(events, PlanStatus.BLOCKED)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with SqliteStateStore(path) as store:
        eng = engine(runner, store, approvals=rules)
        await eng.decide(
            "g", "s", approve=True, approver="ann", rationale="", revision=1, arguments={"n": 4}
        )
        result = await eng.resume("g")
    assert result.status is PlanStatus.SUCCEEDED
    assert result.submitted.revision == 2
    assert runner.inputs == [("s", {"n": 4})]


# --- fork -------------------------------------------------------------------------------------


def chain() -> Plan:
    return plan(
        ToolStep(id="a", tool="effect", input={"n": 1}),
        ToolStep(id="b", tool="effect", input={"n": expr("a.n")}, depends_on=["a"]),
        ToolStep(id="c", tool="effect", input={"n": expr("b.n")}, depends_on=["b"]),
        ToolStep(id="d", tool="effect", input={"n": expr("c.n")}, depends_on=["c"]),
        plan_id="orig",
    )


async def test_a_fork_with_a_substituted_output_reruns_only_the_steps_after_the_fork_point(
    tmp_path: Path,
) -> None:
    runner = Effects()
    async with SqliteStateStore(tmp_path / "plans.db") as store:
        eng = engine(runner, store)
        assert (await eng.run(chain())).status is PlanStatus.SUCCEEDED
        forked = await eng.fork(
            "orig", "fork1", at_step="c", outputs={"b": {"step": "b", "n": 10}}, author="ann"
        )
        assert forked.forked_from is not None
        assert (forked.forked_from.plan_id, forked.forked_from.at_step) == ("orig", "c")
        assert forked.forked_from.carried == ["a", "b"]
        result = await eng.resume("fork1")
        assert result.status is PlanStatus.SUCCEEDED
        assert result.outputs["d"] == {"step": "d", "n": 10}
        # Each effect once: the original's four, the fork's two (c and d) and no more.
        assert runner.effects == Counter(
            {
                "orig@1:a": 1,
                "orig@1:b": 1,
                "orig@1:c": 1,
                "orig@1:d": 1,
                "fork1@1:c": 1,
                "fork1@1:d": 1,
            }
        )
        report = await replay(store, "fork1")
        assert report.divergences == []
        history = await store.revisions("fork1")
        assert (history[0].author, history[0].carried) == ("ann", ["a", "b"])
        assert history[0].rationale == (
            "forked from plan 'orig' revision 1 at step 'c', outputs of b substituted"
        )
        original = await store.load("orig")
        assert original is not None
        assert original.status is PlanStatus.SUCCEEDED


async def test_a_substituted_output_reruns_its_dependents_even_before_the_fork_point() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    eng = engine(runner, store)
    await eng.run(chain())
    await eng.fork("orig", "f2", outputs={"a": {"step": "a", "n": 7}}, author="ann")
    result = await eng.resume("f2")
    assert result.outputs["d"] == {"step": "d", "n": 7}
    assert sorted(k for k in runner.effects if k.startswith("f2")) == [
        "f2@1:b",
        "f2@1:c",
        "f2@1:d",
    ]


async def test_a_fork_after_a_gate_carries_its_decision_and_replays_it() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    eng = engine(runner, store)
    pick = GateStep(id="pick", prompt="Which?", choices=[1, 2])
    use = ToolStep(id="use", tool="effect", input={"n": expr("pick.value")}, depends_on=["pick"])
    events: list[StepEvent] = []
    task = asyncio.create_task(eng.run(plan(pick, use, plan_id="src"), on_event=events.append))
    await until(events, PlanStatus.BLOCKED)
    await eng.decide("src", "pick", approve=True, approver="ann", rationale="", revision=1, value=1)
    assert (await task).status is PlanStatus.SUCCEEDED
    substituted = {"approved": True, "approver": "bo", "rationale": "two", "value": 2}
    await eng.fork("src", "dst", at_step="use", outputs={"pick": substituted}, author="bo")
    result = await eng.resume("dst")
    assert result.outputs["use"] == {"step": "use", "n": 2}
    report = await replay(store, "dst")
    assert report.divergences == []


async def test_bad_forks_are_refused_and_nothing_is_stored() -> None:
    runner = Effects()
    store = InMemoryStateStore()
    eng = engine(runner, store)
    await eng.run(chain())
    with pytest.raises(ForkError) as info:
        await eng.fork("orig", "x1", at_step="zz", author="ann")
    assert info.value.field == "at_step"
    assert str(info.value) == (
        "cannot fork plan 'orig': at_step: revision 1 of plan 'orig' has no step 'zz' "
        "(steps: a, b, c, d)"
    )
    with pytest.raises(ForkError, match=r"set\.c: step 'c' is not before the fork point"):
        await eng.fork("orig", "x2", at_step="c", outputs={"c": {"n": 1}}, author="ann")
    with pytest.raises(ForkError, match="has no revision 3"):
        await eng.fork("orig", "x3", revision=3, author="ann")
    with pytest.raises(ForkError, match="an output must be a JSON object"):
        await eng.fork("orig", "x4", outputs={"a": [1]}, author="ann")
    for plan_id in ("x1", "x2", "x3", "x4"):
        assert await store.load(plan_id) is None


async def test_a_plans_journal_holds_what_the_gate_asked_and_answered(tmp_path: Path) -> None:
    runner = Effects()
    path = tmp_path / "plans.db"
    async with SqliteStateStore(path) as store:
        eng = engine(runner, store)
        events: list[StepEvent] = []
        task = asyncio.create_task(eng.run(plan(ASK), on_event=events.append))
        await until(events, PlanStatus.BLOCKED)
        await eng.decide(
            "g", "ask", approve=True, approver="ann", rationale="", revision=1, value={"count": 1}
        )
        await task
    async with SqliteStateStore(path) as store:
        state = await store.load("g")
    assert state is not None
    gate = state.gates["ask"]
    assert (gate.decision, gate.value, gate.has_value) == (
        GateDecision.APPROVED,
        {"count": 1},
        True,
    )
    assert json.loads(json.dumps(state.outputs["ask"]))["value"] == {"count": 1}
