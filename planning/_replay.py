"""Replay: re-run a finished plan from its recorded outputs, with no side effects, and compare.

``replay(store, plan_id)`` reads the journal of the plan's newest revision and runs the revision
again in a fresh engine without a store, whose tool runner and dispatcher are **recorders**: the
k-th call of a step gets the k-th recorded outcome of that step (its output, or its failure raised
with its class), so nothing outside the engine runs. Gate decisions are replayed from the journal.
The engine re-derives every decision, and the report lists where they differ from the recorded
ones.

The **decisions** compared, per step, in plan order:

- ``order``: the step started only after all its dependencies had succeeded (the scheduling
  constraint); checked on the journal (intent order) and on the replay's events.
- ``outcomes``: the sequence of attempt outcomes, ``succeeded`` or a failure class
  (``transient``, ``logic``, ...), which encodes the retry decisions (retried or not, how many
  attempts) and policy-gate holds (``gated``). Attempts interrupted by a crash (an intent without
  a result) are not outcomes.
- ``status``: the step's final status (``succeeded``, ``failed``, ``cancelled``, ``skipped``).
- ``output``: a digest of the step's output, which feeds the references of its dependents (so a
  reference that no longer resolves shows as a changed ``outcomes``/``status`` downstream).

- ``condition``: for a step with a ``when``, whether it held (``true``/``false``): recorded in the
  journal (``ConditionRecord``), re-evaluated by the replay over the served outputs;

- ``expansion``: for a map step, how many items its list had (``MapRecord``), re-evaluated by the
  replay over the served outputs; its items' attempts are served like steps' (by item key);
- ``iterations``: for a loop step, each iteration's outcome (``until`` held, did not, or the
  iteration failed: ``IterationRecord``), re-evaluated by the replay over the iterations' served
  outputs;

and for the plan, ``plan_status``. The nested plans of loop and sub-plan steps replay with their
parent, served from their own journals; their steps' decisions are compared too, each named
``"{step}.{iteration}/{inner step}"`` (``"{step}.N/..."`` for a sub-plan's attempt N), outputs
aside (they show in the decisions of the step that reads them). Backoff delays, timings and
wall-time budgets are not decisions (they depend on the clock); neither is the interleaving of
independent steps. A tool's call costs the cost units its recorded intents reserved, so a
``cost_units`` budget runs out where it did.

The recorders release outcomes in the journal's order, so the engine (deterministic given the
order of completions) reproduces the recorded interleaving, including which independent steps
finished or were cancelled when a failure stopped the plan.

Replaying with ``outputs={step_id: output}`` serves a different output for a step (what if this
tool had answered that?); replaying with ``tools=`` calls a side-effect-free tool runner for tool
steps instead of the recorder (does the new tool version still reach the same decisions?). The
tools' completions then follow their own timing, so under fail-fast an independent step may end
differently than recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from stratagem.planning._dispatch import CrossAgentCall
from stratagem.planning._engine import Engine, EngineConfig, StepEvent, ToolContext, ToolRunner
from stratagem.planning._engine._nested import child_id, nested_plan_id
from stratagem.planning._engine._state import key_owner
from stratagem.planning._errors import PlanControlError, StepError
from stratagem.planning._kinds import attempts_tool, is_decided, runs_items, runs_plans, tool_of
from stratagem.planning._plan import (
    FailureClass,
    LoopStep,
    Plan,
    PlanStatus,
    StepStatus,
    ToolStep,
)
from stratagem.planning._store import (
    ConditionRecord,
    GateDecision,
    GateRecord,
    IterationRecord,
    MapRecord,
    Record,
    StateStore,
    StepIntent,
    StepResult,
    fold,
)
from stratagem.protocol import capability_for

__all__ = ["Divergence", "ReplayReport", "replay"]

logger = logging.getLogger(__name__)

_GATED: Final = "gated"
_CARRIED_GATE: Final = "(a carried gate)"
"""The tool a replay serves a carried gate's recorded result as."""


@dataclass(frozen=True, slots=True)
class Divergence:
    """One decision the replay reached differently.

    Attributes:
        step_id: The step ("" for the plan).
        decision: ``order``, ``outcomes``, ``status``, ``output``, ``condition`` or
            ``plan_status``.
        recorded: The recorded decision.
        replayed: The replay's decision.
    """

    step_id: str
    decision: str
    recorded: str
    replayed: str


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay found.

    Attributes:
        plan_id: The plan.
        revision: The revision replayed (the newest).
        recorded_status: The plan's recorded final status.
        replayed_status: The replay's final status; ``None`` when it did not end in time.
        divergences: The decisions that differ, steps in plan order, the plan's last.
    """

    plan_id: str
    revision: int
    recorded_status: PlanStatus
    replayed_status: PlanStatus | None
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        """Whether any decision differs."""
        return bool(self.divergences)


@dataclass(slots=True)
class _Decisions:
    outcomes: list[str] = field(default_factory=list)
    status: str = StepStatus.SKIPPED.value
    output: str = ""
    order: str = "after its dependencies"
    condition: str = ""  # a condition's decision: "true", "false" ("" when none was decided)
    expansion: str = ""  # a map's: "N items"
    iterations: list[str] = field(default_factory=list)  # a loop's: each iteration's outcome


_DECISIONS: Final = (
    "order",
    "outcomes",
    "status",
    "output",
    "condition",
    "expansion",
    "iterations",
)
_MAP_EVENT: Final = re.compile(r"map over (\d+) item")
_ITERATION_EVENT: Final = re.compile(r"iteration \d+ ended \((\w+)\)")


class _Served:
    """What the recorders serve: per step, the recorded outcomes, released in journal order.

    A call's outcome is released only after every outcome recorded before it, so the replay's
    completions happen in the recorded order and the engine, which is deterministic given that
    order, makes its scheduling and fail-fast choices as it did (an independent step finishes, or
    is cancelled, as it was).
    """

    def __init__(
        self,
        records: list[Record],
        overrides: Mapping[str, dict[str, Any]],
        unserved: Callable[[str], bool],
    ) -> None:
        self.order: list[StepResult] = []
        self.queues: dict[str, deque[int]] = defaultdict(deque)
        decided: set[str] = set()  # steps whose next result a gate decision recorded
        for record in records:
            if isinstance(record, GateRecord):
                if record.decision is GateDecision.APPROVED and record.output_json is not None:
                    decided.add(record.gate_id)
            elif isinstance(record, StepIntent):
                decided.discard(record.step_id)
            elif isinstance(record, StepResult):
                if record.step_id in decided:
                    decided.discard(record.step_id)
                    continue
                if record.status in (StepStatus.CANCELLED, StepStatus.SKIPPED) or unserved(
                    record.step_id
                ):
                    continue
                self.queues[record.step_id].append(len(self.order))
                self.order.append(record)
        self.overrides = overrides
        self.next = 0
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.skipped: set[int] = set()
        self.stuck = False  # the replay reached work the original never finished

    async def serve(self, step_id: str) -> dict[str, Any]:
        queue = self.queues.get(step_id)
        while not queue:  # nothing recorded: the original was cancelled here; wait to be too
            self.stuck = True
            await asyncio.get_running_loop().create_future()
        index = queue.popleft()
        if index != self.next:
            waiter = self.waiters[index] = asyncio.get_running_loop().create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                self.waiters.pop(index, None)
                self.skipped.add(index)
                raise
        self._release(index)
        result = self.order[index]
        if result.status is StepStatus.SUCCEEDED:
            if step_id in self.overrides and not queue:
                return dict(self.overrides[step_id])
            return dict(json.loads(result.output_json or "null") or {})
        raise StepError(result.message, result.failure_class or FailureClass.LOGIC)

    def _release(self, index: int) -> None:
        self.next = index + 1
        while self.next in self.skipped:
            self.next += 1
        waiter = self.waiters.pop(self.next, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _AllServed:
    """The served outcomes of a plan and of its nested plans, each in its own journal's order."""

    def __init__(self) -> None:
        self.plans: dict[str, _Served] = {}

    @property
    def stuck(self) -> bool:
        return any(served.stuck for served in self.plans.values())

    @stuck.setter
    def stuck(self, value: bool) -> None:
        for served in self.plans.values():
            served.stuck = value

    async def serve(self, plan_id: str, step_id: str) -> dict[str, Any]:
        served = self.plans.get(plan_id)
        while served is None:  # a nested plan the original never ran: wait to be cancelled
            self.stuck = True
            await asyncio.get_running_loop().create_future()
        return await served.serve(step_id)


class _RecordingTools:
    """Serves the recorded outcomes (or calls ``tools``); a tool costs what its intents reserved."""

    def __init__(
        self, served: _AllServed, tools: ToolRunner | None, costs: Mapping[str, float]
    ) -> None:
        self.served = served
        self.tools = tools
        self.costs = costs

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if self.tools is not None:
            return await self.tools.run_tool(name, input, ctx)
        return await self.served.serve(ctx.plan_id, ctx.step_id)

    def is_idempotent(self, name: str) -> bool:
        return self.tools is not None and self.tools.is_idempotent(name)

    def cost(self, name: str) -> float:
        if self.tools is not None:
            return self.tools.cost(name)
        return self.costs.get(name, 1.0)


def _recorded_costs(plan: Plan, records: list[Record]) -> dict[str, float]:
    """Tool name -> the cost units its calls reserved, from the intents of the plan's tool steps
    (and maps' items)."""
    tools = {step.id: tool for step in plan.steps if (tool := tool_of(step)) is not None}
    return {
        tools[key_owner(record.step_id)]: record.cost
        for record in records
        if isinstance(record, StepIntent)
        and record.cost is not None
        and key_owner(record.step_id) in tools
    }


class _RecordingDispatcher:
    def __init__(self, served: _AllServed) -> None:
        self.served = served

    async def dispatch(self, call: CrossAgentCall) -> Any:
        output = await self.served.serve(call.plan_id, call.step_id)
        spec = capability_for(call.target, call.capability)
        assert spec is not None  # the engine checked it before dispatching
        return spec.response.model_validate(output)


def _digest(output: Any) -> str:
    text = json.dumps(output, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _recorded(plan: Plan, records: list[Record]) -> dict[str, _Decisions]:
    decisions = {step.id: _Decisions() for step in plan.steps}
    loops = {step.id: isinstance(step, LoopStep) for step in plan.steps}
    deps = {step.id: step.depends_on for step in plan.steps}
    succeeded: set[str] = set()
    started: set[str] = set()

    def start(step_id: str) -> None:
        if step_id in started or step_id not in decisions:
            return
        started.add(step_id)
        missing = [dep for dep in deps[step_id] if dep not in succeeded]
        if missing:
            decisions[step_id].order = f"started before {missing[0]!r} succeeded"

    for record in records:
        if isinstance(record, StepIntent):
            start(record.step_id)
        elif isinstance(record, ConditionRecord) and record.step_id in decisions:
            decisions[record.step_id].condition = "true" if record.holds else "false"
        elif isinstance(record, MapRecord) and record.step_id in decisions:
            decisions[record.step_id].expansion = f"{record.items} items"
        elif isinstance(record, IterationRecord) and record.step_id in decisions:
            if record.outcome == "started":
                start(record.step_id)
            elif loops.get(record.step_id, False):
                decisions[record.step_id].iterations.append(record.outcome)
        elif isinstance(record, StepResult) and record.status is StepStatus.SKIPPED:
            if record.step_id in decisions:
                decisions[record.step_id].status = record.status.value
        elif isinstance(record, StepResult) and record.step_id in decisions:
            start(record.step_id)
            entry = decisions[record.step_id]
            match record.status:
                case StepStatus.SUCCEEDED:
                    entry.outcomes.append(StepStatus.SUCCEEDED.value)
                    entry.output = _digest(json.loads(record.output_json or "null"))
                    succeeded.add(record.step_id)
                case StepStatus.BLOCKED:
                    entry.outcomes.append(_GATED)
                case StepStatus.RETRYING | StepStatus.FAILED:
                    failure = record.failure_class or FailureClass.LOGIC
                    entry.outcomes.append(failure.value)
                case _:
                    pass
            entry.status = record.status.value
    return decisions


class _Observer:
    """Collects the replay's decisions from its events and answers its gates."""

    def __init__(self, plan: Plan, records: list[Record], served: _AllServed) -> None:
        self.served = served
        self.decisions = {step.id: _Decisions() for step in plan.steps}
        self.deps = {step.id: step.depends_on for step in plan.steps}
        self.succeeded: set[str] = set()
        self.started: set[str] = set()
        self.gates: dict[str, deque[GateRecord]] = defaultdict(deque)
        for record in records:
            if isinstance(record, GateRecord) and record.decision is not GateDecision.OPEN:
                self.gates[record.gate_id].append(record)
        self.gate_steps = {step.id for step in plan.steps if is_decided(step)}
        self.conditional = {step.id for step in plan.steps if step.when is not None}
        self.engine: Engine | None = None
        self.plan_status = ""  # the final status the replay reached
        self.tasks: list[asyncio.Task[None]] = []

    def __call__(self, event: StepEvent) -> None:
        if not event.step_id:
            if isinstance(event.status, PlanStatus) and event.status.is_final:
                self.plan_status = event.status.value
            return
        if event.step_id not in self.decisions:
            return
        step_id, entry = event.step_id, self.decisions[event.step_id]
        status = event.status
        if status in (StepStatus.RUNNING, StepStatus.BLOCKED) and step_id not in self.started:
            if step_id in self.conditional:
                entry.condition = "true"  # it started: its condition held
            self.started.add(step_id)
            missing = [dep for dep in self.deps[step_id] if dep not in self.succeeded]
            if missing:
                entry.order = f"started before {missing[0]!r} succeeded"
        if status is StepStatus.BLOCKED:
            if step_id not in self.gate_steps:
                entry.outcomes.append(_GATED)
            self._decide(step_id, event.revision)
        elif status is StepStatus.RETRYING or status is StepStatus.FAILED:
            failure = event.failure_class or FailureClass.LOGIC
            entry.outcomes.append(failure.value)
        elif status is StepStatus.SUCCEEDED:
            entry.outcomes.append(StepStatus.SUCCEEDED.value)
            self.succeeded.add(step_id)
        elif status is StepStatus.SKIPPED and event.message.startswith("condition "):
            entry.condition = "false"
        elif status is StepStatus.RUNNING and event.message:
            found = _MAP_EVENT.match(event.message)
            if found is not None:
                entry.expansion = f"{found[1]} items"
            found = _ITERATION_EVENT.match(event.message)
            if found is not None:
                entry.iterations.append(found[1])
        if isinstance(status, StepStatus) and status in (
            StepStatus.SUCCEEDED,
            StepStatus.FAILED,
            StepStatus.CANCELLED,
            StepStatus.SKIPPED,
            StepStatus.BLOCKED,
        ):
            entry.status = status.value

    def _decide(self, gate_id: str, revision: int) -> None:
        queue = self.gates.get(gate_id)
        if not queue or self.engine is None:
            self.served.stuck = True  # no recorded decision: the original ended with it open
            return
        gate = queue.popleft()
        output = None if gate.output_json is None else json.loads(gate.output_json)
        given: dict[str, Any] = {}
        if gate.value_json is not None:
            given["value"] = json.loads(gate.value_json)
        if gate.arguments_json is not None:
            given["arguments"] = json.loads(gate.arguments_json)
        self.tasks.append(
            asyncio.get_running_loop().create_task(
                self.engine.decide(
                    gate.plan_id,
                    gate_id,
                    approve=gate.decision is GateDecision.APPROVED,
                    approver=gate.approver,
                    rationale=gate.rationale,
                    revision=revision,
                    output=output,
                    **given,
                )
            )
        )


async def replay(
    store: StateStore,
    plan_id: str,
    *,
    tools: ToolRunner | None = None,
    outputs: Mapping[str, dict[str, Any]] | None = None,
    plan_type: type[Plan] = Plan,
    timeout_s: float = 30.0,
) -> ReplayReport:
    """Re-run a finished plan's newest revision from its recorded outputs and compare decisions.

    Nothing outside the engine runs: tool steps and cross-agent steps get their recorded outcomes
    (unless ``tools`` is given), gates their recorded decisions. The module docstring defines the
    decisions compared.

    Args:
        store: The store holding the plan.
        plan_id: The plan; it must be finished.
        tools: A tool runner **without side effects** to call for tool steps instead of serving
            the recorded outputs (e.g. a new version of the tools).
        outputs: Step id -> an output to serve instead of the step's recorded one; a step of a
            nested plan is named ``"{step}.{iteration}/{inner step}"`` (``.N`` for a sub-plan's
            attempt N, ``.1`` without a retry).
        plan_type: The class to load the stored plan as.
        timeout_s: The replay's limit; a replay that has not ended by then reports
            ``plan_status`` diverging as ``"stuck"``.

    Returns:
        The report; ``diverged`` is False when every decision matches.

    Raises:
        PlanControlError: When the plan is unknown or not finished.
        StoreError: When the store fails.
    """
    records = await store.journal(plan_id)
    state = await store.load(plan_id)
    if state is None:
        raise PlanControlError(plan_id, f"plan {plan_id!r} is not in the store")
    if not state.status.is_final:
        raise PlanControlError(
            plan_id, f"plan {plan_id!r} is {state.status.value}; only a finished plan replays"
        )
    plan = state.plan(plan_type)
    state = fold(plan_id, state.revision, state.plan_json, records)
    served = _AllServed()
    costs: dict[str, float] = {}
    plans: dict[str, _Replayed] = {}
    await _load(store, plan, records, state.status, "", outputs or {}, tools, served, costs, plans)
    main = plans[plan.id]
    # A gate's result carried into this revision (a replan's, a fork's) was decided elsewhere:
    # it is served like a tool's, as recorded (``_load`` serves it).
    plan = _carried_as_served(plan, _carried_gates(plan, records))
    engine = Engine(
        EngineConfig(
            max_in_flight=plan.max_in_flight or 4,
            default_timeout_s=timeout_s,
            circuit_breaker=None,
            gate_deadlines=False,  # the recorded decisions are given instead
        ),
        tools=_RecordingTools(served, tools, costs),
        dispatcher=_RecordingDispatcher(served),
        agent=plan.owner,
        sleep=_no_sleep,
        nested_events=lambda nested: plans[nested.id].observer if nested.id in plans else None,
    )
    for entry in plans.values():
        entry.observer.engine = engine
    replayed_status: PlanStatus | None = None
    replayed: dict[str, StepStatus] = {}
    replayed_outputs: dict[str, Any] = {}
    run = asyncio.ensure_future(engine.run(plan, on_event=main.observer))
    try:
        if state.status is PlanStatus.CANCELLED:
            await _cancel_when_stuck(engine, plan_id, served, run)
        result = await asyncio.wait_for(run, timeout_s)
        replayed_status, replayed, replayed_outputs = result.status, result.statuses, result.outputs
    except TimeoutError:
        logger.warning("replay of plan %s did not end within %gs", plan_id, timeout_s)
    tasks = [task for entry in plans.values() for task in entry.observer.tasks]
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    divergences = _divergences(
        plans, main, state.status, replayed_status, replayed, replayed_outputs
    )
    for divergence in divergences:
        logger.info(
            "replay of plan %s: step %r %s: recorded %s, replayed %s",
            plan_id,
            divergence.step_id,
            divergence.decision,
            divergence.recorded,
            divergence.replayed,
        )
    return ReplayReport(plan_id, state.revision, state.status, replayed_status, divergences)


def _carried_as_served(plan: Plan, carried: set[str]) -> Plan:
    """``plan`` with each gate step whose result was carried (``carried``) made a tool step that
    replay serves as recorded, like a tool's."""
    if not carried:
        return plan
    return plan.model_copy(
        update={
            "steps": [
                ToolStep(
                    id=step.id,
                    tool=_CARRIED_GATE,
                    depends_on=step.depends_on,
                    when=step.when,
                    runs_on=step.runs_on,
                )
                if step.id in carried
                else step
                for step in plan.steps
            ]
        }
    )


def _divergences(
    plans: dict[str, _Replayed],
    main: _Replayed,
    status: PlanStatus,
    replayed_status: PlanStatus | None,
    replayed: dict[str, StepStatus],
    replayed_outputs: dict[str, Any],
) -> list[Divergence]:
    """Where the replay decided otherwise than the journals recorded (``status``: the plan's
    recorded status; ``replayed_*``: what the replayed run of the main plan gave)."""
    divergences: list[Divergence] = []
    for entry in plans.values():
        theirs_all = entry.observer.decisions
        for step in entry.plan.steps:
            mine, theirs = entry.recorded[step.id], theirs_all[step.id]
            if entry is main and step.id in replayed:
                theirs.status = replayed[step.id].value
                if replayed[step.id] is StepStatus.SUCCEEDED:
                    theirs.output = _digest(replayed_outputs.get(step.id))
            elif entry is not main:
                theirs.output = mine.output  # a nested plan's outputs are compared through its
                # parent's decisions (its until, the sub-plan's output)
            for name in _DECISIONS:
                a, b = getattr(mine, name), getattr(theirs, name)
                if a != b:
                    divergences.append(
                        Divergence(
                            entry.label + step.id,
                            name,
                            ", ".join(a) if isinstance(a, list) else a,
                            ", ".join(b) if isinstance(b, list) else b,
                        )
                    )
        if entry is not main and entry.observer.plan_status != entry.status.value:
            divergences.append(
                Divergence(
                    entry.label.rstrip("/"),
                    "plan_status",
                    entry.status.value,
                    entry.observer.plan_status or "not run",
                )
            )
    if replayed_status is not status:
        shown = "stuck" if replayed_status is None else replayed_status.value
        divergences.append(Divergence("", "plan_status", status.value, shown))
    return divergences


@dataclass(slots=True)
class _Replayed:
    """One plan of a replay (the plan replayed, or one of its nested plans).

    Attributes:
        plan: The plan.
        label: What its steps' divergences are prefixed with ("" for the plan replayed,
            ``"loop.2/"`` for a nested plan).
        status: Its recorded final status.
        recorded: Its recorded decisions by step.
        observer: Collects its replayed decisions.
    """

    plan: Plan
    label: str
    status: PlanStatus
    recorded: dict[str, _Decisions]
    observer: _Observer


async def _load(
    store: StateStore,
    plan: Plan,
    records: list[Record],
    status: PlanStatus,
    label: str,
    overrides: Mapping[str, dict[str, Any]],
    tools: ToolRunner | None,
    served: _AllServed,
    costs: dict[str, float],
    plans: dict[str, _Replayed],
) -> None:
    """Read what the replay of ``plan`` serves and compares, and so for its nested plans."""
    steps = {step.id: step for step in plan.steps}
    # Gates are decided, not served (but for a gate's result carried from another revision or
    # plan, served as recorded); maps, loops and sub-plans are expanded (their items and nested
    # plans are served); with ``tools``, tool steps and maps' tool items call them.
    carried = _carried_gates(plan, records)

    def unserved(key: str) -> bool:
        step = steps.get(key_owner(key))
        if step is None:
            return True
        if is_decided(step):
            return key not in carried
        if runs_plans(step):
            return True
        if runs_items(step):
            return key == step.id or (tools is not None and step.tool is not None)
        return tools is not None and attempts_tool(step)

    served.plans[plan.id] = _Served(records, overrides, unserved)
    costs.update(_recorded_costs(plan, records))
    plans[plan.id] = _Replayed(
        plan, label, status, _recorded(plan, records), _Observer(plan, records, served)
    )
    started: dict[tuple[str, int], int] = {}  # a loop's iteration -> its attempts so far
    for record in records:
        if not isinstance(record, IterationRecord) or record.outcome != "started":
            continue
        iteration = (record.step_id, record.iteration)
        attempt = started[iteration] = started.get(iteration, 0) + 1
        step = steps.get(record.step_id)
        if step is not None and runs_plans(step):
            nested_id = nested_plan_id(plan, step, record.iteration, attempt)
        else:
            nested_id = child_id(plan, record.step_id, record.iteration)
        nested = await store.load(nested_id)
        if nested is None:
            continue
        nested_records = await store.journal(nested_id)
        prefix = f"{record.step_id}.{record.iteration}/"
        if attempt > 1:  # a loop's iteration retried: each attempt's steps named apart
            prefix = f"{record.step_id}.{record.iteration}.a{attempt}/"
        await _load(
            store,
            nested.plan(Plan),
            nested_records,
            nested.status,
            label + prefix,
            {
                key[len(prefix) :]: value
                for key, value in overrides.items()
                if key.startswith(prefix)
            },
            tools,
            served,
            costs,
            plans,
        )


def _carried_gates(plan: Plan, records: list[Record]) -> set[str]:
    """The gate steps whose success the journal records without a decision of its own (their
    result was carried from another revision or plan)."""
    gates = {step.id for step in plan.steps if is_decided(step)}
    decided = {
        r.gate_id
        for r in records
        if isinstance(r, GateRecord) and r.decision is not GateDecision.OPEN
    }
    return {
        r.step_id
        for r in records
        if isinstance(r, StepResult)
        and r.status is StepStatus.SUCCEEDED
        and r.step_id in gates
        and r.step_id not in decided
    }


async def _cancel_when_stuck(
    engine: Engine, plan_id: str, served: _AllServed, run: asyncio.Future[Any]
) -> None:
    """The original was cancelled from outside: cancel once the replay runs out of outcomes."""
    for _ in range(10_000):
        if run.done() or served.stuck:
            break
        await asyncio.sleep(0)
    if not run.done():
        await engine.cancel(plan_id)


async def _no_sleep(delay: float) -> None:
    return None
