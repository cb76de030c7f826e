"""Plan models: steps, retry policies, statuses and failure classes.

A ``Plan`` is an immutable, validated description of work: a DAG of steps, each a ``ToolStep`` (a
tool of the owning agent), a ``CrossAgentStep`` (a typed request to another agent), a ``GateStep``
(the plan waits there for a person's approval), a ``MapStep`` (a tool or a request once per item
of a list known at run time), a ``LoopStep`` (a group of steps repeated until an expression
holds, bounded) or a ``SubplanStep`` (a nested plan of the same agent, which the step waits
for). Steps form a discriminated union on ``kind``; a new kind is one more ``StepBase`` subclass
added to the ``Step`` union, and the exhaustive ``match`` statements on the step type (engine,
validation) point at every place that must learn about it.

Role plan types (``StrategicPlan`` and friends, in ``agents/``) subclass ``Plan`` to add typed
fields.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = [
    "DECIDER_PATTERN",
    "PLAN_ID_PATTERN",
    "STEP_ID_PATTERN",
    "Budget",
    "CrossAgentStep",
    "FailureClass",
    "Fork",
    "GateStep",
    "LoopStep",
    "MapStep",
    "ModelCall",
    "Plan",
    "PlanStatus",
    "Provenance",
    "RetryPolicy",
    "Step",
    "StepBase",
    "StepStatus",
    "SubplanStep",
    "ToolStep",
]

STEP_ID_PATTERN: Final = r"[a-z][a-z0-9_-]{0,63}"
"""A step id: a lowercase slug. No dots or brackets, so ``{"$ref": "STEP_ID.path"}`` parses."""

PLAN_ID_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}"
"""A plan id: the non-empty form of the protocol's plan id."""

DECIDER_PATTERN: Final = r"(role:)?[a-z][a-z0-9_-]{0,63}"
"""Who may decide a gate: an identity (``alice``, ``operator``) or ``role:NAME`` (a role of the
agent's policy, e.g. ``role:leads``)."""

StepId = Annotated[str, StringConstraints(pattern=rf"^{STEP_ID_PATTERN}$")]
Decider = Annotated[str, StringConstraints(pattern=rf"^{DECIDER_PATTERN}$")]
RoleName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
Name = Annotated[str, StringConstraints(min_length=1, max_length=128)]
ExpressionText = Annotated[str, StringConstraints(min_length=1, max_length=2000)]

MAX_MAP_ITEMS: Final = 100_000
"""The most items a map's ``max_items`` may allow."""
MAX_ITERATIONS: Final = 1000
"""The most iterations a loop's ``max_iterations`` may allow."""
MAX_BODY_STEPS: Final = 1000
"""The most steps a loop's or a sub-plan's body may have."""


class StepStatus(StrEnum):
    """Where a step is in its life.

    ``pending`` -> ``running`` -> (``retrying`` -> ``running``)* -> ``succeeded`` | ``failed`` |
    ``cancelled``; a step that never started ends ``skipped``. A gate step (and a step waiting at a
    reconcile gate) is ``blocked`` until decided. When a failed or cancelled plan is compensated, a
    succeeded step with a compensating tool goes ``compensating`` -> ``compensated`` |
    ``compensation_failed``.
    """

    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"


class PlanStatus(StrEnum):
    """Where a plan run is in its life.

    ``pending`` -> ``running`` (<-> ``blocked`` while a gate waits for a decision) -> ``succeeded``,
    or -> (``compensating`` ->) ``failed`` | ``cancelled``. ``paused`` stops a plan between steps
    until it is resumed. ``succeeded``, ``failed`` and ``cancelled`` are final.
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"
    PAUSED = "paused"
    COMPENSATING = "compensating"

    @property
    def is_final(self) -> bool:
        """Whether the plan is over: ``succeeded``, ``failed`` or ``cancelled``."""
        return self in _FINAL_PLAN_STATUSES


_FINAL_PLAN_STATUSES: Final = frozenset(
    {PlanStatus.SUCCEEDED, PlanStatus.FAILED, PlanStatus.CANCELLED}
)


class FailureClass(StrEnum):
    """Why a step attempt failed; the class alone decides whether it is retried.

    Only ``transient`` and ``timeout`` failures are retried.
    """

    TRANSIENT = "transient"
    """The world may change by itself: unavailable target, exhausted resource, internal error."""
    LOGIC = "logic"
    """Retrying the same input gives the same answer: bad input, failed precondition, a bug."""
    POLICY = "policy"
    """A rule forbids it: permission denied, unauthenticated."""
    TIMEOUT = "timeout"
    """The step (or the remote call) ran out of time."""
    CANCELLED = "cancelled"
    """Someone else cancelled the work."""


class RetryPolicy(BaseModel):
    """How often a step is attempted and how long to wait between attempts.

    The delay before attempt ``n + 1`` is ``min(max_backoff_s, initial_backoff_s * multiplier **
    (n - 1))`` scaled by a factor drawn uniformly from ``[1 - jitter, 1 + jitter]``, and never more
    than ``max_backoff_s``.

    Attributes:
        max_attempts: Attempts in total, the first included (1 means never retry).
        initial_backoff_s: The delay after the first failed attempt, before jitter.
        max_backoff_s: The cap on any delay.
        multiplier: Growth of the delay per attempt.
        jitter: The relative spread of the random factor, in ``[0, 1]``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=3, ge=1, le=100)
    initial_backoff_s: float = Field(default=0.05, ge=0.0, le=3600.0)
    max_backoff_s: float = Field(default=2.0, ge=0.0, le=3600.0)
    multiplier: float = Field(default=2.0, ge=1.0, le=10.0)
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _cap_not_below_start(self) -> RetryPolicy:
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("max_backoff_s must not be less than initial_backoff_s")
        return self


_DEFAULT_RETRY: Final = RetryPolicy()
# A loop's or a sub-plan's default: one attempt (its body's steps retry on their own).
_ONE_ATTEMPT: Final = RetryPolicy(max_attempts=1)


class StepBase(BaseModel):
    """Fields every step kind shares. Subclass it (with a ``kind`` literal) to add a kind.

    Attributes:
        kind: The discriminator of the ``Step`` union.
        id: The step's id, unique in its plan; a lowercase slug.
        title: A short human-readable description.
        depends_on: Ids of the steps that must succeed before this one starts.
        timeout_s: The limit on one attempt; ``None`` uses the engine's default.
        retry: The retry policy (only transient and timeout failures are retried).
        status: The step's status; ``pending`` in a submitted plan, set in the plan a run returns.
        compensate: A tool of the owning agent's registry that undoes this step's effect; run when
            the plan fails or is cancelled after this step succeeded. Not allowed on a gate.
        compensate_input: The compensating tool's input; values may be ``{"$ref": ...}``
            references to this step or its dependencies. ``None`` gives the step's own input (a
            cross-agent step's request), references resolved, plus its output under ``"output"``.
        on_policy_failure: What a ``policy`` failure of this step does: ``"abort"`` fails the
            plan; ``"gate"`` holds the plan ``blocked`` at a gate named after the step, whose
            prompt names the failure (approve: re-run the step, or record an output; reject: fail
            it). A budget running out always aborts.
        when: A condition: an expression (``planning._expr``) over the outputs of the step's
            (transitive) dependencies and the plan's inputs; the step runs only when its value is
            truthy, and is ``skipped`` otherwise (the reason and the value journaled). ``None``:
            no condition.
        runs_on: ``"success"`` (every dependency succeeded; the default) or ``"failure"`` (a
            route on failure: at least one dependency failed for good, the others settled; the
            step is ``skipped`` when none failed). A failure that a ``"failure"`` step depends on
            is handled: it does not stop the plan nor fail it.
        priority: Among the steps ready at once, those of higher priority start first when the
            plan's in-flight bound leaves fewer slots than ready steps (ties: plan order).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    id: StepId
    title: str = Field(default="", max_length=200)
    depends_on: list[StepId] = Field(default_factory=list)
    timeout_s: float | None = Field(default=None, gt=0.0)
    retry: RetryPolicy = _DEFAULT_RETRY
    status: StepStatus = StepStatus.PENDING
    compensate: Name | None = None
    compensate_input: dict[str, Any] | None = None
    on_policy_failure: Literal["abort", "gate"] = "abort"
    when: str | None = Field(default=None, min_length=1, max_length=2000)
    runs_on: Literal["success", "failure"] = "success"
    priority: int = Field(default=0, ge=-1000, le=1000)


class ToolStep(StepBase):
    """Call one of the owning agent's tools.

    Attributes:
        tool: The tool's name in the owning agent's registry.
        input: The tool's input; values may be ``{"$expr": "..."}`` expressions or
            ``{"$ref": "STEP_ID.path"}`` references.
    """

    kind: Literal["tool"] = "tool"
    tool: Name
    input: dict[str, Any] = Field(default_factory=dict)


class CrossAgentStep(StepBase):
    """Send a typed request to another agent's capability.

    Attributes:
        target: The role of the agent that serves the capability (never the plan's owner).
        capability: The capability's name, e.g. ``"ExtractEntities"``.
        request: The request's fields; values may be ``{"$ref": "STEP_ID.path"}`` references. It is
            validated against the capability's request model once references are resolved.
    """

    kind: Literal["cross_agent"] = "cross_agent"
    target: RoleName
    capability: Name
    request: dict[str, Any] = Field(default_factory=dict)


class GateStep(StepBase):
    """Wait for a person's decision: the plan is ``blocked`` here until the gate is decided.

    An approval lets the dependents run (the gate's output is ``{"approved": True, "approver": ...,
    "rationale": ...}``, plus ``"value"`` for a gate that asks one); a rejection fails the gate
    with class ``policy``, and so the plan. A decision is bound to the plan revision it was given
    for (``Engine.decide``).

    A gate may **ask**: with ``input_schema`` (a JSON Schema) or ``choices``, an approval carries a
    value that fits it, which later steps read as the gate's ``value`` (``{"$ref": "ask.value"}``).
    It may **time out**: ``timeout_s`` (from its opening; the inherited field) with ``on_timeout``.
    It may say **who decides** (``deciders``: identities, or ``role:NAME`` for the members of a
    role of the agent's policy; empty: whoever the policy lets decide) and **escalate**: after
    ``escalate_after_s`` undecided, the gate passes to ``escalate_to``. A gate is decided, never
    attempted: ``retry`` and ``on_policy_failure`` do not apply to it (``validate_plan`` refuses
    them), nor does the engine's default step time limit (a gate without ``timeout_s`` waits until
    it is decided).

    Attributes:
        prompt: What the approver is asked, e.g. ``"Publish the chapter?"``.
        input_schema: The JSON Schema of the value an approval carries (``None``: no value).
        choices: The values an approval may carry, one of them (``None``: no list).
        deciders: Who may decide: identities, or ``role:NAME``; empty: anyone the policy allows.
        on_timeout: What ``timeout_s`` without a decision does: ``reject`` the gate, ``approve``
            it (a gate that asks nothing), approve it with the ``default`` value, or
            ``escalate`` it to ``escalate_to`` (it then waits for them).
        default: The value ``on_timeout="default"`` approves with (it must fit the gate).
        escalate_after_s: Seconds undecided after which the gate passes to ``escalate_to``.
        escalate_to: Who decides once the gate escalated (same forms as ``deciders``).
    """

    kind: Literal["gate"] = "gate"
    prompt: str = Field(min_length=1, max_length=2000)
    input_schema: dict[str, Any] | None = None
    choices: list[Any] | None = Field(default=None, min_length=1, max_length=100)
    deciders: list[Decider] = Field(default_factory=list, max_length=64)
    on_timeout: Literal["reject", "approve", "default", "escalate"] = "reject"
    default: Any = None
    escalate_after_s: float | None = Field(default=None, gt=0.0)
    escalate_to: list[Decider] = Field(default_factory=list, max_length=64)

    @property
    def asks(self) -> bool:
        """Whether an approval of this gate carries a value (it has a schema or choices)."""
        return self.input_schema is not None or self.choices is not None


class MapStep(StepBase):
    """Run one of the owning agent's tools, or send one cross-agent request, once per item of a
    list known only at run time; the outputs are collected in item order.

    The list is the value of ``over`` (an expression over the step's dependencies and the plan's
    inputs), evaluated when the step starts. Each item is one unit of work with its own attempts
    (``retry``, ``timeout_s``), its own idempotency key (``f"{plan_id}@{revision}:{id}.{index}"``)
    and its own journal records; at most ``max_parallel`` run at once. In ``input`` (or
    ``request``), expressions read the item as ``item`` and its position as ``index``:
    ``{"$expr": "item.url"}``. The step's output is ``{"items": [output, ...]}`` in item order (a
    cross-agent item's output is its response as JSON). The first item that fails for good fails
    the step (the items still running are cancelled); ``compensate`` undoes each item that
    succeeded, newest first, its default input being the item's input plus ``"output"``.

    Attributes:
        over: The expression giving the list.
        max_items: The most items the list may have: a longer list fails the step before any item
            starts (checked before the plan runs when ``over`` reads only the plan's inputs).
        max_parallel: Items running at once.
        tool: The tool run per item (a tool of the owner's registry); or ``target`` and
            ``capability`` for a cross-agent request per item.
        input: The tool's input per item.
        target: The role whose ``capability`` each item asks.
        capability: The capability asked per item.
        request: The request per item.
    """

    kind: Literal["map"] = "map"
    over: ExpressionText
    max_items: int = Field(ge=1, le=MAX_MAP_ITEMS)
    max_parallel: int = Field(default=4, ge=1, le=1000)
    tool: Name | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    target: RoleName | None = None
    capability: Name | None = None
    request: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_kind_of_work(self) -> MapStep:
        if self.tool is not None:
            if self.target is not None or self.capability is not None or self.request:
                raise ValueError("a map runs a tool or sends a request per item, not both")
        elif self.target is None or self.capability is None:
            raise ValueError("a map needs a tool, or a target and a capability")
        elif self.input:
            raise ValueError("a map that sends a request per item has a request, not an input")
        return self


class LoopStep(StepBase):
    """Repeat a group of steps (the body, a nested plan of the same agent) until ``until`` holds.

    Each iteration runs the body as a plan of its own (id ``f"{plan_id}/{id}.{n}"``, with its own
    journal and events); the step waits for it, then evaluates ``until`` over the iteration's
    outputs (the body's step ids) and its ``inputs``. The body reads the values of ``inputs``
    (expressions over the loop's dependencies and the plan's inputs, resolved once) plus
    ``inputs.iteration`` (1, 2, ...) and ``inputs.last`` (the previous iteration's outputs by step
    id; ``null`` in the first). A loop needs a bound: ``max_iterations``, ``timebox_s`` (checked
    before each iteration starts, from the loop's first start) or both. An iteration that fails
    fails the loop. The step's output is ``{"iterations": n, "done": bool, "last": {...}}``.

    ``timeout_s`` is a timebox over the whole step, from its first iteration's start (journaled,
    so it holds across a restart): when it expires, the running iteration is cancelled (its nested
    plan compensates itself) and the step fails with class ``timeout``. ``retry`` (one attempt
    by default) runs a failed iteration again (the same ``inputs.iteration`` and ``inputs.last``)
    after a ``transient`` or ``timeout`` failure: its attempt ``k`` is a new nested plan
    (``f"{plan_id}/{id}.{n}.a{k}"`` from the second), started once the failed one has ended and
    compensated itself; ``max_attempts`` counts per iteration.

    Attributes:
        steps: The body: steps of the same agent, as in a plan (their own ids).
        until: When the loop is done: an expression over the iteration's outputs and ``inputs``;
            ``None`` repeats up to the bound.
        max_iterations: The most iterations.
        timebox_s: No iteration starts this many seconds after the first one started.
        on_exhausted: What reaching the bound before ``until`` held does: ``"fail"`` the step
            (class ``logic``) or ``"succeed"`` with ``done: false``. A loop without ``until``
            always succeeds at its bound.
        inputs: The body's inputs; values may be expressions (``{"$expr": ...}``).
        max_in_flight: The body's in-flight bound (``None``: the engine's).
        on_failure: The body's failure mode.
    """

    kind: Literal["loop"] = "loop"
    retry: RetryPolicy = _ONE_ATTEMPT
    steps: list[Step] = Field(min_length=1, max_length=MAX_BODY_STEPS)
    until: ExpressionText | None = None
    max_iterations: int | None = Field(default=None, ge=1, le=MAX_ITERATIONS)
    timebox_s: float | None = Field(default=None, gt=0.0, le=7 * 86400.0)
    on_exhausted: Literal["fail", "succeed"] = "fail"
    inputs: dict[str, Any] = Field(default_factory=dict)
    max_in_flight: int | None = Field(default=None, ge=1, le=10_000)
    on_failure: Literal["fail_fast", "continue_independent"] = "fail_fast"


class SubplanStep(StepBase):
    """Run a nested plan of the same agent and wait for it.

    The nested plan (id ``f"{plan_id}/{id}"``) has its own steps, journal and events; its steps
    use only the owner's tools. It reads the values of ``inputs`` (expressions over this step's
    dependencies and the plan's inputs) as its plan inputs. The step succeeds with the nested
    plan's outputs by step id, and fails when the nested plan fails (with its first failure's
    class).

    ``timeout_s`` is a timebox over the whole step, attempts and backoffs included, from its first
    attempt's start (journaled, so it holds across a restart): when it expires, the running nested
    plan is cancelled (it compensates itself) and the step fails with class ``timeout``. ``retry``
    (one attempt by default) runs the whole nested plan again after a ``transient`` or
    ``timeout`` failure: attempt ``n`` is a new nested plan (id ``f"{plan_id}/{id}.a{n}"`` from
    the second), started only once the failed one has ended and compensated itself.

    Attributes:
        steps: The nested plan's steps.
        inputs: The nested plan's inputs; values may be expressions.
        max_in_flight: The nested plan's in-flight bound (``None``: the engine's).
        on_failure: The nested plan's failure mode.
    """

    kind: Literal["subplan"] = "subplan"
    retry: RetryPolicy = _ONE_ATTEMPT
    steps: list[Step] = Field(min_length=1, max_length=MAX_BODY_STEPS)
    inputs: dict[str, Any] = Field(default_factory=dict)
    max_in_flight: int | None = Field(default=None, ge=1, le=10_000)
    on_failure: Literal["fail_fast", "continue_independent"] = "fail_fast"


Step = Annotated[
    ToolStep | CrossAgentStep | GateStep | MapStep | LoopStep | SubplanStep,
    Field(discriminator="kind"),
]
"""Any step: a union discriminated on ``kind``."""

LOOP_ITERATION: Final = "iteration"
"""The input a loop's body reads its iteration's number from (``inputs.iteration``, from 1)."""
LOOP_LAST: Final = "last"
"""The input a loop's body reads the previous iteration's outputs from (``inputs.last``)."""


class Budget(BaseModel):
    """What one plan may spend; each limit is optional (``None``: unlimited).

    Tool calls and cost units are **reserved before** an attempt is dispatched: a tool attempt
    reserves one call and the runner's ``cost(tool)`` (1.0 when the runner has no ``cost``); a
    cross-agent attempt reserves one call and 1.0 unit. An attempt whose reservation would exceed
    a limit is not started, and the plan fails with a ``policy`` failure. Wall time is measured
    from the revision's first start (wall clock, pauses and downtime included) and checked
    whenever a step is about to start; a running step is bounded by its own timeout.

    Model tokens are charged by the planner that asks a model (``agents.ModelPlanner``), not by
    the engine: each model call reserves its ``max_tokens`` before it is sent, the tokens it used
    are recorded in the plan's ``provenance``, and a call whose reservation would pass
    ``model_tokens`` is not sent (a ``policy`` failure naming the call).

    Attributes:
        wall_time_s: Seconds from the first start.
        tool_calls: Attempts dispatched (tool calls and cross-agent requests).
        cost_units: The sum of the attempts' costs.
        model_tokens: Tokens (prompt and answer) the model calls that plan and repair it may use.
    """

    # model_tokens is a field, not pydantic API: no protected "model_" namespace here.
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    wall_time_s: float | None = Field(default=None, gt=0.0)
    tool_calls: int | None = Field(default=None, ge=0)
    cost_units: float | None = Field(default=None, ge=0.0)
    model_tokens: int | None = Field(default=None, ge=0)


class ModelCall(BaseModel):
    """One call to a language model that helped make a plan: its journal record.

    Replay serves ``response`` instead of calling the model again, so a model-planned run is
    re-derived with no model server at all.

    Attributes:
        model: The model that answered (as the server names it).
        request_digest: sha256 of the request (messages, schema, limits) as sent.
        response: The answer's text, as received (at most 64 KiB; longer answers are refused).
        finish_reason: ``stop``, ``length``, ...; ``error`` when the call failed.
        input_tokens: Prompt tokens, as the server counted them.
        output_tokens: Answer tokens.
        latency_s: Wall time of the call.
        critique: What the call was asked to repair ("" for the first attempt).
        outcome: ``accepted``, or why the answer was not (one line).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(max_length=200)
    request_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    response: str = Field(default="", max_length=65536)
    finish_reason: str = Field(default="", max_length=64)
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    latency_s: float = Field(default=0.0, ge=0.0)
    critique: str = Field(default="", max_length=4000)
    outcome: str = Field(default="", max_length=4000)


class Provenance(BaseModel):
    """Who made a plan and, for a model's plan, every model call that made it.

    Attributes:
        author: ``planner:<role>`` for a deterministic planner, ``model:<model>`` for a model's
            plan.
        capability: The capability the plan serves ("" for a plan submitted directly).
        request: The capability request the plan answers, as JSON (what a replay re-derives the
            plan from).
        calls: The model calls, in order (rejected answers included).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    author: str = Field(min_length=1, max_length=300)
    capability: str = Field(default="", max_length=128)
    request: dict[str, Any] = Field(default_factory=dict)
    calls: list[ModelCall] = Field(default_factory=list, max_length=64)

    @property
    def tokens(self) -> int:
        """Tokens the model calls used, prompts and answers."""
        return sum(call.input_tokens + call.output_tokens for call in self.calls)


class Fork(BaseModel):
    """Where a forked plan comes from (``Engine.fork``): its lineage.

    Attributes:
        plan_id: The plan it was forked from.
        revision: That plan's revision it was forked from.
        at_step: The fork point: the steps whose results were recorded before this step first
            started carried their results into the fork ("" : every succeeded step of the
            revision did).
        carried: The steps whose recorded results the fork carries (without running them).
        substituted: The steps whose outputs were replaced (``--set``).
        author: Who forked it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan_id: Annotated[str, StringConstraints(pattern=rf"^{PLAN_ID_PATTERN}$")]
    revision: int = Field(ge=1)
    at_step: str = Field(default="", max_length=64)
    carried: list[str] = Field(default_factory=list)
    substituted: list[str] = Field(default_factory=list)
    author: str = Field(default="", max_length=300)


class Plan(BaseModel):
    """A plan: an immutable DAG of steps owned by one agent.

    Subclass it to give a role's plans typed fields of their own; the engine runs any subclass.

    Attributes:
        id: The plan's id.
        revision: The plan's revision; a replan makes a new revision, never edits one.
        owner: The role of the agent that owns and runs the plan.
        goal: What the plan is for.
        steps: The steps; ``depends_on`` edges must form a DAG.
        max_in_flight: The cap on concurrently running steps; ``None`` uses the engine's.
        budget: What the plan may spend (wall time, tool calls, cost units); ``None``: no limit.
        provenance: Who made the plan, and the model calls behind it; ``None`` when not said.
        inputs: Values the plan is run with, which expressions read as ``inputs``
            (``{"$expr": "inputs.topic"}``).
        on_failure: What a step's unhandled failure does: ``"fail_fast"`` (the default) stops the
            plan (running steps are cancelled, nothing new starts); ``"continue_independent"``
            lets every step that does not depend on the failed one run to its end (its dependents
            are skipped). Either way the plan ends ``failed`` and compensates.
        forked_from: For a plan made by ``Engine.fork``: the plan, revision and step it was
            forked from (``None`` otherwise).
        parent: For a nested plan the engine runs (a sub-plan, a loop's iteration): the run id
            of the step that runs it (``f"{plan_id}@{revision}:{step_id}"``); ``None`` otherwise.
            The parent resumes it: an agent does not resume it on its own.
        deadline: When the caller the plan answers stops waiting (seconds since the epoch);
            ``None``: no caller set one. The engine ignores it; an agent cancels, rather than
            resumes, a plan whose caller's deadline passed (``docs/durability.md``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    planner_fields: ClassVar[frozenset[str]] = frozenset()
    """Fields of a subclass that record what the role's planner decided and that nothing runs:
    a plan a user submits may not set them (the agent refuses it, naming the field)."""

    id: Annotated[str, StringConstraints(pattern=rf"^{PLAN_ID_PATTERN}$")]
    revision: int = Field(default=1, ge=1)
    owner: RoleName
    goal: str = Field(min_length=1, max_length=2000)
    steps: list[Step] = Field(default_factory=list, max_length=100_000)
    max_in_flight: int | None = Field(default=None, ge=1, le=10_000)
    budget: Budget | None = None
    provenance: Provenance | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    on_failure: Literal["fail_fast", "continue_independent"] = "fail_fast"
    forked_from: Fork | None = None
    parent: str | None = Field(default=None, max_length=500)
    deadline: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)

    def step(self, step_id: str) -> Step:
        """The step with id ``step_id``.

        Raises:
            KeyError: When the plan has no such step.
        """
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)


LoopStep.model_rebuild()
SubplanStep.model_rebuild()
