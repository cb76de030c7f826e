"""Maps: a step that runs a tool (or sends a request) once per item of a list known at run time.

``_Maps`` evaluates a map step's list, has the state journal it (``MapRecord``) before any item
starts, and runs the items through the one attempt loop (``_Attempts.retry``), at most
``max_parallel`` at once, from a fixed pool of workers: a list of 10,000 items makes 10,000
attempts, not 10,000 tasks. An item is keyed ``f"{step_id}.{index}"``: its intents and results in
the journal, its idempotency key (``ToolContext.call_id``, a request's id), its compensation.
The state records each item's transitions; the outputs are collected in item order.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace

from stratagem.planning._dispatch import step_run_id
from stratagem.planning._engine._attempts import (
    _Attempts,
    _classify,
    _Outcome,
    _Result,
    _StepRunner,
    cancelled_here,
)
from stratagem.planning._engine._observe import _fail_span
from stratagem.planning._engine._policy import Action
from stratagem.planning._engine._state import _map as map_ledger
from stratagem.planning._engine._state import _RunState, expansion_key
from stratagem.planning._errors import ExpressionError, LogicError
from stratagem.planning._expr import expression, kind_of
from stratagem.planning._plan import FailureClass, MapStep, Step, StepStatus
from stratagem.planning._refs import has_refs, resolve_refs
from stratagem.planning._store import MapRecord

logger = logging.getLogger(__name__)

SPANNED_ITEMS: Final = 100
"""The items of one map that get a span of their own (the first ones); the map's span counts the
rest, so a trace stays bounded however long the list."""


def list_digest(values: list[Any]) -> str:
    """A map's list, digested (what ``MapRecord.digest`` holds)."""
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def item_outputs_problem(output: Mapping[str, Any]) -> str:
    """What is wrong with a map's reconcile decision's ``output`` ("" when nothing is): it must
    be ``{"items": {"INDEX": output, ...}}``, each output an object."""
    items = output.get("items")
    if set(output) != {"items"} or not isinstance(items, dict):
        return 'a map\'s reconcile gate takes {"items": {"INDEX": output, ...}}'
    for index, item in items.items():
        if not (isinstance(index, str) and index.isdigit()) or not isinstance(item, dict):
            return f"item {index!r}: give an item's index and its output (an object)"
    return ""


@dataclass(slots=True)
class _Found:
    """What a resumed run found of a map that had started.

    Attributes:
        record: Its journaled list (``None`` when the crash came before it was committed).
        resume_at: Item index -> the attempt it continues at (a retried, interrupted or
            cancelled item).
        failed: An item that had failed for good: ``(index, outcome)``.
    """

    record: MapRecord | None
    resume_at: dict[int, int] = field(default_factory=dict)
    failed: tuple[int, _Outcome] | None = None
    in_flight: frozenset[int] = frozenset()


class _Maps:
    """Runs map steps: their lists, their items' attempts, the fan-in."""

    def __init__(self, state: _RunState[Any], attempts: _Attempts, runner: _StepRunner) -> None:
        self.state = state
        self.attempts = attempts
        self.runner = runner
        self.admission = runner.admission
        self.breakers = runner.breakers
        self.found: dict[str, _Found] = {}  # maps a resumed run found started

    def found_map(
        self,
        step_id: str,
        record: MapRecord | None,
        resume_at: dict[int, int],
        failed: tuple[int, _Outcome] | None,
        in_flight: frozenset[int] = frozenset(),
    ) -> None:
        """A resumed run finds map ``step_id`` started (its items' results are in the state;
        ``in_flight``: items whose attempt has no result)."""
        self.found[step_id] = _Found(record, resume_at, failed, in_flight)

    def reconciled(self, step_id: str, output: Mapping[str, Any]) -> None:
        """A reconcile decision on map ``step_id`` says which items in flight did happen, with
        their outputs (``{"items": {"INDEX": output}}``): they are recorded done; the other items
        in flight run again."""
        found = self.found.get(step_id)
        items = output.get("items")
        if found is None or not isinstance(items, Mapping):
            return
        for key, item in items.items():
            index = int(key) if isinstance(key, str) and key.isdigit() else -1
            if index not in found.in_flight or not isinstance(item, dict):
                continue  # only an item in flight is settled this way
            attempt = found.resume_at.pop(index, 2) - 1
            text = json.dumps(item) if self.state.journal is not None else None
            map_ledger.item_succeeded(self.state, step_id, index, item, attempt, text)
        found.in_flight = frozenset(i for i in found.in_flight if i in found.resume_at)

    async def run(self, step: MapStep, attempt: int) -> _Outcome:
        """Run map ``step``: its list, then its items; the outcome of the step as a whole."""
        state = self.state
        plan = state.plan
        try:
            # Bounded while it is built: a list of 10^7 items took seconds before it was counted.
            values = expression(step.over).evaluate(
                state.outputs, plan.inputs, max_items=step.max_items
            )
        except ExpressionError as exc:
            return _failed(f"its list cannot be evaluated: {exc}", attempt)
        if not isinstance(values, list):
            return _failed(f"'over' ({step.over}) gave {kind_of(values)}, not a list", attempt)
        if len(values) > step.max_items:
            return _failed(
                f"'over' ({step.over}) gave {len(values)} items, more than max_items "
                f"{step.max_items}",
                attempt,
            )
        digest = list_digest(values)
        found = self.found.pop(step.id, None)
        record = None if found is None else found.record
        if record is not None and (record.items, record.digest) != (len(values), digest):
            return _failed(
                f"its list changed since the map started ({record.items} items then, "
                f"{len(values)} now)",
                attempt,
            )
        items = map_ledger.expanded(state, step.id, values, digest, recorded=record is not None)
        if found is not None and found.failed is not None:
            index, outcome = found.failed
            return _item_failure(index, outcome)
        resume_at = {} if found is None else found.resume_at
        done = items.outputs
        todo = [index for index in range(len(values)) if index not in done]
        if todo:
            tracing = self.attempts.observer.tracing
            span = None
            token = None
            if tracing:
                span = self.attempts.tracer.start_span(
                    f"step {step.id}",
                    attributes={
                        "stratagem.plan.id": plan.id,
                        "stratagem.step.id": step.id,
                        "stratagem.step.kind": step.kind,
                        "stratagem.step.attempt": attempt,
                        "stratagem.map.items": len(values),
                        "stratagem.map.spanned_items": min(len(todo), SPANNED_ITEMS),
                    },
                    record_exception=False,
                    set_status_on_exception=False,
                )
                token = otel_context.attach(trace.set_span_in_context(span))
            try:
                failure = await self._items(step, values, iter(todo), resume_at)
            finally:
                if token is not None:
                    otel_context.detach(token)
            if span is not None:
                if failure is not None and failure.failure_class is not None:
                    _fail_span(span, failure.failure_class, failure.message)
                span.end()
            if failure is not None:
                return failure
        return _Outcome({"items": [done[index] for index in range(len(values))]}, None, "", 1)

    async def _items(
        self,
        step: MapStep,
        values: list[Any],
        todo: Iterator[int],
        resume_at: dict[int, int],
    ) -> _Outcome | None:
        """Run the items ``todo`` names with ``max_parallel`` workers; the first failure, if any
        (the other items are then cancelled)."""
        failures: list[_Outcome] = []
        workers: list[asyncio.Task[None]] = []
        templated = has_refs(step.input) if step.tool is not None else True

        async def work() -> None:
            for index in todo:  # one iterator shared by the workers: each takes the next item
                if failures:
                    return
                tries = _ItemTries(self, step, index, values[index], templated)
                outcome = await tries.run(resume_at.get(index, 1))
                if outcome.failure_class is not None:
                    if not failures:
                        failures.append(_item_failure(index, outcome))
                        current = asyncio.current_task()
                        for worker in workers:
                            if worker is not current:
                                worker.cancel()
                    return

        loop = self.state.loop
        workers.extend(loop.create_task(work()) for _ in range(step.max_parallel))
        try:
            await asyncio.wait(workers)
        except asyncio.CancelledError:
            for worker in workers:
                worker.cancel()
            await asyncio.wait(workers)  # each records its item's cancellation
            raise
        for worker in workers:
            if not worker.cancelled() and worker.exception() is not None:
                exc = worker.exception()
                logger.error("map %s: a worker raised out of the engine", step.id, exc_info=exc)
                return _Outcome(None, FailureClass.LOGIC, f"{type(exc).__name__}: {exc}", 1)
        return failures[0] if failures else None

    async def item_attempt(self, tries: _ItemTries, attempt: int, limit: float) -> _Result:
        """One attempt of an item, in a span of its own for the first ``SPANNED_ITEMS`` items."""
        attempts = self.attempts
        if not attempts.observer.tracing or tries.index >= SPANNED_ITEMS:
            return await self._item_body(tries, attempt, limit)
        step = tries.step
        plan = self.state.plan
        attributes: dict[str, str | int] = {
            "stratagem.plan.id": plan.id,
            "stratagem.step.id": step.id,
            "stratagem.step.kind": step.kind,
            "stratagem.step.attempt": attempt,
            "stratagem.map.index": tries.index,
        }
        if step.tool is not None:
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.name"] = step.tool
            attributes["gen_ai.tool.call.id"] = step_run_id(plan.id, plan.revision, tries.key)
        return await attempts.spanned(
            f"step {tries.key}", attributes, self._item_body(tries, attempt, limit)
        )

    async def _item_body(self, tries: _ItemTries, attempt: int, limit: float) -> _Result:
        step, state, attempts = tries.step, self.state, self.attempts
        try:
            bound = {"item": tries.value, "index": tries.index}
            if step.tool is not None:
                data: Any = step.input
                if tries.templated:
                    data = resolve_refs(data, state.outputs, state.plan.inputs, bound)
                    if not isinstance(data, dict):
                        raise LogicError(f"the input resolves to {kind_of(data)}, not an object")
                output = await attempts.call_tool(tries.key, step.tool, data, attempt, limit)
            else:
                assert step.target is not None  # a map without a tool has both (its model's rule)
                assert step.capability is not None
                output = await attempts.call_agent(
                    tries.key, step.target, step.capability, step.request, attempt, limit, bound
                )
        except asyncio.CancelledError:
            if cancelled_here():
                raise
            return None, FailureClass.CANCELLED, "the item's work was cancelled"
        except Exception as exc:
            return None, *_classify(exc, limit)
        if state.journal is not None:
            try:
                tries.output_json = json.dumps(output)
            except (TypeError, ValueError) as err:
                return None, FailureClass.LOGIC, f"the output is not JSON: {err}"
        return output, None, ""


class _ItemTries:
    """One item's attempts: its intents, circuit breaker, admission and retries (a ``_Tries``)."""

    __slots__ = (
        "attempt",
        "durable",
        "index",
        "key",
        "limit",
        "maps",
        "once",
        "output_json",
        "step",
        "templated",
        "value",
    )

    def __init__(self, maps: _Maps, step: MapStep, index: int, value: Any, templated: bool) -> None:
        self.maps = maps
        self.step = step
        self.index = index
        self.value = value
        self.templated = templated
        self.key = expansion_key(step.id, index)
        self.limit = step.timeout_s or maps.runner.default_timeout
        self.durable: asyncio.Future[None] | None = None
        self.output_json: str | None = None
        self.attempt = 0
        self.once = self._once

    async def run(self, attempt: int) -> _Outcome:
        """The item's attempts from ``attempt``, each transition recorded by the state."""
        maps, state, step = self.maps, self.maps.state, self.step
        denied = self.advance(attempt)
        if denied is not None:
            map_ledger.item_ended(
                state,
                step.id,
                self.index,
                denied.attempts,
                StepStatus.FAILED,
                FailureClass.POLICY,
                denied.message,
            )
            return denied
        try:
            outcome = await maps.attempts.retry(step, self, attempt, 1)
        except asyncio.CancelledError:
            reason = state.stop_reason or "another item of the map failed"
            map_ledger.item_ended(
                state,
                step.id,
                self.index,
                self.attempt,
                StepStatus.CANCELLED,
                FailureClass.CANCELLED,
                reason,
            )
            raise
        if outcome.failure_class is None:
            map_ledger.item_succeeded(
                state, step.id, self.index, outcome.output, outcome.attempts, self.output_json
            )
        else:
            map_ledger.item_ended(
                state,
                step.id,
                self.index,
                outcome.attempts,
                StepStatus.FAILED,
                outcome.failure_class,
                outcome.message,
            )
        return outcome

    def _once(self, step: Step, attempt: int, limit: float) -> Awaitable[_Result]:
        return self.maps.item_attempt(self, attempt, limit)

    def begin(self, attempt: int) -> Awaitable[None] | None:
        durable = self.durable
        self.durable = None
        if durable is None:
            return None
        return self._committed(durable)

    async def _committed(self, durable: asyncio.Future[None]) -> None:
        await durable
        journal = self.maps.state.journal
        if journal is not None and journal.error is not None:
            raise journal.error

    def after(self, attempt: int, failure_class: FailureClass | None) -> Awaitable[None] | None:
        tool, breakers = self.step.tool, self.maps.breakers
        if tool is not None and (failure_class is not None or breakers.states):
            return breakers.record(tool, failure_class)
        return None

    def retrying(
        self, attempt: int, failure_class: FailureClass, message: str, delay: float
    ) -> None:
        map_ledger.item_retrying(
            self.maps.state, self.step.id, self.index, attempt, failure_class, message
        )

    def advance(self, attempt: int) -> _Outcome | None:
        maps, step = self.maps, self.step
        admission = maps.admission
        cost = None
        if admission.budget is not None or maps.breakers.states:
            denial, _exhausted, cost = admission.admit(step, self.key)
            if denial:
                return _Outcome(None, FailureClass.POLICY, denial, attempt - 1, Action.FAIL)
        self.attempt = attempt
        map_ledger.item_started(maps.state, step.id, self.index, attempt)
        self.durable = maps.runner.intent(step, attempt, cost, self.key)
        return None

    def seed(self) -> str:
        plan = self.maps.state.plan
        return f"{self.maps.runner.seed}:{step_run_id(plan.id, plan.revision, self.key)}"


def _failed(reason: str, attempt: int) -> _Outcome:
    return _Outcome(None, FailureClass.LOGIC, reason, attempt)


def _item_failure(index: int, outcome: _Outcome) -> _Outcome:
    """The map's outcome when item ``index`` failed with ``outcome``."""
    assert outcome.failure_class is not None
    return _Outcome(
        None,
        outcome.failure_class,
        f"item {index} failed after {outcome.attempts} attempt(s): {outcome.message}",
        outcome.attempts,
    )
