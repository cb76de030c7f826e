"""The checkpointed engine: intents before effects, grouped commits, resume, gates, compensation.

Crashes are simulated by cancelling the task running ``Engine.run`` (with a store, an
interruption: nothing more is recorded) and resuming with a fresh engine and a fresh store on the
same SQLite file.

Ledger semantics (what "exactly once" means here): a side-effecting tool applies its effect in one
synchronous statement (``ledger[key] += 1``), so an interruption lands either before the effect
or after it, never inside it. A step interrupted mid-flight stops at a reconcile gate; the
operator (the test) looks the step's key up in the ledger: when the effect is there, it approves
with the recorded output (the step is marked done without running again), otherwise it approves
a re-run. Either way every key ends with exactly one effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from stratagem.planning import (
    Budget,
    Engine,
    EngineConfig,
    FailureClass,
    GateDecision,
    GateDecisionError,
    GateRecord,
    GateStep,
    InMemoryStateStore,
    LogicError,
    Plan,
    PlanControlError,
    PlanResult,
    PlanStatus,
    PlanValidationError,
    PostgresStateStore,
    Record,
    SqliteStateStore,
    StepEvent,
    StepIntent,
    StepStatus,
    ToolContext,
    ToolStep,
    TransientError,
    ref,
    validate_plan,
)

from ._support import DictToolRunner, noop


class Ledger:
    """Side effects by idempotency key, and the outputs the effects produced."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.outputs: dict[str, dict[str, Any]] = {}
        self.undone: Counter[str] = Counter()
        self.undo_order: list[str] = []
        self.runs: list[tuple[str, int]] = []  # (step, attempt) in the order tools started

    async def effect(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.runs.append((ctx.step_id, ctx.attempt))
        await asyncio.sleep(0)  # an interruption here: no effect
        key = ctx.call_id
        self.effects[key] += 1  # the effect
        output = {"step": ctx.step_id, "saw": input.get("prev")}
        self.outputs[key] = output
        if input.get("linger"):
            await asyncio.sleep(0)  # an interruption here: effect done, no result
        return output

    async def undo(self, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        assert ctx.compensating
        await asyncio.sleep(0)
        key = ctx.call_id
        if key not in self.undone:
            self.undo_order.append(ctx.step_id)
        self.undone[key] += 1  # a refund keyed by the step's key: idempotent by design
        await asyncio.sleep(0)
        return {"undone": input["output"]["step"]}


class IdempotentRunner(DictToolRunner):
    def __init__(self, tools: dict[str, Any], idempotent: set[str]) -> None:
        super().__init__(tools)
        self.idempotent = idempotent

    def is_idempotent(self, name: str) -> bool:
        return name in self.idempotent


class RecordingStore(InMemoryStateStore):
    """An in-memory store that logs each commit into a shared log."""

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.log = log

    async def commit(self, records: Sequence[Record]) -> None:
        await super().commit(records)
        self.log.append(("commit", list(records)))


def random_plan(seed: int, steps: int = 50) -> Plan:
    rng = random.Random(seed)
    out: list[ToolStep] = []
    for n in range(steps):
        deps = sorted({f"s{rng.randrange(n)}" for _ in range(rng.randint(0, 2))}) if n else []
        tool = "pure" if rng.random() < 0.2 else "effect"
        data: dict[str, Any] = {"linger": rng.random() < 0.5}
        if deps:
            data["prev"] = ref(f"{deps[0]}.step")
        out.append(ToolStep(id=f"s{n}", tool=tool, depends_on=deps, input=data))
    return Plan(id=f"plan-{seed}", owner="tactical", goal="crash me", steps=out)


def engine_with(
    ledger: Ledger, store: Any, *, max_in_flight: int = 4, extra: dict[str, Any] | None = None
) -> Engine:
    pure_runs: Counter[str] = Counter()

    async def pure(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        pure_runs[ctx.step_id] += 1
        await asyncio.sleep(0)
        return {"step": ctx.step_id, "saw": input.get("prev")}

    tools = {"effect": ledger.effect, "pure": pure, "undo": ledger.undo, **(extra or {})}
    return Engine(
        EngineConfig(max_in_flight=max_in_flight),
        tools=IdempotentRunner(tools, {"pure"}),
        agent="tactical",
        store=store,
    )


async def crash_after(task: asyncio.Task[Any], ledger: Ledger, runs: int, spins: int) -> None:
    """Cancel ``task`` once ``runs`` tool calls have started, ``spins`` loop turns later."""
    while len(ledger.runs) < runs and not task.done():  # noqa: ASYNC110 - counting loop turns
        await asyncio.sleep(0)
    for _ in range(spins):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def resume_reconciling(
    engine: Engine, plan_id: str, ledger: Ledger
) -> tuple[PlanResult[Plan], list[tuple[str, bool]]]:
    """Resume ``plan_id``, deciding each reconcile gate from the ledger.

    Returns:
        The result, and (step id, effect found) per reconcile gate decided.
    """
    gates: asyncio.Queue[str] = asyncio.Queue()
    decided: list[tuple[str, bool]] = []

    def on_event(event: StepEvent) -> None:
        if event.step_id and event.status is StepStatus.BLOCKED:
            gates.put_nowait(event.step_id)

    task = asyncio.create_task(engine.resume(plan_id, on_event=on_event))
    while not task.done():
        getter = asyncio.ensure_future(gates.get())
        await asyncio.wait([task, getter], return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            break
        step_id = getter.result()
        key = f"{plan_id}@1:{step_id}"
        done = ledger.effects[key] > 0
        await engine.decide(
            plan_id,
            step_id,
            approve=True,
            approver="operator",
            rationale="effect found in the ledger" if done else "no effect in the ledger",
            revision=1,
            output=ledger.outputs[key] if done else None,
        )
        decided.append((step_id, done))
    return await task, decided


# --- ordering and grouping -------------------------------------------------------------------


async def test_every_intent_is_committed_before_its_tool_runs() -> None:
    log: list[tuple[str, Any]] = []

    async def tool(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        log.append(("run", (ctx.step_id, ctx.attempt)))
        if ctx.step_id == "b" and ctx.attempt == 1:
            raise TransientError("flaky")
        return {"step": ctx.step_id}

    plan = Plan(
        id="order",
        owner="perception",
        goal="g",
        steps=[
            ToolStep(id="a", tool="t"),
            ToolStep(id="b", tool="t", depends_on=["a"]),
            ToolStep(id="c", tool="t", depends_on=["a"]),
            ToolStep(id="d", tool="t", depends_on=["b", "c"]),
        ],
    )
    engine = Engine(
        tools=DictToolRunner({"t": tool}), agent="perception", store=RecordingStore(log)
    )
    result = await engine.run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    runs = [entry for kind, entry in log if kind == "run"]
    assert sorted(runs) == [("a", 1), ("b", 1), ("b", 2), ("c", 1), ("d", 1)]
    committed: set[tuple[str, int]] = set()
    for kind, entry in log:
        if kind == "commit":
            committed |= {(r.step_id, r.attempt) for r in entry if isinstance(r, StepIntent)}
        else:
            assert entry in committed, f"{entry} ran before its intent was committed"


async def test_a_tick_of_completions_is_one_commit() -> None:
    store = InMemoryStateStore()
    plan = Plan(
        id="wide",
        owner="perception",
        goal="g",
        steps=[ToolStep(id=f"s{n}", tool="noop") for n in range(20)],
    )
    engine = Engine(
        EngineConfig(max_in_flight=20),
        tools=DictToolRunner({"noop": noop}),
        agent="perception",
        store=store,
    )
    result = await engine.run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    # running + 20 intents, 20 results, the final status: a handful of commits, not 41
    assert store.commits <= 4, store.commits
    state = await store.load("wide")
    assert state is not None
    assert state.records == 42


async def test_without_a_store_nothing_changes_and_resume_is_refused() -> None:
    engine = Engine(tools=DictToolRunner({"noop": noop}), agent="perception")
    plan = Plan(id="plain", owner="perception", goal="g", steps=[ToolStep(id="a", tool="noop")])
    assert (await engine.run(plan)).status is PlanStatus.SUCCEEDED
    assert (await engine.run(plan)).status is PlanStatus.SUCCEEDED  # no store: no "already run"
    with pytest.raises(PlanControlError, match="no state store"):
        await engine.resume("plain")


async def test_a_stored_plan_is_not_run_twice(tmp_path: Path) -> None:
    async with SqliteStateStore(tmp_path / "s.db") as store:
        ledger = Ledger()
        engine = engine_with(ledger, store)
        plan = random_plan(1, steps=5)
        assert (await engine.run(plan)).status is PlanStatus.SUCCEEDED
        with pytest.raises(PlanControlError, match="resume it instead"):
            await engine.run(plan)
        again = await engine.resume(plan.id)  # a finished plan: its recorded result
        assert again.status is PlanStatus.SUCCEEDED
        assert again.outputs.keys() == {f"s{n}" for n in range(5)}
        assert sum(ledger.effects.values()) == len(
            [s for s in plan.steps if isinstance(s, ToolStep) and s.tool == "effect"]
        )
        assert await store.unfinished() == []


# --- crash and resume ------------------------------------------------------------------------


@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "threaded"])
@pytest.mark.parametrize("seed", range(20))
async def test_crash_anywhere_then_resume_runs_every_effect_exactly_once(
    seed: int, threaded: bool, tmp_path: Path
) -> None:
    rng = random.Random(seed)
    plan = random_plan(seed)
    effect_steps = [s.id for s in plan.steps if isinstance(s, ToolStep) and s.tool == "effect"]
    ledger = Ledger()
    path = tmp_path / "state.db"
    store = SqliteStateStore(path, threaded=threaded)
    task = asyncio.create_task(engine_with(ledger, store).run(plan))
    await crash_after(task, ledger, rng.randrange(1, 50), rng.randrange(0, 6))
    await store.aclose()

    async with SqliteStateStore(path, threaded=threaded) as fresh:
        result, decided = await resume_reconciling(engine_with(ledger, fresh), plan.id, ledger)
        assert await fresh.unfinished() == []
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert {f"{plan.id}@1:{s}": ledger.effects[f"{plan.id}@1:{s}"] for s in effect_steps} == {
        f"{plan.id}@1:{s}": 1 for s in effect_steps
    }
    for step in plan.steps:  # recorded outputs fed the references of resumed steps
        assert result.outputs[step.id]["step"] == step.id
        if step.depends_on:
            assert result.outputs[step.id]["saw"] == step.depends_on[0]
    # an interrupted non-idempotent step never re-ran without a decision
    for step_id, _ in decided:
        assert ledger.effects[f"{plan.id}@1:{step_id}"] == 1


@pytest.mark.postgres
@pytest.mark.parametrize("seed", range(6))
async def test_crash_then_resume_on_postgres_runs_every_effect_exactly_once(
    seed: int, postgres_url: str
) -> None:
    rng = random.Random(seed)
    plan = random_plan(seed)
    effect_steps = [s.id for s in plan.steps if isinstance(s, ToolStep) and s.tool == "effect"]
    ledger = Ledger()
    store = PostgresStateStore(postgres_url, schema="stratagem_tactical")
    task = asyncio.create_task(engine_with(ledger, store).run(plan))
    await crash_after(task, ledger, rng.randrange(1, 50), rng.randrange(0, 6))
    await store.aclose()

    async with PostgresStateStore(postgres_url, schema="stratagem_tactical") as fresh:
        result, decided = await resume_reconciling(engine_with(ledger, fresh), plan.id, ledger)
        assert await fresh.unfinished() == []
    assert result.status is PlanStatus.SUCCEEDED, result.failures
    assert {s: ledger.effects[f"{plan.id}@1:{s}"] for s in effect_steps} == dict.fromkeys(
        effect_steps, 1
    )
    for step_id, _ in decided:
        assert ledger.effects[f"{plan.id}@1:{step_id}"] == 1


async def test_crashes_do_land_mid_flight() -> None:
    """The seeds above exercise reconcile gates of both kinds (guards the test's own reach)."""
    kinds: Counter[bool] = Counter()
    for seed in range(20):
        rng = random.Random(seed)
        plan = random_plan(seed)
        ledger = Ledger()
        store = InMemoryStateStore()
        task = asyncio.create_task(engine_with(ledger, store).run(plan))
        await crash_after(task, ledger, rng.randrange(1, 50), rng.randrange(0, 6))
        result, decided = await resume_reconciling(engine_with(ledger, store), plan.id, ledger)
        assert result.status is PlanStatus.SUCCEEDED
        kinds.update(done for _, done in decided)
    assert kinds[True] > 0, kinds
    assert kinds[False] > 0, kinds


async def test_an_idempotent_step_in_flight_is_rerun_without_a_gate() -> None:
    started = asyncio.Event()
    runs: Counter[str] = Counter()

    async def slow(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        runs[ctx.step_id] += 1
        started.set()
        await asyncio.sleep(0 if ctx.attempt > 1 else 10)
        return {"attempt": ctx.attempt}

    store = InMemoryStateStore()
    plan = Plan(id="idem", owner="perception", goal="g", steps=[ToolStep(id="a", tool="slow")])
    runner = IdempotentRunner({"slow": slow}, {"slow"})
    task = asyncio.create_task(Engine(tools=runner, agent="perception", store=store).run(plan))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    events: list[StepEvent] = []
    engine = Engine(tools=runner, agent="perception", store=store)
    result = await engine.resume("idem", on_event=events.append)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs == {"a": {"attempt": 2}}
    assert runs["a"] == 2
    assert all(e.status is not StepStatus.BLOCKED for e in events)


async def test_a_rejected_reconcile_gate_fails_the_step_as_policy() -> None:
    ledger = Ledger()
    store = InMemoryStateStore()
    hold = asyncio.Event()

    async def charge_card(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        hold.set()
        await asyncio.sleep(10)
        return {}

    plan = Plan(
        id="charge",
        owner="perception",
        goal="g",
        steps=[ToolStep(id="s7", tool="charge_card"), ToolStep(id="s8", tool="effect")],
    )
    extra = {"charge_card": charge_card}
    task = asyncio.create_task(engine_with(ledger, store, extra=extra).run(plan))
    await hold.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    engine = engine_with(ledger, store, extra=extra)
    events: list[StepEvent] = []
    resumed = asyncio.create_task(engine.resume("charge", on_event=events.append))
    await wait_for(events, PlanStatus.BLOCKED)
    blocked = next(e for e in events if e.step_id == "s7")
    assert blocked.status is StepStatus.BLOCKED
    assert blocked.message == (
        "step 's7' (tool 'charge_card') was in flight when the plan stopped; "
        "approve to re-run it, reject to fail it"
    )
    for _ in range(100):  # events precede the commit of their tick; the commit follows at once
        state = await store.load("charge")
        assert state is not None
        if state.status is PlanStatus.BLOCKED:
            break
        await asyncio.sleep(0)
    assert state is not None
    assert state.status is PlanStatus.BLOCKED
    assert state.gates["s7"].kind.value == "reconcile"
    await engine.decide(
        "charge", "s7", approve=False, approver="ann", rationale="card declined", revision=1
    )
    result = await resumed
    assert result.status is PlanStatus.FAILED
    assert [(f.step_id, f.failure_class, f.message) for f in result.failures] == [
        ("s7", FailureClass.POLICY, "rejected by ann: card declined")
    ]


# --- gates ---------------------------------------------------------------------------------


def gated_plan(plan_id: str = "gated") -> Plan:
    return Plan(
        id=plan_id,
        owner="perception",
        goal="g",
        steps=[
            ToolStep(id="a", tool="effect"),
            GateStep(id="g", prompt="publish?", depends_on=["a"]),
            ToolStep(id="b", tool="effect", depends_on=["g"]),
        ],
    )


async def wait_for(events: list[StepEvent], status: PlanStatus | StepStatus) -> None:
    for _ in range(10_000):
        if any(e.status is status for e in events):
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"no {status} event")


async def test_a_gate_approved_across_a_restart(tmp_path: Path) -> None:
    ledger = Ledger()
    path = tmp_path / "state.db"
    store = SqliteStateStore(path)
    events: list[StepEvent] = []
    task = asyncio.create_task(engine_with(ledger, store).run(gated_plan(), on_event=events.append))
    await wait_for(events, PlanStatus.BLOCKED)
    assert [e.message for e in events if e.step_id == "g"] == ["publish?"]
    task.cancel()  # the agent goes down while the plan waits
    with pytest.raises(asyncio.CancelledError):
        await task
    await store.aclose()

    async with SqliteStateStore(path) as fresh:
        engine = engine_with(ledger, fresh)
        with pytest.raises(GateDecisionError, match="revision 2 does not apply") as info:
            await engine.decide(
                "gated", "g", approve=True, approver="ann", rationale="ok", revision=2
            )
        assert (info.value.gate_id, info.value.revision) == ("g", 2)
        await engine.decide("gated", "g", approve=True, approver="ann", rationale="ok", revision=1)
        with pytest.raises(GateDecisionError, match="already approved"):
            await engine.decide(
                "gated", "g", approve=False, approver="bo", rationale="no", revision=1
            )
        result = await engine.resume("gated")
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["g"] == {"approved": True, "approver": "ann", "rationale": "ok"}
    assert ledger.effects == Counter({"gated@1:a": 1, "gated@1:b": 1})


async def test_a_gate_decided_while_the_run_waits() -> None:
    ledger = Ledger()
    store = InMemoryStateStore()
    engine = engine_with(ledger, store)
    events: list[StepEvent] = []
    task = asyncio.create_task(engine.run(gated_plan(), on_event=events.append))
    await wait_for(events, PlanStatus.BLOCKED)
    assert not task.done()
    with pytest.raises(GateDecisionError, match="revision 3 does not apply"):
        await engine.decide("gated", "g", approve=True, approver="ann", rationale="", revision=3)
    with pytest.raises(GateDecisionError, match="no open gate 'b'"):
        await engine.decide("gated", "b", approve=True, approver="ann", rationale="", revision=1)
    with pytest.raises(GateDecisionError, match="only be given to a reconcile gate"):
        await engine.decide(
            "gated", "g", approve=True, approver="a", rationale="", revision=1, output={}
        )
    await engine.decide(
        "gated", "g", approve=False, approver="ann", rationale="not yet", revision=1
    )
    result = await task
    assert result.status is PlanStatus.FAILED
    assert result.failures[0].failure_class is FailureClass.POLICY
    assert result.statuses == {
        "a": StepStatus.SUCCEEDED,
        "g": StepStatus.FAILED,
        "b": StepStatus.SKIPPED,
    }
    plan_statuses = [e.status for e in events if e.step_id == ""]
    assert plan_statuses == [PlanStatus.RUNNING, PlanStatus.BLOCKED, PlanStatus.FAILED]
    state = await store.load("gated")
    assert state is not None
    assert (state.status, state.gates["g"].approver) == (PlanStatus.FAILED, "ann")


class HeldGateStore(InMemoryStateStore):
    """Holds the commit that opens a gate until released: a slow disk at the worst moment."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def commit(self, records: Sequence[Record]) -> None:
        opens = any(isinstance(r, GateRecord) and r.decision is GateDecision.OPEN for r in records)
        if opens and not self.release.is_set():
            self.holding.set()
            await self.release.wait()
        await super().commit(records)


async def test_a_decision_given_while_the_gates_opening_commits_is_kept() -> None:
    store = HeldGateStore()
    engine = engine_with(Ledger(), store)
    task = asyncio.create_task(engine.run(gated_plan()))
    await asyncio.wait_for(store.holding.wait(), 10)
    decided = asyncio.create_task(
        engine.decide("gated", "g", approve=False, approver="ann", rationale="no", revision=1)
    )
    for _ in range(20):  # let the decision reach the journal while the opening is held
        await asyncio.sleep(0)
    store.release.set()
    await decided
    result = await task
    assert result.status is PlanStatus.FAILED
    state = await store.load("gated")
    assert state is not None
    assert (state.gates["g"].decision, state.gates["g"].approver) == (
        GateDecision.REJECTED,
        "ann",
    )


async def test_a_gate_without_a_store_waits_for_decide() -> None:
    ledger = Ledger()
    engine = engine_with(ledger, None)
    events: list[StepEvent] = []
    task = asyncio.create_task(engine.run(gated_plan(), on_event=events.append))
    await wait_for(events, PlanStatus.BLOCKED)
    await engine.decide("gated", "g", approve=True, approver="ann", rationale="go", revision=1)
    result = await task
    assert result.status is PlanStatus.SUCCEEDED
    assert [e.status for e in events if e.step_id == ""] == [
        PlanStatus.RUNNING,
        PlanStatus.BLOCKED,
        PlanStatus.RUNNING,
        PlanStatus.SUCCEEDED,
    ]


def test_validation_of_gates_and_compensations() -> None:
    plan = Plan(
        id="v",
        owner="perception",
        goal="g",
        steps=[
            ToolStep(id="a", tool="effect", compensate="nope"),
            GateStep(id="g", prompt="?", compensate="undo"),
            ToolStep(id="b", tool="effect", compensate="undo", compensate_input={"x": ref("c.y")}),
            ToolStep(id="c", tool="effect", depends_on=["b"], compensate_input={"x": 1}),
            ToolStep(
                id="d",
                tool="effect",
                depends_on=["b"],
                compensate="undo",
                compensate_input={"mine": ref("d.step"), "dep": ref("b.step")},
            ),
        ],
    )
    with pytest.raises(PlanValidationError) as info:
        validate_plan(plan, tools={"effect", "undo"})
    assert info.value.problems == [
        "step 'a' is compensated by tool 'nope', which is not in the perception agent's registry",
        "gate 'g' cannot have a compensation",
        "step 'b' compensation references step 'c' in 'c.y', which is not among its "
        "(transitive) dependencies",
        "step 'c' has compensate_input but no compensate tool",
    ]


# --- pause, cancel, compensation -------------------------------------------------------------


async def test_pause_then_resume() -> None:
    ledger = Ledger()
    store = InMemoryStateStore()
    release = asyncio.Event()

    async def slow(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await release.wait()
        return await ledger.effect(input, ctx)

    plan = Plan(
        id="pausable",
        owner="perception",
        goal="g",
        steps=[
            ToolStep(id="a", tool="slow"),
            ToolStep(id="b", tool="effect", depends_on=["a"]),
            ToolStep(id="c", tool="effect", depends_on=["b"]),
        ],
    )
    engine = engine_with(ledger, store, extra={"slow": slow})
    events: list[StepEvent] = []
    task = asyncio.create_task(engine.run(plan, on_event=events.append))
    await wait_for(events, StepStatus.RUNNING)  # "a" runs, waiting on the event
    await engine.pause("pausable")
    release.set()  # the running step finishes; nothing new starts
    result = await task
    assert result.status is PlanStatus.PAUSED
    assert result.statuses == {
        "a": StepStatus.SUCCEEDED,
        "b": StepStatus.PENDING,
        "c": StepStatus.PENDING,
    }
    state = await store.load("pausable")
    assert state is not None
    assert state.status is PlanStatus.PAUSED
    assert await store.unfinished() == ["pausable"]
    resumed = await engine.resume("pausable")
    assert resumed.status is PlanStatus.SUCCEEDED
    assert ledger.effects == Counter({"pausable@1:a": 1, "pausable@1:b": 1, "pausable@1:c": 1})


def compensated_chain(plan_id: str, steps: int, *, fail_last: bool = True) -> Plan:
    out: list[ToolStep] = []
    for n in range(steps):
        deps = [f"s{n - 1}"] if n else []
        out.append(ToolStep(id=f"s{n}", tool="effect", depends_on=deps, compensate="undo"))
    if fail_last:
        out.append(ToolStep(id="boom", tool="boom", depends_on=[f"s{steps - 1}"]))
    return Plan(id=plan_id, owner="perception", goal="g", steps=out)


async def boom(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    raise LogicError("the last step cannot work")


async def test_a_failed_plan_is_compensated_in_reverse_order() -> None:
    ledger = Ledger()
    store = InMemoryStateStore()
    events: list[StepEvent] = []
    plan = compensated_chain("comp", 4)
    result = await engine_with(ledger, store, extra={"boom": boom}).run(
        plan, on_event=events.append
    )
    assert result.status is PlanStatus.FAILED
    assert ledger.undo_order == ["s3", "s2", "s1", "s0"]
    assert all(result.statuses[f"s{n}"] is StepStatus.COMPENSATED for n in range(4))
    assert [e.status for e in events if e.step_id == ""] == [
        PlanStatus.RUNNING,
        PlanStatus.COMPENSATING,
        PlanStatus.FAILED,
    ]
    state = await store.load("comp")
    assert state is not None
    assert [(c.step_id, c.status.value) for c in state.compensations] == [
        (f"s{n}", "compensated") for n in range(4)
    ]


async def test_a_failing_compensation_is_retried_recorded_and_the_rest_continue() -> None:
    ledger = Ledger()
    store = InMemoryStateStore()
    tries: Counter[str] = Counter()

    async def picky_undo(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        tries[ctx.step_id] += 1
        if ctx.step_id == "s1":
            raise TransientError("refund service down")
        return await ledger.undo(input, ctx)

    async def no_sleep(delay: float) -> None:
        return None

    plan = compensated_chain("picky", 3)
    engine = engine_with(ledger, store, extra={"boom": boom, "undo": picky_undo})
    engine._sleep = no_sleep
    result = await engine.run(plan)
    assert result.status is PlanStatus.FAILED
    assert tries == Counter({"s2": 1, "s1": 3, "s0": 1})  # the default policy: 3 attempts
    assert ledger.undo_order == ["s2", "s0"]
    assert result.statuses["s1"] is StepStatus.COMPENSATION_FAILED
    state = await store.load("picky")
    assert state is not None
    failed = next(c for c in state.compensations if c.step_id == "s1")
    assert (failed.status.value, failed.attempt, failed.message) == (
        "failed",
        3,
        "refund service down",
    )


@pytest.mark.parametrize("seed", range(10))
async def test_a_crash_during_compensation_resumes_it(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    ledger = Ledger()
    path = tmp_path / "state.db"
    store = SqliteStateStore(path)
    plan = compensated_chain(f"undo-{seed}", 8)
    undo_calls = 0
    crash_at = rng.randrange(1, 8)
    crashed = asyncio.Event()

    async def counting_undo(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        nonlocal undo_calls
        undo_calls += 1
        if undo_calls == crash_at:
            crashed.set()
        return await ledger.undo(input, ctx)

    extra = {"boom": boom, "undo": counting_undo}
    task = asyncio.create_task(engine_with(ledger, store, extra=extra).run(plan))
    await crashed.wait()
    for _ in range(rng.randrange(0, 4)):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await store.aclose()
    async with SqliteStateStore(path) as fresh:
        state = await fresh.load(plan.id)
        assert state is not None
        assert state.status is PlanStatus.COMPENSATING, state.status
        result = await engine_with(ledger, fresh, extra=extra).resume(plan.id)
        assert await fresh.unfinished() == []
    assert result.status is PlanStatus.FAILED
    keys = [f"{plan.id}@1:s{n}" for n in range(8)]
    assert set(ledger.undone) == set(keys)  # every completed step compensated
    assert ledger.undo_order == [f"s{n}" for n in reversed(range(8))]
    assert sum(ledger.undone.values()) - len(keys) <= 1  # only the one in flight may repeat
    assert all(ledger.effects[k] == 1 for k in keys)
    assert all(result.statuses[f"s{n}"] is StepStatus.COMPENSATED for n in range(8))


async def test_cancel_reaches_a_running_tool_and_compensates() -> None:
    ledger = Ledger()
    store = InMemoryStateStore()
    entered = asyncio.Event()
    seen: list[str] = []

    async def forever(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return {}

    plan = Plan(
        id="cancel-me",
        owner="perception",
        goal="g",
        steps=[
            ToolStep(id="a", tool="effect", compensate="undo"),
            ToolStep(id="b", tool="forever", depends_on=["a"]),
            ToolStep(id="c", tool="effect", depends_on=["b"]),
        ],
    )
    engine = engine_with(ledger, store, extra={"forever": forever})
    task = asyncio.create_task(engine.run(plan))
    await entered.wait()
    await engine.cancel("cancel-me")
    result = await task
    assert seen == ["cancelled"]
    assert result.status is PlanStatus.CANCELLED
    assert result.statuses == {
        "a": StepStatus.COMPENSATED,
        "b": StepStatus.CANCELLED,
        "c": StepStatus.SKIPPED,
    }
    assert ledger.undo_order == ["a"]
    state = await store.load("cancel-me")
    assert state is not None
    assert state.status is PlanStatus.CANCELLED
    assert state.cancel_requested
    with pytest.raises(PlanControlError, match="already cancelled"):
        await engine.cancel("cancel-me")


async def test_cancel_of_a_paused_plan_compensates_it() -> None:
    ledger = Ledger()
    store = InMemoryStateStore()
    release = asyncio.Event()

    async def slow(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await release.wait()
        return await ledger.effect(input, ctx)

    plan = Plan(
        id="later",
        owner="perception",
        goal="g",
        steps=[
            ToolStep(id="a", tool="effect", compensate="undo"),
            ToolStep(id="b", tool="slow", depends_on=["a"], compensate="undo"),
            ToolStep(id="c", tool="effect", depends_on=["b"], compensate="undo"),
        ],
    )
    engine = engine_with(ledger, store, extra={"slow": slow})
    events: list[StepEvent] = []
    task = asyncio.create_task(engine.run(plan, on_event=events.append))
    await wait_for(events, StepStatus.SUCCEEDED)  # "a" done, "b" waiting on the event
    await engine.pause("later")
    release.set()
    assert (await task).status is PlanStatus.PAUSED
    await engine.cancel("later")  # not running here: cancelled and compensated now
    state = await store.load("later")
    assert state is not None
    assert state.status is PlanStatus.CANCELLED
    assert ledger.undo_order == ["b", "a"]
    assert "later@1:c" not in ledger.effects


class _HeldStore(InMemoryStateStore):
    """An in-memory store whose commits wait until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def commit(self, records: Sequence[Record]) -> None:
        await self.release.wait()
        await super().commit(records)


class _IdempotentRunner(DictToolRunner):
    def __init__(self, idempotent: set[str], tools: dict[str, Any]) -> None:
        super().__init__(tools)
        self.idempotent = idempotent

    def is_idempotent(self, name: str) -> bool:
        return name in self.idempotent


@pytest.mark.parametrize(
    ("idempotent", "budget", "waits"),
    [(True, False, False), (False, False, True), (True, True, True)],
)
async def test_only_idempotent_steps_of_budgetless_plans_skip_the_intent_wait(
    idempotent: bool, budget: bool, waits: bool
) -> None:
    store = _HeldStore()
    runner = _IdempotentRunner({"noop"} if idempotent else set(), {"noop": noop})
    engine = Engine(tools=runner, agent="perception", store=store)
    plan = Plan(
        id="w1",
        owner="perception",
        goal="wait or not",
        steps=[ToolStep(id="a", tool="noop")],
        budget=Budget(tool_calls=5) if budget else None,
    )
    task = asyncio.create_task(engine.run(plan))
    for _ in range(20):
        await asyncio.sleep(0)
    assert runner.calls == ([] if waits else [("noop", "a", 1)])  # the commit is still held
    store.release.set()
    result = await task
    assert result.status is PlanStatus.SUCCEEDED
    kinds = [type(r).__name__ for r in await store.journal("w1")]
    assert kinds.index("StepIntent") < kinds.index("StepResult")  # the journal order holds
