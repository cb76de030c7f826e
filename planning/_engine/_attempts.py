"""Attempts: one step's attempts, each limited in time, traced, and classified."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, assert_never

from opentelemetry import context as otel_context
from opentelemetry import trace
from pydantic import ValidationError

from stratagem.planning._dispatch import CrossAgentCall, step_run_id
from stratagem.planning._engine._observe import _fail_span
from stratagem.planning._engine._policy import Action, backoff_delay
from stratagem.planning._engine._restore import _Restore
from stratagem.planning._engine._state import _Outcome
from stratagem.planning._engine._types import ToolContext
from stratagem.planning._errors import (
    LogicError,
    PlanningError,
    StepError,
    failure_class_for_code,
    field_problems,
)
from stratagem.planning._plan import (
    CrossAgentStep,
    FailureClass,
    GateStep,
    Plan,
    Step,
    StepStatus,
    ToolStep,
)
from stratagem.planning._refs import has_refs, kind_of, resolve_refs
from stratagem.planning._store import StepIntent, StepResult
from stratagem.protocol import RemoteError, capability_for

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Plan)
T = TypeVar("T")

_Result = tuple[dict[str, Any] | None, FailureClass | None, str]
"""One attempt's result: ``(output, None, "")`` or ``(None, failure class, message)``."""


class _Tries(Protocol):
    """What the attempt loop (``_Attempts._retry``) attempts: a step, or a step's compensation.

    The loop owns the order and the decisions (the failure policy, the backoff, the sleep); an
    implementation says what one attempt is and what is recorded around it.
    """

    def begin(self, attempt: int) -> Awaitable[None] | None:
        """Before attempt ``attempt``: what to await first (``None``: nothing)."""
        ...

    limit: float
    """The time limit of one attempt, in seconds."""

    @property
    def once(self) -> Callable[[Step, int, float], Awaitable[_Result]]:
        """One attempt: ``once(step, attempt, limit)``."""
        ...

    def after(self, attempt: int, failure_class: FailureClass | None) -> Awaitable[None] | None:
        """Attempt ``attempt`` ended (``failure_class`` None: it succeeded): what to await."""
        ...

    def retrying(
        self, attempt: int, failure_class: FailureClass, message: str, delay: float
    ) -> None:
        """Attempt ``attempt`` failed and is retried after ``delay`` seconds."""
        ...

    def advance(self, attempt: int) -> _Outcome | None:
        """The backoff is over: start attempt ``attempt``, or end with the returned outcome."""
        ...

    def seed(self) -> str:
        """Seeds the backoff jitter of these attempts."""
        ...


class _Attempts(_Restore[P]):
    async def _retry(self, step: Step, tries: _Tries, attempt: int, first: int) -> _Outcome:
        """Attempt until success, a failure the policy does not retry, or cancellation.

        ``attempt`` is the first attempt's number; ``first`` the attempt the step's retry limit
        counts from (a step counts all its attempts; a compensation its own, from its first).
        """
        policy = self.policy
        rng: random.Random | None = None
        while True:
            waiting = tries.begin(attempt)
            if waiting is not None:
                await waiting
            output, failure_class, message = await tries.once(step, attempt, tries.limit)
            waiting = tries.after(attempt, failure_class)
            if waiting is not None:
                await waiting
            if failure_class is None:
                return _Outcome(output, None, "", attempt)
            count = attempt - first + 1
            action = policy.after_attempt(step, failure_class, count)
            if action is not Action.RETRY:
                return _Outcome(None, failure_class, message, attempt, action)
            if rng is None:
                rng = random.Random(tries.seed())
            delay = backoff_delay(step.retry, count, rng)
            tries.retrying(attempt, failure_class, message, delay)
            await self.sleep(delay)
            attempt += 1
            stopped = tries.advance(attempt)
            if stopped is not None:
                return stopped

    async def _attempt(self, step: Step, attempt: int, limit_s: float) -> _Result:
        """One attempt, in its own span: (output, None, "") or (None, class, message)."""
        # start_span and attach/detach rather than start_as_current_span: the same span made
        # current the same way, without two generator context managers per span.
        attributes: dict[str, str | int] = {
            "stratagem.plan.id": self.plan.id,
            "stratagem.step.id": step.id,
            "stratagem.step.kind": step.kind,
            "stratagem.step.attempt": attempt,
        }
        if isinstance(step, ToolStep):
            # The attempt of a tool step is its tool call: one span, with GenAI's execute_tool
            # attributes, rather than a step span and a tool span for the same stretch of time.
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.name"] = step.tool
            attributes["gen_ai.tool.call.id"] = step_run_id(
                self.plan.id, self.plan.revision, step.id
            )
        span = self.tracer.start_span(
            f"step {step.id}",
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            output, failure_class, message = await self._attempt_body(step, attempt, limit_s)
            if failure_class is not None:
                _fail_span(span, failure_class, message)
            return output, failure_class, message
        except asyncio.CancelledError:
            _fail_span(span, FailureClass.CANCELLED, "cancelled")
            raise
        finally:
            otel_context.detach(token)
            span.end()

    async def _attempt_body(self, step: Step, attempt: int, limit_s: float) -> _Result:
        """One attempt without a span of its own."""
        try:
            match step:
                case ToolStep():
                    return await self._run_tool(step, attempt, limit_s), None, ""
                case CrossAgentStep():
                    return await self._run_cross_agent(step, attempt, limit_s), None, ""
                case GateStep():  # gates are decided, never run; the scheduler keeps them apart
                    raise LogicError(f"gate {step.id!r} cannot be run as a task")
                case _:
                    assert_never(step)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            # Cancelled work this task did not ask to stop (e.g. a future cancelled elsewhere).
            failure_class, message = FailureClass.CANCELLED, "the step's work was cancelled"
        except Exception as exc:
            failure_class, message = _classify(exc, limit_s)
        logger.debug(
            "plan %s step %s attempt %d: %s: %s",
            self.plan.id,
            step.id,
            attempt,
            failure_class.value,
            message,
        )
        return None, failure_class, message

    async def _limited(self, work: Awaitable[T], limit_s: float) -> T:
        """Await ``work``, raising ``TimeoutError`` when it takes longer than ``limit_s``.

        The semantics of ``asyncio.timeout`` (the expiry cancels the task, the cancellation
        becomes ``TimeoutError``, a cancellation from elsewhere still propagates), but with the
        run's one shared timer instead of a timer per attempt.
        """
        task = asyncio.current_task()
        assert task is not None  # always inside a step task
        deadline = self.watchdog.arm(task, limit_s)
        try:
            result = await work
        except asyncio.CancelledError:
            if deadline.expired and task.uncancel() <= deadline.cancelling:
                raise TimeoutError from None
            raise
        else:
            if deadline.expired:  # the work swallowed the expiry's cancellation
                task.uncancel()
            return result
        finally:
            self.watchdog.disarm(deadline)

    async def _run_tool(self, step: ToolStep, attempt: int, limit_s: float) -> dict[str, Any]:
        tool_input = step.input
        if has_refs(tool_input):
            tool_input = resolve_refs(tool_input, self.outputs)
            if not isinstance(tool_input, dict):
                raise LogicError(f"the input resolves to {kind_of(tool_input)}, not an object")
        ctx = ToolContext(self.plan.id, step.id, attempt, self.agent, self.plan.revision)
        try:
            output = await self._limited(self.tools.run_tool(step.tool, tool_input, ctx), limit_s)
        except Exception as exc:
            if self.tracing:
                # On the attempt's span (current here), as start_as_current_span would record it.
                trace.get_current_span().record_exception(exc)
            raise
        if not isinstance(output, dict):
            raise LogicError(f"tool {step.tool!r} returned {kind_of(output)}, not a dict")
        return output

    async def _run_cross_agent(
        self, step: CrossAgentStep, attempt: int, limit_s: float
    ) -> dict[str, Any]:
        spec = capability_for(step.target, step.capability)
        if spec is None:
            raise LogicError(f"the {step.target} agent does not serve {step.capability!r}")
        dispatcher = self.dispatcher
        if dispatcher is None:
            raise LogicError(f"the {self.agent} agent's engine has no dispatcher")
        data = resolve_refs(step.request, self.outputs)
        if not isinstance(data, dict):
            raise LogicError(f"the request resolves to {kind_of(data)}, not an object")
        try:
            request = spec.request.model_validate(data)
        except ValidationError as exc:
            empty = _empty_refs(step.request, data)
            rest = [p for p in field_problems(exc) if p.split(":")[0].split(".")[0] not in empty]
            problems = "; ".join([*empty.values(), *rest])
            raise LogicError(f"invalid {spec.name} request: {problems}") from exc
        call = CrossAgentCall(
            target=step.target,
            capability=step.capability,
            request=request,
            plan_id=self.plan.id,
            step_id=step.id,
            request_id=step_run_id(self.plan.id, self.plan.revision, step.id),
            timeout_s=limit_s,
            attempt=attempt,
            caller=self.agent,
        )
        response = await self._limited(dispatcher.dispatch(call), limit_s)
        if not isinstance(response, spec.response):
            raise LogicError(
                f"the {step.target} agent answered {spec.name} with "
                f"{type(response).__name__}, not {spec.response.__name__}"
            )
        return response.model_dump(mode="json")


class _StepTries:
    """A step's attempts: its intents, spans, circuit breaker, retries and admission."""

    __slots__ = ("durable", "limit", "once", "run", "step")

    def __init__(
        self, run: _Attempts[Any], step: Step, durable: asyncio.Future[None] | None
    ) -> None:
        self.run = run
        self.step = step
        self.durable = durable  # the first attempt's intent, added by the scheduler
        self.limit = step.timeout_s or run.default_timeout
        self.once = run._attempt if run.tracing else run._attempt_body

    def begin(self, attempt: int) -> Awaitable[None] | None:
        journal = self.run.journal
        if journal is None:
            return None
        # The intent is durable before the side effect starts (for an idempotent step,
        # ``durable`` is ``no_wait``: see _needs_durable_intent).
        durable = self.durable
        if durable is None:
            plan = self.run.plan
            durable = journal.add(StepIntent(plan.id, plan.revision, self.step.id, attempt))
        self.durable = None
        return self._committed(durable)

    async def _committed(self, durable: asyncio.Future[None]) -> None:
        await durable
        journal = self.run.journal
        if journal is not None and journal.error is not None:
            raise journal.error

    def after(self, attempt: int, failure_class: FailureClass | None) -> Awaitable[None] | None:
        step, breakers = self.step, self.run.breakers
        if isinstance(step, ToolStep) and (failure_class is not None or breakers.states):
            return breakers.record(step.tool, failure_class, resumed=self.run.restored)
        return None

    def retrying(
        self, attempt: int, failure_class: FailureClass, message: str, delay: float
    ) -> None:
        run, step_id = self.run, self.step.id
        plan = run.plan
        run.statuses[step_id] = StepStatus.RETRYING
        run._record(
            StepResult(
                plan.id,
                plan.revision,
                step_id,
                attempt,
                StepStatus.RETRYING,
                failure_class=failure_class,
                message=message,
            )
        )
        run._emit(
            step_id,
            StepStatus.RETRYING,
            attempt,
            failure_class,
            f"{message}; retrying in {delay:.3f}s",
            delay,
        )

    def advance(self, attempt: int) -> _Outcome | None:
        run, step = self.run, self.step
        cost = None
        admission = run.admission
        if admission.budget is not None or run.breakers.states:
            denial, exhausted, cost = admission.admit(step)
            if denial:
                action = run.policy.after_denial(step, exhausted)
                return _Outcome(None, FailureClass.POLICY, denial, attempt - 1, action)
        run.attempts[step.id] = attempt
        run.statuses[step.id] = StepStatus.RUNNING
        run._emit(step.id, StepStatus.RUNNING, attempt)
        journal = run.journal
        if journal is not None:
            plan = run.plan
            self.durable = journal.add(StepIntent(plan.id, plan.revision, step.id, attempt, cost))
            if not run._needs_durable_intent(step):
                self.durable = run.no_wait
        return None

    def seed(self) -> str:
        plan = self.run.plan
        return f"{self.run.seed}:{step_run_id(plan.id, plan.revision, self.step.id)}"


def _classify(exc: Exception, timeout: float) -> tuple[FailureClass, str]:
    """The failure class and one-line message of an exception out of a step attempt."""
    if isinstance(exc, StepError):
        return exc.failure_class, exc.message
    if isinstance(exc, RemoteError):
        return failure_class_for_code(exc.code), str(exc)
    if isinstance(exc, TimeoutError):
        detail = str(exc)
        return FailureClass.TIMEOUT, (
            f"TimeoutError: {detail}" if detail else f"timed out after {timeout:g}s"
        )
    if isinstance(exc, PlanningError):
        return FailureClass.LOGIC, str(exc)
    if isinstance(exc, ValidationError):
        return FailureClass.LOGIC, f"ValidationError: {'; '.join(field_problems(exc))}"
    return FailureClass.LOGIC, f"{type(exc).__name__}: {exc}"


def _empty_refs(request: dict[str, Any], resolved: dict[str, Any]) -> dict[str, str]:
    """The request's fields that came from a reference and resolved to nothing, each said in
    words ("entity_ids is empty: nothing came from extract.entities[*].id") rather than as the
    model's length rule, since the cause is the step that gave nothing."""
    found: dict[str, str] = {}
    for name, value in request.items():
        if (
            isinstance(value, dict)
            and set(value) == {"$ref"}
            and resolved.get(name) in ([], "", {})
        ):
            found[name] = f"{name} is empty: nothing came from {value['$ref']}"
    return found
