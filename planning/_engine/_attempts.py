"""Attempts: one step's attempts, each limited in time, traced, and classified.

``_Attempts`` is the one attempt loop (``retry``) and what one attempt of a step is (a tool call
or a dispatch, in its span, under its time limit); ``_StepTries`` is what is recorded around a
step's attempts (intents, breakers, admission, retries), through the run's state.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, assert_never

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Tracer
from pydantic import ValidationError

from stratagem.planning._artifacts._claim import ClaimCheck, claim_output
from stratagem.planning._dispatch import CrossAgentCall, Dispatcher, step_run_id
from stratagem.planning._engine._observe import _fail_span, _Observer
from stratagem.planning._engine._policy import (
    Action,
    FailurePolicy,
    _Admission,
    _Breakers,
    backoff_delay,
)
from stratagem.planning._engine._state import _RunState
from stratagem.planning._engine._types import ToolContext, ToolRunner
from stratagem.planning._engine._watchdog import _Watchdog
from stratagem.planning._errors import (
    LogicError,
    PlanningError,
    StepError,
    failure_class_for_code,
    field_problems,
)
from stratagem.planning._expr import kind_of
from stratagem.planning._kinds import KINDS, attempts_tool
from stratagem.planning._plan import (
    CrossAgentStep,
    FailureClass,
    GateStep,
    LoopStep,
    MapStep,
    Step,
    SubplanStep,
    ToolStep,
)
from stratagem.planning._refs import EXPR_KEY, REF_KEY, has_refs, resolve_refs
from stratagem.planning._store import StepIntent
from stratagem.protocol import RemoteError, capability_for

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class _Outcome:
    """How a step's (or a compensation's) attempts ended."""

    output: dict[str, Any] | None
    failure_class: FailureClass | None
    message: str
    attempts: int
    action: Action = Action.FAIL  # for a failure: what the failure policy decided


_Result = tuple[dict[str, Any] | None, FailureClass | None, str]
"""One attempt's result: ``(output, None, "")`` or ``(None, failure class, message)``."""


class _Tries(Protocol):
    """What the attempt loop (``_Attempts.retry``) attempts: a step, or a step's compensation.

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


class _Attempts:
    """The attempt loop and one attempt of a step.

    Reads the run's outputs (for references) and the observer's ``tracing``; changes nothing of
    the run's state itself: what is recorded around attempts is the ``_Tries``'.
    """

    def __init__(
        self,
        state: _RunState[Any],
        observer: _Observer,
        *,
        tools: ToolRunner,
        dispatcher: Dispatcher | None,
        tracer: Tracer,
        sleep: Callable[[float], Awaitable[object]],
        policy: FailurePolicy,
        agent: str,
        claim_check: ClaimCheck | None = None,
    ) -> None:
        self.state = state
        self.observer = observer
        self.claim_check = claim_check
        self.tools = tools
        self.dispatcher = dispatcher
        self.tracer = tracer
        self.sleep = sleep
        self.policy = policy
        self.agent = agent
        self.watchdog = _Watchdog(state.loop)

    async def retry(self, step: Step, tries: _Tries, attempt: int, first: int) -> _Outcome:
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

    def attempt(self, step: Step, attempt: int, limit_s: float) -> Coroutine[Any, Any, _Result]:
        """One attempt, in its own span: (output, None, "") or (None, class, message).

        A plain function returning the coroutine ``spanned`` runs: one coroutine frame less per
        attempt (the engine's per-step cost is measured).
        """
        # start_span and attach/detach rather than start_as_current_span: the same span made
        # current the same way, without two generator context managers per span.
        plan = self.state.plan
        attributes: dict[str, str | int] = {
            "stratagem.plan.id": plan.id,
            "stratagem.step.id": step.id,
            "stratagem.step.kind": step.kind,
            "stratagem.step.attempt": attempt,
        }
        if attempts_tool(step):
            # The attempt of a tool step is its tool call: one span, with GenAI's execute_tool
            # attributes, rather than a step span and a tool span for the same stretch of time.
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.name"] = step.tool
            attributes["gen_ai.tool.call.id"] = step_run_id(plan.id, plan.revision, step.id)
        return self.spanned(
            f"step {step.id}", attributes, self.attempt_body(step, attempt, limit_s)
        )

    async def spanned(
        self, name: str, attributes: dict[str, str | int], work: Coroutine[Any, Any, _Result]
    ) -> _Result:
        """Await ``work`` (one attempt) in a span of its own, made current meanwhile."""
        span = self.tracer.start_span(
            name,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            output, failure_class, message = await work
            if failure_class is not None:
                _fail_span(span, failure_class, message)
            return output, failure_class, message
        except asyncio.CancelledError:
            _fail_span(span, FailureClass.CANCELLED, "cancelled")
            raise
        finally:
            otel_context.detach(token)
            span.end()

    async def attempt_body(self, step: Step, attempt: int, limit_s: float) -> _Result:
        """One attempt without a span of its own."""
        try:
            match step:
                case ToolStep():
                    # The tool call without a wrapper of its own (the engine's per-step cost is
                    # measured); a reference that does not resolve raises here, in this handler.
                    tool_input = step.input
                    if has_refs(tool_input):
                        tool_input = self._resolved_input(tool_input)
                    output = await self.call_tool(step.id, step.tool, tool_input, attempt, limit_s)
                    return output, None, ""
                case CrossAgentStep():
                    return await self._run_cross_agent(step, attempt, limit_s), None, ""
                case GateStep() | MapStep() | LoopStep() | SubplanStep():
                    # Gates are decided and the others expanded, never attempted: the scheduler
                    # hands them to their parts.
                    raise LogicError(f"step {step.id!r} ({step.kind}) cannot be attempted")
                case _:
                    assert_never(step)
        except asyncio.CancelledError:
            if cancelled_here():
                raise
            # Cancelled work this task did not ask to stop (e.g. a future cancelled elsewhere).
            failure_class, message = FailureClass.CANCELLED, "the step's work was cancelled"
        except Exception as exc:
            failure_class, message = _classify(exc, limit_s)
        logger.debug(
            "plan %s step %s attempt %d: %s: %s",
            self.state.plan.id,
            step.id,
            attempt,
            failure_class.value,
            message,
        )
        return None, failure_class, message

    async def limited(self, work: Awaitable[T], limit_s: float) -> T:
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

    def _resolved_input(self, tool_input: dict[str, Any]) -> dict[str, Any]:
        """A tool step's input with its references resolved (``LogicError`` when it does not
        resolve to an object)."""
        state = self.state
        resolved = resolve_refs(tool_input, state.outputs, state.plan.inputs)
        if not isinstance(resolved, dict):
            raise LogicError(f"the input resolves to {kind_of(resolved)}, not an object")
        return resolved

    async def call_tool(
        self, key: str, tool: str, tool_input: dict[str, Any], attempt: int, limit_s: float
    ) -> dict[str, Any]:
        """Call ``tool`` for the step (or map item) ``key``, under ``limit_s``."""
        plan = self.state.plan
        ctx = ToolContext(plan.id, key, attempt, self.agent, plan.revision)
        try:
            # ``limited``'s time limit, inline: one coroutine less per tool call.
            task = asyncio.current_task()
            assert task is not None  # always inside a step task
            deadline = self.watchdog.arm(task, limit_s)
            try:
                output = await self.tools.run_tool(tool, tool_input, ctx)
            except asyncio.CancelledError:
                if deadline.expired and task.uncancel() <= deadline.cancelling:
                    raise TimeoutError from None
                raise
            else:
                if deadline.expired:  # the tool swallowed the expiry's cancellation
                    task.uncancel()
            finally:
                self.watchdog.disarm(deadline)
        except Exception as exc:
            if self.observer.tracing:
                # On the attempt's span (current here), as start_as_current_span would record it.
                trace.get_current_span().record_exception(exc)
            raise
        if not isinstance(output, dict):
            raise LogicError(f"tool {tool!r} returned {kind_of(output)}, not a dict")
        if self.claim_check is not None and key in self.state.steps:  # a step's, not an item's
            return await claim_output(
                self.claim_check,
                output,
                agent=self.agent,
                plan_id=plan.id,
                revision=plan.revision,
                step_id=key,
                attempt=attempt,
            )
        return output

    def _run_cross_agent(
        self, step: CrossAgentStep, attempt: int, limit_s: float
    ) -> Coroutine[Any, Any, dict[str, Any]]:
        return self.call_agent(
            step.id, step.target, step.capability, step.request, attempt, limit_s
        )

    async def call_agent(
        self,
        key: str,
        target: str,
        capability: str,
        template: dict[str, Any],
        attempt: int,
        limit_s: float,
        bound: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Send the request ``template`` resolves to (``bound``: a map's item) to ``target``'s
        ``capability`` for the step (or map item) ``key``, under ``limit_s``."""
        plan = self.state.plan
        spec = capability_for(target, capability)
        if spec is None:
            raise LogicError(f"the {target} agent does not serve {capability!r}")
        dispatcher = self.dispatcher
        if dispatcher is None:
            raise LogicError(f"the {self.agent} agent's engine has no dispatcher")
        data = resolve_refs(template, self.state.outputs, plan.inputs, bound)
        if not isinstance(data, dict):
            raise LogicError(f"the request resolves to {kind_of(data)}, not an object")
        try:
            request = spec.request.model_validate(data)
        except ValidationError as exc:
            empty = _empty_refs(template, data)
            rest = [p for p in field_problems(exc) if p.split(":")[0].split(".")[0] not in empty]
            problems = "; ".join([*empty.values(), *rest])
            raise LogicError(f"invalid {spec.name} request: {problems}") from exc
        call = CrossAgentCall(
            target=target,
            capability=capability,
            request=request,
            plan_id=plan.id,
            step_id=key,
            request_id=step_run_id(plan.id, plan.revision, key),
            timeout_s=limit_s,
            attempt=attempt,
            caller=self.agent,
        )
        response = await self.limited(dispatcher.dispatch(call), limit_s)
        if not isinstance(response, spec.response):
            raise LogicError(
                f"the {target} agent answered {spec.name} with "
                f"{type(response).__name__}, not {spec.response.__name__}"
            )
        return response.model_dump(mode="json")


class _StepRunner:
    """Starts a step's attempts: what ``_StepTries`` share for one run (the admission, the
    breakers, the seed and time limit, and which steps need their intent committed first)."""

    def __init__(
        self,
        state: _RunState[Any],
        attempts: _Attempts,
        admission: _Admission,
        breakers: _Breakers,
        *,
        seed: int,
        default_timeout: float,
    ) -> None:
        self.state = state
        self.attempts = attempts
        self.admission = admission
        self.breakers = breakers
        self.policy = attempts.policy
        self.tools = attempts.tools
        self.seed = seed
        self.default_timeout = default_timeout
        # A resumed run's attempts do not count failures on the breakers (set by its restore).
        self.resumed = False
        # A completed future that stands for "no wait", and the steps that need not wait for
        # their intent's commit (see needs_durable_intent): found once per run from the table's
        # rows, rather than asked per step started; none without a store, or with a budget.
        self.no_wait: asyncio.Future[None] = state.loop.create_future()
        self.no_wait.set_result(None)
        self.no_wait_steps = (
            frozenset()
            if state.journal is None or admission.budget is not None
            else _idempotent_steps(state.plan.steps, self.tools)
        )

    def needs_durable_intent(self, step: Step) -> bool:
        """Whether ``step`` must wait for its intent's commit before its side effect starts.

        An idempotent step (a cross-agent step, or a tool the runner's ``is_idempotent`` names)
        of a plan without a budget need not: its intent still precedes its result in the
        journal, and if a crash loses the intent the step looks never started (or in flight) and
        is simply run again, which idempotency makes safe. A budget's reservations must be
        durable before the calls they pay for, so a plan with a budget always waits.
        """
        return self.admission.budget is not None or step.id not in self.no_wait_steps

    def intent(
        self, step: Step, attempt: int, cost: float | None, key: str = ""
    ) -> asyncio.Future[None] | None:
        """Journal the intent of attempt ``attempt`` (of ``step``, or of its map item ``key``):
        what to await before it starts."""
        journal = self.state.journal
        if journal is None:
            return None
        plan = self.state.plan
        durable = journal.add(StepIntent(plan.id, plan.revision, key or step.id, attempt, cost))
        if not self.needs_durable_intent(step):
            return self.no_wait
        return durable

    def run(self, step: Step, attempt: int, cost: float | None) -> Coroutine[Any, Any, _Outcome]:
        """Journal the intent of attempt ``attempt`` of ``step`` (``cost``: what admission
        reserved for it), and attempt ``step`` from it."""
        journal = self.state.journal
        durable = None
        if journal is not None:  # ``intent``, inline: a call less per step
            plan = self.state.plan
            durable = journal.add(StepIntent(plan.id, plan.revision, step.id, attempt, cost))
            if step.id in self.no_wait_steps:  # needs_durable_intent, inline
                durable = self.no_wait
        return self.attempts.retry(step, _StepTries(self, step, durable), attempt, 1)


def _idempotent_steps(steps: Sequence[Step], tools: ToolRunner) -> frozenset[str]:
    """The steps running twice is the same as running once (``step_is_idempotent``'s rule: a
    step that calls no tool, or whose tool the runner says is idempotent), each tool asked once."""
    answers: dict[str, bool] = {}
    found = []
    for step in steps:
        tool = KINDS[step.kind].tool(step)
        if tool is not None:
            idempotent = answers.get(tool)
            if idempotent is None:
                idempotent = answers[tool] = tools.is_idempotent(tool)
            if not idempotent:
                continue
        found.append(step.id)
    return frozenset(found)


class _StepTries:
    """A step's attempts: its intents, spans, circuit breaker, retries and admission."""

    __slots__ = ("durable", "limit", "once", "runner", "step")

    def __init__(
        self, runner: _StepRunner, step: Step, durable: asyncio.Future[None] | None
    ) -> None:
        self.runner = runner
        self.step = step
        self.durable = durable  # the first attempt's intent, added by the scheduler
        self.limit = step.timeout_s or runner.default_timeout
        attempts = runner.attempts
        self.once = attempts.attempt if attempts.observer.tracing else attempts.attempt_body

    def begin(self, attempt: int) -> Awaitable[None] | None:
        journal = self.runner.state.journal
        if journal is None:
            return None
        # The intent is durable before the side effect starts (for an idempotent step,
        # ``durable`` is ``no_wait``: see needs_durable_intent).
        durable = self.durable
        if durable is None:
            plan = self.runner.state.plan
            durable = journal.add(StepIntent(plan.id, plan.revision, self.step.id, attempt))
        self.durable = None
        if durable is self.runner.no_wait and journal.error is None:
            return None  # nothing to wait for, and no store failure to raise
        return self._committed(durable)

    async def _committed(self, durable: asyncio.Future[None]) -> None:
        await durable
        journal = self.runner.state.journal
        if journal is not None and journal.error is not None:
            raise journal.error

    def after(self, attempt: int, failure_class: FailureClass | None) -> Awaitable[None] | None:
        step, breakers = self.step, self.runner.breakers
        # A success with no breaker open or counting asks nothing of the table (per step).
        if (failure_class is not None or breakers.states) and attempts_tool(step):
            return breakers.record(step.tool, failure_class, resumed=self.runner.resumed)
        return None

    def retrying(
        self, attempt: int, failure_class: FailureClass, message: str, delay: float
    ) -> None:
        self.runner.state.retrying(self.step.id, attempt, failure_class, message, delay)

    def advance(self, attempt: int) -> _Outcome | None:
        runner, step = self.runner, self.step
        cost = None
        admission = runner.admission
        if admission.budget is not None or runner.breakers.states:
            denial, exhausted, cost = admission.admit(step)
            if denial:
                action = runner.policy.after_denial(step, exhausted)
                return _Outcome(None, FailureClass.POLICY, denial, attempt - 1, action)
        runner.state.start(step.id, attempt)
        self.durable = runner.intent(step, attempt, cost)
        return None

    def seed(self) -> str:
        plan = self.runner.state.plan
        return f"{self.runner.seed}:{step_run_id(plan.id, plan.revision, self.step.id)}"


def cancelled_here() -> bool:
    """In an ``except CancelledError``: whether the current task was asked to stop (re-raise
    then); otherwise work it awaited was cancelled elsewhere (a failure of class cancelled)."""
    task = asyncio.current_task()
    return task is None or bool(task.cancelling())


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
        if not (isinstance(value, dict) and len(value) == 1):
            continue
        got = resolved.get(name)
        if REF_KEY in value and got in ([], "", {}):
            found[name] = f"{name} is empty: nothing came from {value[REF_KEY]}"
        elif EXPR_KEY in value and got in ([], "", {}, None):  # an expression's "nothing" is null
            found[name] = f"{name} is empty: nothing came from {value[EXPR_KEY]}"
    return found
