"""The models of the ``AgentService`` RPCs besides the capabilities' own: the envelopes of ``Call``,
the agent's card, plan events and snapshots, the read queries, ``Control``, ``Replay`` and
``Revisions``; and the patterns of the identities and ids they carry.

Each mirrors one message of ``proto/stratagem/v1/agent.proto`` field for field (``_drift`` checks
it); the codec converts between the two generically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final, Literal, get_args

from pydantic import (
    AfterValidator,
    Field,
    SerializeAsAny,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from stratagem.protocol._capabilities import (
    CAPABILITIES,
    EXTENSION_FIELD,
    INT32_MAX,
    CapabilitySpec,
    NewPlanId,
    PlanId,
    WireModel,
)

__all__ = [
    "CAPABILITY_NAME_PATTERN",
    "CONTROL_ACTIONS",
    "DEFAULT_PLANS_PAGE",
    "IDENTITY_PATTERN",
    "MAX_PLANS_PAGE",
    "NO_VALUE",
    "PLANS_VIEWS",
    "PLAN_ID_PATTERN",
    "REQUEST_ID_PATTERN",
    "TRACE_ID_PATTERN",
    "AgentCard",
    "CapabilityCard",
    "ControlAction",
    "ControlRequest",
    "Envelope",
    "GateInfo",
    "NoQuery",
    "PlanEvent",
    "PlanQuery",
    "PlanRevision",
    "PlanSnapshot",
    "PlansPage",
    "PlansQuery",
    "PlansView",
    "ReplayDivergence",
    "ReplayResult",
    "RequestEnvelope",
    "ResponseEnvelope",
    "RevisionStepChange",
    "RevisionsResponse",
    "RunPlanRequest",
    "StepRecord",
    "Timestamp",
    "control_capability",
]

IDENTITY_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,63}$"
"""An identity on the wire: a role or "operator"; lowercase, so policies match exactly."""
Identity = Annotated[str, StringConstraints(pattern=IDENTITY_PATTERN)]
# An idempotency key: long enough for the engine's "<plan id>@<revision>:<step id>" keys.
REQUEST_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,399}$"
RequestId = Annotated[str, StringConstraints(pattern=REQUEST_ID_PATTERN)]
CAPABILITY_NAME_PATTERN: Final = r"^[A-Za-z][A-Za-z0-9_.]{0,63}$"
CapabilityName = Annotated[str, StringConstraints(pattern=CAPABILITY_NAME_PATTERN)]
PLAN_ID_PATTERN: Final[str] = next(
    str(item.pattern) for item in get_args(PlanId) if isinstance(item, StringConstraints)
)
"""The pattern of a plan (or step) id, as ``PlanId`` declares it."""
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]

ControlAction = Literal["approve", "reject", "pause", "cancel", "resume", "replan", "fork"]
"""What ``Control`` does to a plan."""
CONTROL_ACTIONS: Final[tuple[ControlAction, ...]] = get_args(ControlAction)


# --- the envelopes ------------------------------------------------------------------------------


class Envelope(WireModel):
    """What both envelopes share: a capability's name and a body of its request or response."""

    _side: ClassVar[Literal["request", "response"]]

    capability: CapabilityName
    body: SerializeAsAny[WireModel]

    @field_validator("capability")
    @classmethod
    def _registered(cls, capability: str) -> str:
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}")
        return capability

    @field_validator("body")
    @classmethod
    def _body_fits(cls, body: WireModel, info: ValidationInfo) -> WireModel:
        spec = CAPABILITIES.get(info.data.get("capability", ""))
        if spec is None:
            return body
        model = spec.request if cls._side == "request" else spec.response
        if not isinstance(body, model):
            raise ValueError(
                f"a {spec.name} {cls._side} is a {model.__name__}, not a {type(body).__name__}"
            )
        return body


class RequestEnvelope(Envelope):
    """A cross-agent request: routing and idempotency fields plus one capability's request body.

    Field names are those of ``stratagem.v1.AgentRequest``; ``capability`` names the body's
    capability (the ``oneof`` field for a built-in one, ``ExtensionBody.capability`` otherwise).
    """

    _side = "request"

    request_id: RequestId
    caller: Identity
    target: Identity
    plan_id: PlanId = ""
    step_id: PlanId = ""
    delegation: list[Identity] = Field(default_factory=list, max_length=64)


class ResponseEnvelope(Envelope):
    """The answer to a ``RequestEnvelope``; its field names are ``stratagem.v1.AgentResponse``'s."""

    _side = "response"

    request_id: RequestId
    responder: Identity
    plan_id: PlanId = ""


# --- introspection and progress -----------------------------------------------------------------


class CapabilityCard(WireModel):
    """One capability an agent serves, with the JSON Schemas of its request and response."""

    name: CapabilityName
    version: str = Field(max_length=32)
    request_schema: str
    response_schema: str

    wire: str = Field(default="", max_length=16)
    request_type: str = Field(default="", max_length=256)
    response_type: str = Field(default="", max_length=256)

    @classmethod
    def from_spec(cls, spec: CapabilitySpec) -> CapabilityCard:
        """The card describing ``spec``, its schemas rendered from its pydantic models, with how
        it travels (``builtin``, or an extension's ``json``, ``struct`` or ``message`` and then
        its messages' full names)."""
        messages = spec.messages
        return cls(
            name=spec.name,
            version=spec.version,
            request_schema=json.dumps(spec.request.model_json_schema(), sort_keys=True),
            response_schema=json.dumps(spec.response.model_json_schema(), sort_keys=True),
            wire=spec.wire if spec.field == EXTENSION_FIELD else "builtin",
            request_type=messages[0].DESCRIPTOR.full_name if messages else "",
            response_type=messages[1].DESCRIPTOR.full_name if messages else "",
        )


class AgentCard(WireModel):
    """What an agent is: its role, version, capabilities and tools (the answer to ``Describe``),
    and how it plans: ``planner`` (``deterministic`` or ``model``; "" from an older agent) and
    ``planning_timeout_s``, the longest planning one request may take (its model's limits; 0
    when no model plans), from which a client sets a goal's default deadline; ``model``, the
    model its planner uses (``NAME (TIER)``, ``... at URL`` on a tier's own server; "" when it
    plans by its rules or the agent is older)."""

    role: Identity
    version: str = Field(max_length=64)
    capabilities: list[CapabilityCard] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    planner: str = Field(default="", max_length=32)
    planning_timeout_s: float = Field(default=0.0, ge=0.0, le=86400.0, allow_inf_nan=False)
    model: str = Field(default="", max_length=2400)


class GateInfo(WireModel):
    """A gate: what it asks, who may decide it, its deadline and escalation, what was decided.

    Carried by ``PlanEvent.gate`` (a gate's events) and ``PlanSnapshot.gates``; its JSON is the
    ``gate`` of a gate webhook's body. Times are seconds since the epoch (0: none).

    Attributes:
        gate_id: The gate step, or the step a reconcile, policy or tool gate names.
        kind: ``gate``, ``reconcile``, ``policy`` or ``tool``.
        event: ``opened``, ``escalated``, ``timed_out`` or ``decided``.
        prompt: What the approver is asked.
        deciders: Who may decide now (identities, ``role:NAME``; none: whoever the policy allows).
        deadline: When it times out.
        escalate_at: When it escalates (0 once it has).
        input_schema_json: The JSON Schema of the value an approval carries ("" : none).
        choices_json: The values an approval may carry, a JSON array ("" : none).
        tool: A tool gate's tool.
        arguments_json: A tool gate's arguments (a JSON object; once decided, as approved).
        decision: ``approved`` or ``rejected`` ("" while open).
        approver: Who decided (``(timeout)``: its deadline).
        rationale: Why.
        value_json: The value the approval carried, as JSON ("" : none).
        at: When it opened, escalated or was decided.
    """

    gate_id: str = Field(max_length=200)
    kind: str = Field(default="gate", max_length=16)
    event: str = Field(default="opened", max_length=16)
    prompt: str = Field(default="", max_length=4000)
    deciders: list[str] = Field(default_factory=list, max_length=64)
    deadline: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    escalate_at: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    input_schema_json: str = Field(default="", max_length=65536)
    choices_json: str = Field(default="", max_length=65536)
    tool: str = Field(default="", max_length=128)
    arguments_json: str = Field(default="", max_length=65536)
    decision: str = Field(default="", max_length=16)
    approver: str = Field(default="", max_length=256)
    rationale: str = Field(default="", max_length=4000)
    value_json: str = Field(default="", max_length=65536)
    at: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class PlanEvent(WireModel):
    """A change of a plan or of one of its steps, as streamed by ``Watch`` (``gate``: for a
    gate's events, what happened at the gate)."""

    plan_id: PlanId
    revision: Count = 0
    step_id: str = Field(default="", max_length=200)
    status: str = Field(max_length=32)
    attempt: Count = 0
    failure_class: str = Field(default="", max_length=32)
    message: str = Field(default="", max_length=4000)
    timestamp: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    agent: str = Field(default="", max_length=64)
    gate: GateInfo | None = None


Timestamp = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
"""Seconds since the epoch; 0 when unknown."""

TRACE_ID_PATTERN: Final = r"^[0-9a-f]{32}$"
"""A W3C trace id: 32 lowercase hex characters."""

PlansView = Literal["", "summary", "steps"]
"""How much a ``Plans`` snapshot carries: the plan and its step statuses (``""``), its summary
alone (``summary``: no ``plan_json``), or also each step's record (``steps``)."""
PLANS_VIEWS: Final[tuple[PlansView, ...]] = get_args(PlansView)


_OVERHEAD: Final = 256
"""What a snapshot or a step record takes in a message beside its texts, at most."""


class StepRecord(WireModel):
    """What one step of a plan did, from its agent's journal (``PlansQuery.view == "steps"``).

    Attributes:
        step_id: The step.
        kind: ``tool``, ``cross_agent`` or ``gate``.
        does: The tool, ``"<agent>.<capability>"``, or the gate's prompt.
        status: The step's status.
        attempts: Attempts started.
        started: When the first attempt started (0: never).
        ended: When the last attempt ended (0: not ended).
        input_json: The input it ran with, references resolved, as a JSON object ("" for none).
        output_json: Its output, as a JSON object ("" for none).
        failure_class: Its failure's class ("" for none).
        message: Why it failed, or a gate's decision.
        revision: The plan revision that made the step as it is.
        author: Who made that revision ("" when unknown).
        cut: ``input_json`` or ``output_json`` was cut to fit.
        depends_on: The steps it waits for.
    """

    step_id: str = Field(max_length=64)
    kind: str = Field(default="", max_length=32)
    does: str = Field(default="", max_length=2000)
    status: str = Field(default="", max_length=32)
    attempts: Count = 0
    started: Timestamp = 0.0
    ended: Timestamp = 0.0
    input_json: str = ""
    output_json: str = ""
    failure_class: str = Field(default="", max_length=32)
    message: str = Field(default="", max_length=4000)
    revision: Count = 0
    author: str = Field(default="", max_length=300)
    cut: bool = False
    depends_on: list[str] = Field(default_factory=list)


class PlanSnapshot(WireModel):
    """A plan's state, as returned by ``Plans``; ``plan_json`` is the typed plan as JSON (a
    fork's ``forked_from`` in it), ``gates`` its open gates and those decided since the agent took
    it up.

    Attributes:
        plan_id: The plan.
        agent: The agent that owns it.
        revision: Its newest revision.
        status: Its status.
        plan_json: The typed plan with its step statuses ("" in a ``summary`` view).
        goal: What it is for.
        created: When it was first stored (0: unknown).
        updated: When its status last changed (0: unknown).
        trace_id: The trace its runs belong to ("" when unknown).
        message: The last status's line: for a failed plan, which step failed, its class and why.
        steps: What each step did (the ``steps`` view).
        cursor: A page token listing the plans after this one (``Plans`` answers only).
        gates: Its open gates, and those decided since the agent took it up.
    """

    plan_id: PlanId
    agent: str = Field(max_length=64)
    revision: Count = 0
    status: str = Field(max_length=32)
    plan_json: str = ""
    goal: str = Field(default="", max_length=2000)
    created: Timestamp = 0.0
    updated: Timestamp = 0.0
    trace_id: str = Field(default="", pattern=r"^([0-9a-f]{32})?$")
    message: str = Field(default="", max_length=4000)
    steps: list[StepRecord] = Field(default_factory=list)
    cursor: str = Field(default="", pattern=r"^[0-9]{0,20}$")
    gates: list[GateInfo] = Field(default_factory=list, max_length=10_000)

    def size_hint(self) -> int:
        """About how many bytes the snapshot takes in a message (its texts dominate it)."""
        steps = sum(
            len(step.input_json) + len(step.output_json) + len(step.message) + len(step.does)
            for step in self.steps
        )
        return (
            len(self.plan_json)
            + len(self.goal)
            + len(self.message)
            + steps
            + _OVERHEAD * (1 + len(self.steps) + len(self.gates))
        )


MAX_PLANS_PAGE: Final = 1000
"""The most snapshots one ``Plans`` page holds (``PlansRequest.page_size``)."""
DEFAULT_PLANS_PAGE: Final = 100
"""The page size an agent uses when the request names none."""


PAGE_TOKEN_MAX: Final = 2**63 - 1
"""The largest page token: an agent's plans are numbered by a 64-bit SQL integer."""


def _page_token_in_range(token: str) -> str:
    if token and int(token) > PAGE_TOKEN_MAX:
        raise ValueError(f"a page token is a plan number up to {PAGE_TOKEN_MAX}")
    return token


PageToken = Annotated[
    str,
    StringConstraints(max_length=20, pattern=r"^[0-9]*$"),
    AfterValidator(_page_token_in_range),
]
"""A page token on the wire: "" or the number of the plan the page starts after."""


class PlansPage(WireModel):
    """The body of ``PlansResponse``: one page of snapshots and the next page's token.

    Attributes:
        plans: The page, newest plan first.
        next_page_token: The token of the next page ("" on the last).
        unreadable: What the agent could not read, one line each (what it could is listed).
    """

    plans: list[PlanSnapshot] = Field(default_factory=list)
    next_page_token: PageToken = ""
    unreadable: list[str] = Field(default_factory=list, max_length=100)


class PlanQuery(WireModel):
    """The body of ``WatchRequest``, ``RevisionsRequest`` and ``ReplayRequest``: a plan id."""

    plan_id: PlanId = ""


class PlansQuery(PlanQuery):
    """The body of ``PlansRequest``: which plans, and which page of them: newest first, or with
    ``plan_id`` the plan and its sub-plans in the order they were made (the plan first).

    Every filter left empty matches every plan.

    Attributes:
        plan_id: The plan and its sub-plans; "" for every plan.
        page_size: At most this many snapshots (0: ``DEFAULT_PLANS_PAGE``).
        page_token: "" for the first page, else the previous page's ``next_page_token`` or a
            snapshot's ``cursor``: the plans after it (plans added meanwhile are newer, so they
            never shift a later page).
        status: Only plans in this status (the agent refuses one that is not a plan status).
        goal: Only plans whose goal contains this text, case-insensitively.
        text: Only plans whose id, goal, steps, outputs or messages contain this text,
            case-insensitively.
        since: Only plans created at or after this time (0: no bound).
        until: Only plans created before this time (0: no bound).
        trace_id: Only plans of this trace.
        view: How much each snapshot carries (``PlansView``).
        full: With the ``steps`` view: step values whole, as far as the message limit allows
            (else long values are cut, and the step says so).
    """

    page_size: int = Field(default=0, ge=0, le=MAX_PLANS_PAGE)
    page_token: PageToken = ""
    status: str = Field(default="", max_length=32)
    goal: str = Field(default="", max_length=200)
    text: str = Field(default="", max_length=200)
    since: Timestamp = 0.0
    until: Timestamp = 0.0
    trace_id: str = Field(default="", pattern=r"^([0-9a-f]{32})?$")
    view: PlansView = ""
    full: bool = False


class NoQuery(WireModel):
    """The body of ``DescribeRequest``."""


class RunPlanRequest(WireModel):
    """The body of ``RunPlanRequest``: a user's plan for one agent, as JSON.

    Attributes:
        plan_json: The plan.
        until_blocked: Answer as soon as the plan waits at a gate (its state then says
            ``blocked``), not only when it ends; the plan is then bound by no caller's deadline
            (without it, a plan whose caller goes away is cancelled unless it waits at a gate).
    """

    plan_json: str = Field(min_length=2)
    until_blocked: bool = False


NO_VALUE: Final[Any] = object()
"""``ControlRequest.build``'s ``value`` when none is given (``None`` is JSON's null)."""


def _json_of(name: str, value: Any) -> str:
    """``value`` as JSON, or a ``ValueError`` naming the argument it came from."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not JSON ({exc})") from None


class ControlRequest(WireModel):
    """The body of ``ControlRequest``: one control action on one plan.

    Attributes:
        plan_id: The plan.
        action: What to do.
        gate_id: For ``approve``/``reject``: the gate step, or the step a reconcile, policy or
            tool gate names.
        rationale: For ``approve``/``reject``/``replan``/``fork``: why (audited, redacted).
        revision: For ``approve``/``reject``: the plan revision decided for; 0 for the current.
        output_json: For ``approve`` of a reconcile gate: a JSON object to record as the step's
            output instead of re-running it (the operator found its effect done).
        plan_json: For ``replan``: the new revision's plan.
        value_json: For ``approve`` of a gate that asks: its value, as JSON ("" : none).
        arguments_json: For ``approve`` of a tool gate: the tool's arguments as edited (a JSON
            object; "" : as they are).
        at_step: For ``fork``: the fork point ("" : the end of the revision forked).
        at_revision: For ``fork``: the revision forked (0: the newest).
        set_json: For ``fork``: a JSON object of step id -> output substituted ("" : none).
        new_plan_id: For ``fork``: the new plan's id ("" : one is made).
    """

    plan_id: PlanId = Field(min_length=1)
    action: ControlAction
    gate_id: PlanId = ""
    rationale: str = Field(default="", max_length=2000)
    revision: Count = 0
    output_json: str = Field(default="", max_length=1 << 20)
    plan_json: str = Field(default="", max_length=16 << 20)
    value_json: str = Field(default="", max_length=1 << 20)
    arguments_json: str = Field(default="", max_length=1 << 20)
    at_step: PlanId = ""
    at_revision: Count = 0
    set_json: str = Field(default="", max_length=16 << 20)
    new_plan_id: NewPlanId = ""

    @classmethod
    def build(
        cls,
        plan_id: str,
        action: ControlAction,
        *,
        gate_id: str = "",
        rationale: str = "",
        revision: int = 0,
        output: Mapping[str, Any] | None = None,
        plan_json: str = "",
        value: Any = NO_VALUE,
        arguments: Mapping[str, Any] | None = None,
        at_step: str = "",
        at_revision: int = 0,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
        new_plan_id: str = "",
    ) -> ControlRequest:
        """The request for ``action`` on ``plan_id`` from Python values: the one place that
        encodes a control verb's arguments (``AgentClient.control``, the operator's ``control``
        and the A2A face's answer to a gate build with it). The JSON fields are given decoded:
        ``output`` (for ``output_json``), ``value`` (``value_json``; ``NO_VALUE``: none, as
        ``None`` is JSON's null), ``arguments`` (``arguments_json``), ``outputs`` (``set_json``).

        Raises:
            pydantic.ValidationError: The arguments do not form a valid request.
            ValueError: A value that is not JSON, naming its argument (``value: not JSON...``).
        """
        return cls(
            plan_id=plan_id,
            action=action,
            gate_id=gate_id,
            rationale=rationale,
            revision=revision,
            output_json="" if output is None else _json_of("output", dict(output)),
            plan_json=plan_json,
            value_json="" if value is NO_VALUE else _json_of("value", value),
            arguments_json="" if arguments is None else _json_of("arguments", dict(arguments)),
            at_step=at_step,
            at_revision=at_revision,
            set_json=_json_of("outputs", {k: dict(v) for k, v in outputs.items()})
            if outputs
            else "",
            new_plan_id=new_plan_id,
        )

    @model_validator(mode="after")
    def _gate_given(self) -> ControlRequest:
        if self.action in ("approve", "reject") and not self.gate_id:
            raise ValueError(f"{self.action} needs gate_id")
        if self.output_json and self.action != "approve":
            raise ValueError("output_json is only for approve")
        if self.action == "replan" and not (self.plan_json and self.rationale):
            raise ValueError("replan needs plan_json and rationale")
        if self.plan_json and self.action != "replan":
            raise ValueError("plan_json is only for replan")
        for name in ("value_json", "arguments_json"):
            if getattr(self, name) and self.action != "approve":
                raise ValueError(f"{name} is only for approve")
        for name in ("at_step", "at_revision", "set_json", "new_plan_id"):
            if getattr(self, name) and self.action != "fork":
                raise ValueError(f"{name} is only for fork")
        return self


class ReplayDivergence(WireModel):
    """One decision a replay reached differently (``step_id`` "" for the plan)."""

    step_id: str = Field(default="", max_length=256)
    decision: str = Field(max_length=32)
    recorded: str = Field(default="", max_length=4000)
    replayed: str = Field(default="", max_length=4000)


class ReplayResult(WireModel):
    """The answer to ``Replay``: what re-running a finished plan from its records found.

    Attributes:
        plan_id: The plan.
        agent: Its owner, where it was replayed.
        revision: The revision replayed (the newest).
        recorded_status: The plan's recorded final status.
        replayed_status: The replay's final status; "" when it did not end in time.
        decisions: How many decisions were re-derived and compared.
        divergences: The decisions that differ, steps in plan order, the plan's last.
    """

    plan_id: PlanId
    agent: str = Field(max_length=64)
    revision: Count = 0
    recorded_status: str = Field(max_length=32)
    replayed_status: str = Field(default="", max_length=32)
    decisions: Count = 0
    divergences: list[ReplayDivergence] = Field(default_factory=list)

    @property
    def diverged(self) -> bool:
        """Whether any decision differs."""
        return bool(self.divergences)


class RevisionStepChange(WireModel):
    """A step in both revisions whose fields differ."""

    step_id: str = Field(max_length=256)
    fields: list[str] = Field(default_factory=list)


class PlanRevision(WireModel):
    """One revision of a plan, as ``Revisions`` lists them.

    Attributes:
        revision: The revision.
        parent: The revision it was made from (0 for the first).
        author: Who made it (``""`` for the first).
        rationale: Why.
        added: Steps only in this revision.
        removed: Steps only in the parent.
        changed: Steps in both whose fields differ.
        carried: The parent's completed steps whose results carried over.
        at: When it was made (seconds since the epoch; 0 when unknown).
    """

    revision: Count
    parent: Count = 0
    author: str = Field(default="", max_length=256)
    rationale: str = Field(default="", max_length=4000)
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: list[RevisionStepChange] = Field(default_factory=list)
    carried: list[str] = Field(default_factory=list)
    at: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class RevisionsResponse(WireModel):
    """The answer to ``Revisions``: a plan's history on its owner, oldest first."""

    plan_id: PlanId
    agent: str = Field(max_length=64)
    revisions: list[PlanRevision] = Field(default_factory=list)


def control_capability(action: ControlAction) -> str:
    """The pseudo-capability ``Control`` is authorized as, e.g. ``"Control.approve"``."""
    return f"Control.{action}"
