"""The engine: scheduling, timeouts, retries, failure classes, skipping, cancellation, events."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any

import pytest

from stratagem.planning import (
    Engine,
    EngineConfig,
    FailureClass,
    InMemoryDispatcher,
    LogicError,
    PlanFailedError,
    PlanStatus,
    PlanValidationError,
    PolicyError,
    RetryPolicy,
    StepEvent,
    StepStatus,
    ToolContext,
    TransientError,
)
from stratagem.protocol import (
    AnalyzeNarrativeRequest,
    AnalyzeNarrativeResponse,
    DeadlineExceededError,
    PermissionDeniedError,
    UnavailableError,
    WireModel,
)

from ._support import (
    FAST_RETRY,
    Concurrency,
    DictToolRunner,
    cross_step,
    echo,
    make_plan,
    noop,
    tool_step,
)


class SleepRecorder:
    """A fake ``sleep`` that records the delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def engine_for(
    tools: dict[str, Any],
    *,
    dispatcher: InMemoryDispatcher | None = None,
    sleep: Any = None,
    **config: Any,
) -> tuple[Engine, DictToolRunner]:
    runner = DictToolRunner({"noop": noop, "echo": echo, **tools})
    engine = Engine(
        EngineConfig(**config),
        tools=runner,
        dispatcher=dispatcher,
        agent="perception",
        **({"sleep": sleep} if sleep is not None else {}),
    )
    return engine, runner


def failing(exc: BaseException, times: int = 10**9) -> Any:
    """A tool that raises ``exc`` on its first ``times`` calls, then succeeds."""
    calls = 0

    async def tool(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls <= times:
            raise exc
        return {"calls": calls}

    return tool


# --- scheduling --------------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["plan", "config"])
async def test_in_flight_bound_is_observed(via: str) -> None:
    gauge = Concurrency(hold_s=0.005)
    if via == "plan":
        engine, _ = engine_for({"hold": gauge}, max_in_flight=10)
        plan = make_plan(*(tool_step(f"s{i}", tool="hold") for i in range(20)), max_in_flight=3)
    else:
        engine, _ = engine_for({"hold": gauge}, max_in_flight=3)
        plan = make_plan(*(tool_step(f"s{i}", tool="hold") for i in range(20)))
    result = await engine.run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    assert gauge.max == 3
    assert len(gauge.finished) == 20


async def test_unbounded_independent_steps_all_run_at_once() -> None:
    gauge = Concurrency(hold_s=0.005)
    engine, _ = engine_for({"hold": gauge}, max_in_flight=50)
    await engine.run(make_plan(*(tool_step(f"s{i}", tool="hold") for i in range(20))))
    assert gauge.max == 20


async def test_dependents_start_only_after_their_dependencies() -> None:
    timeline: list[str] = []
    holds = {"a": 0.004, "b": 0.001, "c": 0.006, "d": 0.001, "e": 0.012, "f": 0.001, "g": 0.0}

    async def hold(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        timeline.append(f"start {ctx.step_id}")
        await asyncio.sleep(holds[ctx.step_id])
        timeline.append(f"end {ctx.step_id}")
        return {}

    steps = [
        tool_step("a", tool="hold"),
        tool_step("b", "a", tool="hold"),
        tool_step("c", "a", tool="hold"),
        tool_step("d", "b", "c", tool="hold"),
        tool_step("e", tool="hold"),
        tool_step("f", "e", "d", tool="hold"),
        tool_step("g", "b", tool="hold"),
    ]
    engine, _ = engine_for({"hold": hold}, max_in_flight=4)
    result = await engine.run(make_plan(*steps))
    assert result.status is PlanStatus.SUCCEEDED
    assert len(timeline) == 14
    for step in steps:
        for dep in step.depends_on:
            assert timeline.index(f"end {dep}") < timeline.index(f"start {step.id}")
    # Independent roots start together; g starts as soon as b ends, while c still runs.
    assert timeline[:2] == ["start a", "start e"]
    assert timeline.index("start g") < timeline.index("end c")


async def test_a_dependent_starts_when_its_dependency_finishes_not_its_layer() -> None:
    timeline: list[str] = []

    async def fast(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        timeline.append(f"start {ctx.step_id}")
        await asyncio.sleep(0.001)
        timeline.append(f"end {ctx.step_id}")
        return {}

    async def slow(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        timeline.append(f"start {ctx.step_id}")
        await asyncio.sleep(0.1)
        timeline.append(f"end {ctx.step_id}")
        return {}

    engine, _ = engine_for({"fast": fast, "slow": slow})
    plan = make_plan(
        tool_step("a", tool="fast"), tool_step("b", tool="slow"), tool_step("c", "a", tool="fast")
    )
    await engine.run(plan)
    assert timeline.index("start c") > timeline.index("end a")
    assert timeline.index("end c") < timeline.index("end b")


# --- timeouts, retries and failure classes -----------------------------------------------------


async def test_timeout_fires_is_retried_then_fails() -> None:
    async def sleepy(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(5)
        return {}

    engine, runner = engine_for({"sleepy": sleepy})
    plan = make_plan(tool_step("a", tool="sleepy", timeout_s=0.02, retry=FAST_RETRY))
    events: list[StepEvent] = []
    started = time.monotonic()
    result = await engine.run(plan, on_event=events.append)
    assert time.monotonic() - started < 1.0
    assert result.status is PlanStatus.FAILED
    (failure,) = result.failures
    assert (failure.step_id, failure.failure_class, failure.attempts) == (
        "a",
        FailureClass.TIMEOUT,
        3,
    )
    assert failure.message == "timed out after 0.02s"
    assert [c[2] for c in runner.calls] == [1, 2, 3]
    retrying = [ev for ev in events if ev.status is StepStatus.RETRYING]
    assert [ev.failure_class for ev in retrying] == [FailureClass.TIMEOUT] * 2


async def test_default_timeout_comes_from_the_config() -> None:
    async def sleepy(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(5)
        return {}

    engine, _ = engine_for({"sleepy": sleepy}, default_timeout_s=0.01)
    result = await engine.run(
        make_plan(tool_step("a", tool="sleepy", retry=RetryPolicy(max_attempts=1)))
    )
    assert result.failures[0].message == "timed out after 0.01s"


async def test_a_shorter_deadline_armed_later_fires_first() -> None:
    async def sleeper(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(input["s"])
        return {}

    engine, _ = engine_for({"sleep": sleeper})
    once = RetryPolicy(max_attempts=1)
    plan = make_plan(
        tool_step("long", tool="sleep", input={"s": 0.5}, timeout_s=10, retry=once),
        tool_step("short", tool="sleep", input={"s": 5}, timeout_s=0.02, retry=once),
    )
    started = time.monotonic()
    result = await engine.run(plan)
    assert time.monotonic() - started < 0.4
    assert result.statuses == {"long": StepStatus.CANCELLED, "short": StepStatus.FAILED}
    assert result.failures[0].message == "timed out after 0.02s"


async def test_a_finished_attempt_is_not_cancelled_by_its_old_deadline() -> None:
    async def sleeper(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(input["s"])
        return {"slept": input["s"]}

    engine, _ = engine_for({"sleep": sleeper})
    plan = make_plan(
        tool_step("quick", tool="sleep", input={"s": 0}, timeout_s=0.02),
        tool_step("after", "quick", tool="sleep", input={"s": 0.08}, timeout_s=5),
    )
    result = await engine.run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["after"] == {"slept": 0.08}


async def test_a_finished_attempt_keeps_nothing_alive_under_a_long_limit() -> None:
    # 300 steps in a chain under the default 30 s limit: every deadline is still ahead when its
    # attempt ends. The watchdog must let go of the finished attempts' tasks (each with its
    # coroutine and result) instead of keeping one per step until its deadline passes.
    tasks: list[weakref.ref[asyncio.Task[Any]]] = []
    alive_at_end: list[int] = []

    async def track(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(weakref.ref(task))
        if ctx.step_id == "s299":
            alive_at_end.append(sum(1 for ref in tasks[:-1] if ref() is not None))
        return {}

    engine, _ = engine_for({"track": track})
    steps = [tool_step("s0", tool="track")]
    steps += [tool_step(f"s{i}", f"s{i - 1}", tool="track") for i in range(1, 300)]
    result = await engine.run(make_plan(*steps))
    assert result.status is PlanStatus.SUCCEEDED
    assert len(tasks) == 300
    # Before: all 299 earlier steps' tasks were alive, held by their deadlines' heap entries.
    (alive,) = alive_at_end
    assert alive <= 2


async def test_the_watchdog_drops_finished_entries_and_still_fires_live_ones() -> None:
    from stratagem.planning._engine._watchdog import _Watchdog

    watchdog = _Watchdog(asyncio.get_running_loop())
    sleeper = asyncio.create_task(asyncio.sleep(10))
    live = watchdog.arm(sleeper, 0.05)
    task = asyncio.current_task()
    assert task is not None
    for _ in range(1000):  # attempts that end long before their 30 s limit
        watchdog.disarm(watchdog.arm(task, 30.0))
    assert len(watchdog._heap) <= 2 * 64  # not a thousand entries
    assert live.active
    assert live.task is sleeper
    with pytest.raises(asyncio.CancelledError):
        await sleeper  # the live deadline still fires
    assert live.expired
    watchdog.close()


async def test_a_tool_that_swallows_the_expiry_keeps_its_result() -> None:
    async def stubborn(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return {"gave_up": True}
        return {}

    engine, _ = engine_for({"stubborn": stubborn})
    plan = make_plan(tool_step("a", tool="stubborn", timeout_s=0.01), tool_step("b", "a"))
    result = await engine.run(plan)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["a"] == {"gave_up": True}
    assert result.outputs["b"] == {"step": "b"}


async def test_backoff_grows_exponentially_within_jitter_bounds() -> None:
    sleep = SleepRecorder()
    policy = RetryPolicy(
        max_attempts=5, initial_backoff_s=0.1, max_backoff_s=10.0, multiplier=2.0, jitter=0.2
    )
    engine, _ = engine_for({"flaky": failing(TransientError("down"))}, sleep=sleep)
    events: list[StepEvent] = []
    result = await engine.run(
        make_plan(tool_step("a", tool="flaky", retry=policy)), on_event=events.append
    )
    assert result.failures[0].attempts == 5
    assert len(sleep.delays) == 4
    for n, delay in enumerate(sleep.delays):
        base = 0.1 * 2**n
        assert base * 0.8 <= delay <= base * 1.2
    assert len(set(sleep.delays)) == 4
    # The delays are exposed on the retrying events, and in their messages.
    retrying = [ev for ev in events if ev.status is StepStatus.RETRYING]
    assert [ev.delay_s for ev in retrying] == sleep.delays
    assert [ev.attempt for ev in retrying] == [1, 2, 3, 4]
    assert retrying[0].message == f"down; retrying in {sleep.delays[0]:.3f}s"


async def test_backoff_is_capped() -> None:
    sleep = SleepRecorder()
    policy = RetryPolicy(max_attempts=6, initial_backoff_s=0.1, max_backoff_s=0.3, jitter=0.5)
    engine, _ = engine_for({"flaky": failing(TransientError("down"))}, sleep=sleep)
    await engine.run(make_plan(tool_step("a", tool="flaky", retry=policy)))
    assert len(sleep.delays) == 5
    assert all(0.05 <= d <= 0.3 for d in sleep.delays)
    assert max(sleep.delays[2:]) >= 0.15  # 0.3 * (1 - 0.5)


async def test_backoff_without_jitter_is_exact() -> None:
    sleep = SleepRecorder()
    policy = RetryPolicy(
        max_attempts=4, initial_backoff_s=0.1, max_backoff_s=1, multiplier=3, jitter=0
    )
    engine, _ = engine_for({"flaky": failing(TransientError("down"))}, sleep=sleep)
    await engine.run(make_plan(tool_step("a", tool="flaky", retry=policy)))
    assert sleep.delays == pytest.approx([0.1, 0.3, 0.9])


async def run_delays(seed: int) -> list[float]:
    sleep = SleepRecorder()
    policy = RetryPolicy(max_attempts=4, initial_backoff_s=0.1, max_backoff_s=5.0)
    engine, _ = engine_for(
        {"flaky": failing(TransientError("down"))}, sleep=sleep, seed=seed, circuit_breaker=None
    )  # 9 failures of one tool would open its breaker
    plan = make_plan(*(tool_step(f"s{i}", tool="flaky", retry=policy) for i in range(3)))
    await engine.run(plan)
    return sleep.delays


async def test_backoff_is_deterministic_for_a_seed() -> None:
    first, again, other = await run_delays(7), await run_delays(7), await run_delays(8)
    assert len(first) == 9
    assert sorted(first) == sorted(again)
    assert first == again
    assert first != other


@pytest.mark.parametrize(
    ("exc", "failure_class", "attempts", "message"),
    [
        (TransientError("flaky"), FailureClass.TRANSIENT, 3, "flaky"),
        (LogicError("wrong"), FailureClass.LOGIC, 1, "wrong"),
        (PolicyError("forbidden"), FailureClass.POLICY, 1, "forbidden"),
        (ValueError("boom"), FailureClass.LOGIC, 1, "ValueError: boom"),
        (KeyError("k"), FailureClass.LOGIC, 1, "KeyError: 'k'"),
        (UnavailableError("gone"), FailureClass.TRANSIENT, 3, "UNAVAILABLE: gone"),
        (PermissionDeniedError("no"), FailureClass.POLICY, 1, "PERMISSION_DENIED: no"),
        (DeadlineExceededError("late"), FailureClass.TIMEOUT, 3, "DEADLINE_EXCEEDED: late"),
        (asyncio.CancelledError(), FailureClass.CANCELLED, 1, "the step's work was cancelled"),
    ],
)
async def test_the_failure_class_decides_retries(
    exc: BaseException, failure_class: FailureClass, attempts: int, message: str
) -> None:
    sleep = SleepRecorder()
    engine, runner = engine_for({"bad": failing(exc)}, sleep=sleep)
    result = await engine.run(make_plan(tool_step("a", tool="bad")))
    assert result.status is PlanStatus.FAILED
    (failure,) = result.failures
    assert (failure.failure_class, failure.attempts, failure.message) == (
        failure_class,
        attempts,
        message,
    )
    assert len(runner.calls) == attempts
    assert len(sleep.delays) == attempts - 1
    assert result.statuses == {"a": StepStatus.FAILED}


async def test_transient_failure_then_success() -> None:
    sleep = SleepRecorder()
    engine, _ = engine_for({"flaky": failing(TransientError("down"), times=2)}, sleep=sleep)
    events: list[StepEvent] = []
    result = await engine.run(make_plan(tool_step("a", tool="flaky")), on_event=events.append)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs == {"a": {"calls": 3}}
    assert [(ev.status.value, ev.attempt) for ev in events if ev.step_id] == [
        ("running", 1),
        ("retrying", 1),
        ("running", 2),
        ("retrying", 2),
        ("running", 3),
        ("succeeded", 3),
    ]


async def test_a_tool_returning_a_non_dict_is_a_logic_failure() -> None:
    async def bad(input: dict[str, Any], ctx: ToolContext) -> Any:
        return [1]

    engine, _ = engine_for({"bad": bad})
    result = await engine.run(make_plan(tool_step("a", tool="bad")))
    assert result.failures[0].message == "tool 'bad' returned a list, not a dict"
    assert result.failures[0].failure_class is FailureClass.LOGIC


# --- failure stops the plan --------------------------------------------------------------------


async def test_downstream_steps_are_skipped() -> None:
    engine, runner = engine_for({"bad": failing(LogicError("no"))}, max_in_flight=1)
    plan = make_plan(
        tool_step("a", tool="bad"),
        tool_step("b", "a"),
        tool_step("c", "b"),
        tool_step("d"),
    )
    events: list[StepEvent] = []
    result = await engine.run(plan, on_event=events.append)
    assert result.status is PlanStatus.FAILED
    assert result.statuses == {
        "a": StepStatus.FAILED,
        "b": StepStatus.SKIPPED,
        "c": StepStatus.SKIPPED,
        "d": StepStatus.SKIPPED,
    }
    assert [c[1] for c in runner.calls] == ["a"]
    skipped = {ev.step_id: ev.message for ev in events if ev.status is StepStatus.SKIPPED}
    assert skipped == {
        "b": "dependency 'a' failed",
        "c": "dependency 'b' skipped",
        "d": "the plan stopped after step 'a' failed",
    }
    assert [f.step_id for f in result.failures] == ["a"]
    with pytest.raises(PlanFailedError, match="step 'a' \\(logic, 1 attempt\\(s\\)\\): no"):
        result.raise_for_status()


async def test_a_failure_cancels_running_steps_promptly() -> None:
    interrupted: list[str] = []

    async def forever(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.append(ctx.step_id)
            raise
        return {}

    async def bad(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        raise LogicError("broken")

    engine, _ = engine_for({"forever": forever, "bad": bad})
    plan = make_plan(
        tool_step("slow1", tool="forever"),
        tool_step("slow2", tool="forever"),
        tool_step("bad", tool="bad"),
        tool_step("after", "slow1"),
    )
    events: list[StepEvent] = []
    started = time.monotonic()
    result = await engine.run(plan, on_event=events.append)
    assert time.monotonic() - started < 1.0
    assert sorted(interrupted) == ["slow1", "slow2"]
    assert result.statuses == {
        "slow1": StepStatus.CANCELLED,
        "slow2": StepStatus.CANCELLED,
        "bad": StepStatus.FAILED,
        "after": StepStatus.SKIPPED,
    }
    assert [f.step_id for f in result.failures] == ["bad"]
    cancelled = [ev for ev in events if ev.status is StepStatus.CANCELLED]
    assert {ev.step_id for ev in cancelled} == {"slow1", "slow2"}
    assert all(ev.failure_class is FailureClass.CANCELLED for ev in cancelled)
    assert all(ev.message == "the plan stopped after step 'bad' failed" for ev in cancelled)
    assert events[-1].status is PlanStatus.FAILED


async def test_a_failure_cancels_a_step_waiting_to_retry() -> None:
    async def bad(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        raise LogicError("broken")

    slow_retry = RetryPolicy(initial_backoff_s=30, max_backoff_s=30)
    engine, _ = engine_for({"flaky": failing(TransientError("down")), "bad": bad})
    plan = make_plan(
        tool_step("flaky", tool="flaky", retry=slow_retry), tool_step("bad", tool="bad")
    )
    started = time.monotonic()
    result = await engine.run(plan)
    assert time.monotonic() - started < 1.0
    assert result.statuses == {"flaky": StepStatus.CANCELLED, "bad": StepStatus.FAILED}


async def test_cancelling_the_run_cancels_steps_and_reraises() -> None:
    entered = asyncio.Event()

    async def forever(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        entered.set()
        await asyncio.sleep(30)
        return {}

    engine, _ = engine_for({"forever": forever}, max_in_flight=2)
    plan = make_plan(
        tool_step("a", tool="forever"),
        tool_step("b", tool="forever"),
        tool_step("c", tool="forever"),
        tool_step("d", "a"),
    )
    events: list[StepEvent] = []
    task = asyncio.create_task(engine.run(plan, on_event=events.append))
    await entered.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    final = {ev.step_id: ev.status for ev in events}
    assert final == {
        "": PlanStatus.CANCELLED,
        "a": StepStatus.CANCELLED,
        "b": StepStatus.CANCELLED,
        "c": StepStatus.SKIPPED,
        "d": StepStatus.SKIPPED,
    }
    assert events[-1].step_id == ""
    assert events[-1].status is PlanStatus.CANCELLED
    assert [ev.message for ev in events if ev.step_id == "a"][-1] == "the plan run was cancelled"


async def test_a_timeout_around_the_run_surfaces_as_timeout_error() -> None:
    async def forever(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        await asyncio.sleep(30)
        return {}

    engine, _ = engine_for({"forever": forever})
    events: list[StepEvent] = []
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.02):
            await engine.run(make_plan(tool_step("a", tool="forever")), on_event=events.append)
    assert [ev.status.value for ev in events] == ["running", "running", "cancelled", "cancelled"]


# --- references and cross-agent steps ----------------------------------------------------------


async def test_tool_inputs_resolve_references() -> None:
    async def extract(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"entities": [{"id": "mira"}, {"id": "key"}]}

    engine, _ = engine_for({"extract": extract})
    plan = make_plan(
        tool_step("x", tool="extract"),
        tool_step("y", "x", tool="echo", input={"ids": {"$ref": "x.entities[*].id"}, "n": 2}),
    )
    result = await engine.run(plan)
    assert result.outputs["y"] == {"ids": ["mira", "key"], "n": 2}


async def test_a_bad_reference_fails_the_step_as_logic() -> None:
    engine, _ = engine_for({})
    plan = make_plan(
        tool_step("x"), tool_step("y", "x", tool="echo", input={"v": {"$ref": "x.nope"}})
    )
    result = await engine.run(plan)
    (failure,) = result.failures
    assert failure.failure_class is FailureClass.LOGIC
    assert failure.message == "reference 'x.nope': x has no field 'nope' (fields: step)"


def analyze_dispatcher(**behaviour: Any) -> InMemoryDispatcher:
    dispatcher = InMemoryDispatcher()
    errors: list[BaseException] = list(behaviour.get("errors", []))

    async def analyze(request: WireModel) -> WireModel:
        assert isinstance(request, AnalyzeNarrativeRequest)
        if errors:
            raise errors.pop(0)
        return AnalyzeNarrativeResponse(
            protagonist=request.entities[0].id, themes=["escape"], tension=0.5
        )

    dispatcher.register("strategic", "AnalyzeNarrative", analyze)
    return dispatcher


async def read(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {
        "text": "Mira finds the key.",
        "entities": [{"id": "mira", "name": "Mira", "kind": "character"}],
    }


def analyze_plan() -> Any:
    return make_plan(
        tool_step("read", tool="read"),
        cross_step(
            "analyze",
            "strategic",
            "AnalyzeNarrative",
            {"text": {"$ref": "read.text"}, "entities": {"$ref": "read.entities"}},
            "read",
            timeout_s=2.5,
        ),
        tool_step("use", "analyze", tool="echo", input={"who": {"$ref": "analyze.protagonist"}}),
    )


async def test_cross_agent_step_via_the_in_memory_dispatcher() -> None:
    dispatcher = analyze_dispatcher()
    engine, _ = engine_for({"read": read}, dispatcher=dispatcher)
    result = await engine.run(analyze_plan())
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs["analyze"] == {
        "protagonist": "mira",
        "themes": ["escape"],
        "tension": 0.5,
        "summary": "",
    }
    assert result.outputs["use"] == {"who": "mira"}
    (call,) = dispatcher.calls
    assert (call.target, call.capability, call.plan_id, call.step_id) == (
        "strategic",
        "AnalyzeNarrative",
        "p1",
        "analyze",
    )
    assert (call.request_id, call.attempt, call.timeout_s, call.caller) == (
        "p1@1:analyze",
        1,
        2.5,
        "perception",
    )
    assert call.request == AnalyzeNarrativeRequest.model_validate(
        {
            "text": "Mira finds the key.",
            "entities": [{"id": "mira", "name": "Mira", "kind": "character"}],
        }
    )


async def test_cross_agent_retry_keeps_the_request_id() -> None:
    sleep = SleepRecorder()
    dispatcher = analyze_dispatcher(errors=[UnavailableError("restarting")])
    engine, _ = engine_for({"read": read}, dispatcher=dispatcher, sleep=sleep)
    result = await engine.run(analyze_plan())
    assert result.status is PlanStatus.SUCCEEDED
    assert [(c.request_id, c.attempt) for c in dispatcher.calls] == [
        ("p1@1:analyze", 1),
        ("p1@1:analyze", 2),
    ]
    assert len(sleep.delays) == 1


@pytest.mark.parametrize(
    ("error", "failure_class", "attempts"),
    [
        (PermissionDeniedError("caller may not"), FailureClass.POLICY, 1),
        (DeadlineExceededError("late"), FailureClass.TIMEOUT, 3),
    ],
)
async def test_a_remote_error_code_maps_to_its_class(
    error: BaseException, failure_class: FailureClass, attempts: int
) -> None:
    dispatcher = analyze_dispatcher(errors=[error] * 3)
    engine, _ = engine_for({"read": read}, dispatcher=dispatcher, sleep=SleepRecorder())
    result = await engine.run(analyze_plan())
    (failure,) = result.failures
    assert (failure.step_id, failure.failure_class, failure.attempts) == (
        "analyze",
        failure_class,
        attempts,
    )
    assert failure.message == str(error)
    assert result.statuses["use"] is StepStatus.SKIPPED


async def test_an_unreachable_target_is_transient() -> None:
    engine, _ = engine_for({"read": read}, dispatcher=InMemoryDispatcher(), sleep=SleepRecorder())
    result = await engine.run(analyze_plan())
    (failure,) = result.failures
    assert (failure.failure_class, failure.attempts) == (FailureClass.TRANSIENT, 3)
    assert failure.message == "UNAVAILABLE: agent 'strategic' is not reachable"


async def test_an_invalid_resolved_request_is_a_logic_failure_naming_the_field() -> None:
    async def blank(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"text": "", "entities": [{"id": "Mira", "name": "Mira", "kind": "character"}]}

    dispatcher = analyze_dispatcher()
    engine, _ = engine_for({"read": blank}, dispatcher=dispatcher)
    result = await engine.run(analyze_plan())
    (failure,) = result.failures
    assert failure.failure_class is FailureClass.LOGIC
    # The empty text came from a reference: said as where it came from, not as a length rule.
    assert failure.message == (
        "invalid AnalyzeNarrative request: text is empty: nothing came from read.text; "
        "entities[0].id: String should match pattern '^[a-z][a-z0-9_]{0,63}$'"
    )
    assert dispatcher.calls == []


async def test_cross_agent_step_without_a_dispatcher_fails_as_logic() -> None:
    engine, _ = engine_for({"read": read})
    result = await engine.run(analyze_plan())
    assert result.failures[0].message == "the perception agent's engine has no dispatcher"


# --- events, results and misuse ----------------------------------------------------------------


async def test_events_are_emitted_in_order() -> None:
    engine, _ = engine_for({}, max_in_flight=1)
    events: list[StepEvent] = []
    plan = make_plan(tool_step("a"), tool_step("b", "a"), revision=3)
    result = await engine.run(plan, on_event=events.append)
    assert [(ev.step_id, ev.status.value, ev.attempt) for ev in events] == [
        ("", "running", 0),
        ("a", "running", 1),
        ("a", "succeeded", 1),
        ("b", "running", 1),
        ("b", "succeeded", 1),
        ("", "succeeded", 0),
    ]
    assert result.events == 6
    assert {(ev.plan_id, ev.revision) for ev in events} == {("p1", 3)}
    assert [ev.timestamp for ev in events] == sorted(ev.timestamp for ev in events)
    assert events[0].status is PlanStatus.RUNNING
    assert events[1].status is StepStatus.RUNNING


async def test_the_result_carries_statuses_and_leaves_the_plan_alone() -> None:
    engine, runner = engine_for({"bad": failing(LogicError("no"))})
    plan = make_plan(tool_step("a"), tool_step("b", "a", tool="bad"))
    result = await engine.run(plan)
    assert result.submitted is plan
    assert [s.status for s in plan.steps] == [StepStatus.PENDING, StepStatus.PENDING]
    assert [s.status for s in result.plan.steps] == [StepStatus.SUCCEEDED, StepStatus.FAILED]
    assert result.plan.id == plan.id
    assert result.events == 6
    assert result.duration_s > 0
    ctx = runner.contexts[0]
    assert (ctx.plan_id, ctx.step_id, ctx.attempt, ctx.agent, ctx.call_id) == (
        "p1",
        "a",
        1,
        "perception",
        "p1@1:a",
    )


async def test_an_empty_plan_succeeds() -> None:
    engine, _ = engine_for({})
    result = await engine.run(make_plan())
    assert (result.status, result.outputs, result.events) == (PlanStatus.SUCCEEDED, {}, 2)
    result.raise_for_status()


async def test_a_plan_that_is_not_a_dag_is_refused_before_anything_runs() -> None:
    engine, runner = engine_for({})
    events: list[StepEvent] = []
    plan = make_plan(tool_step("a", "b"), tool_step("b", "a"), tool_step("c", "zz"))
    with pytest.raises(PlanValidationError) as info:
        await engine.run(plan, on_event=events.append)
    assert info.value.problems == ["step 'c' depends on unknown step 'zz'", "cycle: a -> b -> a"]
    assert events == []
    assert runner.calls == []


async def test_a_failing_observer_does_not_change_the_run(caplog: pytest.LogCaptureFixture) -> None:
    def observer(event: StepEvent) -> None:
        raise RuntimeError("observer bug")

    engine, _ = engine_for({})
    with caplog.at_level(logging.ERROR, logger="stratagem.planning._engine"):
        result = await engine.run(make_plan(tool_step("a")), on_event=observer)
    assert result.status is PlanStatus.SUCCEEDED
    assert sum("on_event failed" in r.getMessage() for r in caplog.records) == 4


def test_engine_config_is_validated() -> None:
    assert EngineConfig() == EngineConfig(max_in_flight=4, default_timeout_s=30.0, seed=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        EngineConfig(max_in_flight=0)
    with pytest.raises(ValueError, match="default_timeout_s"):
        EngineConfig(default_timeout_s=0)
