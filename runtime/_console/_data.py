"""What the console shows, read through the history API (``Operator.history``, ``plan``,
``watch``: the one the CLI and the Python client read) and the operator API's other reads
(revisions, agents' health and cards), plus the audit chain's verification. Each read names what
could not be read (an agent down, a store unreadable) instead of failing the whole page.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from stratagem.protocol import (
    GateInfo,
    InvalidArgumentError,
    PlanRevision,
    ProtocolError,
    RemoteError,
)
from stratagem.runtime.config._errors import LaunchError
from stratagem.runtime.config._restarts import gave_up_reason
from stratagem.runtime.operator._artifacts import ArtifactsClient
from stratagem.runtime.operator._auditing import AuditCheck
from stratagem.runtime.operator._diagram import plan_diagram
from stratagem.runtime.operator._history import PlanHistory, PlanView, StepView
from stratagem.runtime.operator._input import (
    InputError,
    PlanNotFoundError,
    parse_json_object,
    parse_json_value,
)
from stratagem.runtime.operator._operator import Operator

__all__ = [
    "ACTIONS",
    "FINAL_STATUSES",
    "MAX_BLOCKED",
    "PAGE_SIZE",
    "ActionOutcome",
    "AgentView",
    "ConsoleData",
    "Decision",
    "Gate",
    "GateField",
    "GoalRoute",
    "PlanDetail",
    "PlansPage",
    "RouteStep",
    "act",
    "decision_from_form",
    "open_gates",
    "problem_line",
]

logger = logging.getLogger(__name__)

PAGE_SIZE: Final = 50
"""Plans on one page of the plans list."""
MAX_BLOCKED: Final = 100
"""The most blocked plans whose gates the gates page lists (the newest)."""
FINAL_STATUSES: Final = frozenset({"succeeded", "failed", "cancelled"})
"""Plan statuses after which nothing changes (the live stream ends)."""

READ_ERRORS: Final = (ProtocolError, LaunchError, InputError, OSError)
"""What one read may fail with that the page reports instead of failing."""


def problem_line(exc: BaseException) -> str:
    """One line saying why a read failed (never a stack trace)."""
    if isinstance(exc, RemoteError):
        return f"{exc.code}: {exc.message}"
    return str(exc) or type(exc).__name__


@dataclass(frozen=True, slots=True)
class PlansPage:
    """One page of the plans list: a page of the history API and how to get the next one.

    Attributes:
        plans: The plans on it (the history API's summaries).
        next_token: The next page's token (``""``: this is the last).
        first: Whether it is the first page.
        problems: What an agent could not read, one line each (the rest is listed).
        folded: Whether it lists top-level plans only, their sub-plans counted in
            ``sub_plans`` (by plan id).
    """

    plans: list[PlanView]
    next_token: str
    first: bool
    problems: list[str] = field(default_factory=list)
    folded: bool = False
    sub_plans: dict[str, int] = field(default_factory=dict)


FieldKind = Literal["string", "integer", "number", "boolean", "json"]
"""How a gate's form field is read: the JSON Schema type of a property, or any JSON."""
SIMPLE_KINDS: Final = frozenset({"string", "integer", "number", "boolean"})


@dataclass(frozen=True, slots=True)
class GateField:
    """One field of a gate's approval form, derived from what the gate asks.

    Attributes:
        name: The form field's name: ``value:KIND:PROPERTY`` (``PROPERTY`` empty: the whole
            value), ``arguments`` or ``output``; ``decision_from_form`` reads it back.
        label: What the page calls it.
        kind: How the text is read.
        required: Whether the schema requires it (the agent checks; the page marks it).
        options: The values to pick from, each as JSON (a ``choices`` gate, an ``enum``).
        initial: What the field holds at first (a tool gate's arguments as proposed).
        hint: A short description (the schema's ``description``, bounds).
    """

    name: str
    label: str
    kind: FieldKind = "json"
    required: bool = False
    options: tuple[str, ...] = ()
    initial: str = ""
    hint: str = ""


def _schema_hint(schema: Mapping[str, Any]) -> str:
    parts = [str(schema["description"])] if isinstance(schema.get("description"), str) else []
    for key, word in (("minimum", "at least"), ("maximum", "at most")):
        if isinstance(schema.get(key), int | float):
            parts.append(f"{word} {schema[key]}")
    return "; ".join(parts)


def _value_field(prop: str, schema: Any, required: bool) -> GateField:
    label = f"value.{prop}" if prop else "value"
    if not isinstance(schema, dict):
        return GateField(f"value:json:{prop}", label, "json", required)
    kind = schema.get("type")
    if isinstance(schema.get("enum"), list):
        options = tuple(json.dumps(v) for v in schema["enum"])
        return GateField(f"value:json:{prop}", label, "json", required, options, "", "")
    if kind in SIMPLE_KINDS:
        return GateField(f"value:{kind}:{prop}", label, kind, required, hint=_schema_hint(schema))
    return GateField(f"value:json:{prop}", label, "json", required, hint="JSON")


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def gate_fields(info: GateInfo | None, step: StepView) -> list[GateField]:
    """The form fields an approval of this gate carries: its value (one field per property of
    an object schema of simple types, a pick of its choices, or JSON), a tool gate's arguments
    (to edit), a reconcile gate's output (optional). Empty: the gate asks nothing."""
    kind = info.kind if info is not None else ("gate" if step.kind == "gate" else "reconcile")
    if kind == "tool":
        arguments = _loads(info.arguments_json) if info is not None else None
        initial = json.dumps(arguments, indent=2, sort_keys=True) if arguments else ""
        return [GateField("arguments", "arguments", "json", False, initial=initial, hint="JSON")]
    if kind == "reconcile":
        return [
            GateField(
                "output",
                "output",
                "json",
                hint="the step's output as it happened (a JSON object); empty: run it again",
            )
        ]
    if info is None:
        return []
    choices = _loads(info.choices_json)
    if isinstance(choices, list) and choices:
        options = tuple(json.dumps(c) for c in choices)
        return [GateField("value:json:", "value", "json", True, options)]
    schema = _loads(info.input_schema_json)
    if not isinstance(schema, dict):
        return []
    properties = schema.get("properties")
    if schema.get("type") == "object" and isinstance(properties, dict) and properties:
        listed = schema.get("required")
        required: list[Any] = listed if isinstance(listed, list) else []
        return [_value_field(str(p), sub, p in required) for p, sub in properties.items()]
    return [_value_field("", schema, True)]


@dataclass(frozen=True, slots=True)
class Gate:
    """A gate waiting for a decision: the plan (as the history API has it) and the step."""

    plan: PlanView
    step: StepView

    @property
    def info(self) -> GateInfo | None:
        """What the agent says the gate asks (its last open record), when it says."""
        found = [g for g in self.plan.gates if g.gate_id == self.step.id and g.event != "decided"]
        return found[-1] if found else None

    @property
    def kind(self) -> str:
        """``gate``, ``reconcile``, ``policy`` or ``tool``."""
        info = self.info
        if info is not None:
            return info.kind
        return "gate" if self.step.kind == "gate" else "reconcile"

    @property
    def prompt(self) -> str:
        """What it asks."""
        info = self.info
        if info is not None and info.prompt:
            return info.prompt
        if self.step.kind == "gate":
            return self.step.does
        return f"reconcile step {self.step.id} ({self.step.does}): did its effect happen?"

    @property
    def fields(self) -> list[GateField]:
        """What an approval carries besides the rationale."""
        return gate_fields(self.info, self.step)


def open_gates(plans: Sequence[PlanView]) -> list[Gate]:
    """The gates of ``plans`` waiting for a decision."""
    return [Gate(plan, step) for plan in plans for step in plan.steps if step.status == "blocked"]


@dataclass(frozen=True, slots=True)
class PlanDetail:
    """A plan and every sub-plan it caused (the history API's ``PlanHistory``), with its
    revisions and its diagram.

    Attributes:
        history: The plan, then its sub-plans, with what each step did.
        revisions: The plan's revisions, oldest first.
        diagram: The DAG as Mermaid text (``plans show --format mermaid``).
        problems: What could not be read, one line each.
    """

    history: PlanHistory
    revisions: list[PlanRevision]
    diagram: str
    problems: list[str]

    @property
    def root(self) -> PlanView:
        """The plan asked for."""
        return self.history.plans[0]

    @property
    def subplans(self) -> list[PlanView]:
        """The plans it caused."""
        return self.history.plans[1:]

    @property
    def gates(self) -> list[Gate]:
        """Its gates (and its sub-plans') waiting for a decision."""
        return open_gates(self.history.plans)

    @property
    def route(self) -> GoalRoute | None:
        """How a goal in plain words was routed (from its plan's assignments); ``None`` for
        another plan."""
        return goal_route(self.root)


@dataclass(frozen=True, slots=True)
class RouteStep:
    """One step of a goal in plain words: the capability chosen for a clause, and why.

    Attributes:
        step: The step's id.
        agent: The agent (or external A2A agent) that serves it.
        capability: The capability (or skill).
        why: The clause and the intent it matched (or that a model chose it).
        score: The match score, 0-1 (``None`` for the approval gate).
        status: The step's status in the newest revision (``dropped`` when a replan dropped it).
        dropped: Why a replan dropped it (``""`` when it was not).
    """

    step: str
    agent: str
    capability: str
    why: str
    score: float | None
    status: str
    dropped: str


@dataclass(frozen=True, slots=True)
class GoalRoute:
    """A goal in plain words' route: ``single`` (one capability) or ``plan``, its steps with the
    match scores, and the revision it is at (more than 1: replanned)."""

    kind: str
    steps: list[RouteStep]
    revision: int


def goal_route(plan: PlanView) -> GoalRoute | None:
    """The route of ``plan`` when it is a goal in plain words (an assignment has a score)."""
    assignments = (plan.plan or {}).get("assignments") or []
    if not any(isinstance(a, dict) and a.get("score") is not None for a in assignments):
        return None
    statuses = {s.id: s.status for s in plan.steps}
    steps = [
        RouteStep(
            step=str(a.get("step", "")),
            agent=str(a.get("agent", "")),
            capability=str(a.get("capability", "")),
            why=str(a.get("purpose", "")),
            score=a.get("score"),
            status="dropped" if a.get("dropped") else statuses.get(str(a.get("step")), "pending"),
            dropped=str(a.get("dropped") or ""),
        )
        for a in assignments
        if isinstance(a, dict)
    ]
    work = sum(s.capability != "gate" for s in steps)
    return GoalRoute("single" if work == 1 else "plan", steps, plan.revision)


def _moment(value: str, name: str) -> datetime | None:
    """A filter's time (``YYYY-MM-DDTHH:MM``, UTC when no zone is given)."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InputError(f"{name} {value!r} is not a date and time (YYYY-MM-DDTHH:MM)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class AgentView:
    """One agent as its gRPC server answers (nothing here asks Ray).

    Attributes:
        role: Its role.
        endpoint: Where it serves (``""``: not found).
        health: Its gRPC health status, or ``"down"``.
        version: What its card says.
        capabilities: What it serves.
        tools: Its tools.
        problem: Why it does not answer, or why it gave up restarting.
    """

    role: str
    endpoint: str = ""
    health: str = "down"
    version: str = ""
    capabilities: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    problem: str = ""


class ConsoleData:
    """The console's reads and actions, over one ``Operator`` (on the server's event loop).

    Args:
        operator: The deployment's operator API, as the operator.
    """

    def __init__(self, operator: Operator) -> None:
        self.operator = operator
        self._artifacts: ArtifactsClient | None = None

    @property
    def artifacts(self) -> ArtifactsClient:
        """The deployment's artifacts (read as ``stratagem artifacts`` reads them)."""
        if self._artifacts is None:
            self._artifacts = ArtifactsClient(self.operator.settings)
        return self._artifacts

    @property
    def roles(self) -> tuple[str, ...]:
        """Every agent's role."""
        return self.operator.roles

    async def plans(
        self,
        *,
        agent: str = "",
        status: str = "",
        goal: str = "",
        text: str = "",
        trace_id: str = "",
        since: str = "",
        until: str = "",
        page_token: str = "",
        every: bool = True,
    ) -> PlansPage:
        """One page of the plans, newest first (the history API's ``history``): unless
        ``every``, and when no filter but time narrows it, the top-level plans only (a goal's,
        one run by hand), each with its sub-plans counted (``plans list`` without ``--all``).

        Raises:
            InputError: A filter or page token that is malformed or unknown.
        """
        folded = not every and not any((agent, status, goal, text, trace_id))
        page = await self.operator.history(
            agent=agent or None,
            status=status or None,
            goal=goal or None,
            text=text or None,
            trace_id=trace_id or None,
            since=_moment(since, "since"),
            until=_moment(until, "until"),
            page_size=PAGE_SIZE,
            page_token=page_token,
            top_level=folded,
        )
        more = page.next_page_token if len(page.plans) == PAGE_SIZE else ""
        return PlansPage(
            page.plans,
            more,
            not page_token,
            list(page.unreadable),
            folded,
            dict(page.sub_plans),
        )

    async def plan(self, plan_id: str) -> PlanDetail:
        """A plan and its sub-plans (the history API's ``plan``), its revisions and its diagram.

        Raises:
            InputError: A malformed plan id.
            PlanNotFoundError: No agent holds it.
        """
        history = await self.operator.plan(plan_id)
        problems = list(history.unreadable)
        revisions: list[PlanRevision] = []
        try:
            revisions = (await self.operator.revisions(plan_id)).revisions
        except READ_ERRORS as exc:
            problems.append(f"revisions: {problem_line(exc)}")
        diagram = plan_diagram(history.plans, plan_id, "mermaid")
        return PlanDetail(history, revisions, diagram, problems)

    async def gates(self) -> tuple[list[Gate], list[str]]:
        """Every gate waiting for a decision (of the newest ``MAX_BLOCKED`` blocked plans), and
        what could not be read."""
        page = await self.operator.history(status="blocked", page_size=MAX_BLOCKED)
        problems = list(page.unreadable)
        answers = await asyncio.gather(
            *(self.operator.plan(view.plan_id) for view in page.plans), return_exceptions=True
        )
        gates: list[Gate] = []
        for view, answer in zip(page.plans, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, READ_ERRORS):
                    raise answer
                problems.append(f"{view.agent} plan {view.plan_id}: {problem_line(answer)}")
                continue
            gates.extend(open_gates([v for v in answer.plans if v.plan_id == view.plan_id]))
        return gates, problems

    async def audit(self, keep: int) -> tuple[AuditCheck | None, str]:
        """The audit chain verified, with its last ``keep`` records; or why it could not be."""
        from stratagem.runtime.operator._auditing import verify_audit

        settings = self.operator.settings
        if settings.store_url is None and not settings.audit_path.exists():
            return None, f"no audit log at {settings.audit_path} (no agent has served yet)"
        try:
            return await asyncio.to_thread(verify_audit, settings, keep=keep), ""
        except (ProtocolError, OSError, ValueError) as exc:
            return None, f"the audit log cannot be read: {problem_line(exc)}"

    async def agent(self, role: str) -> AgentView:
        """One agent's endpoint, health and card; what is wrong instead when it does not answer.

        Raises:
            InputError: ``role`` is no agent of this deployment.
        """
        from stratagem.runtime.operator._operator import check_role

        check_role(role, self.roles)
        gave_up = gave_up_reason(self.operator.settings.restarts_path(role))
        try:
            endpoint = (await self.operator.endpoints([role]))[role]
        except READ_ERRORS as exc:
            return AgentView(role, problem=gave_up or problem_line(exc))
        try:
            health = await self.operator.health(role)
            card = await self.operator.describe(role)
        except READ_ERRORS as exc:
            return AgentView(role, endpoint, problem=gave_up or problem_line(exc))
        return AgentView(
            role,
            endpoint,
            health,
            card.version,
            tuple(c.name for c in card.capabilities),
            tuple(card.tools),
            gave_up,
        )

    async def agents(self) -> list[AgentView]:
        """Every agent, asked at once."""
        return list(await asyncio.gather(*(self.agent(role) for role in self.roles)))


ACTIONS: Final = ("approve", "reject", "pause", "cancel", "resume")
"""What the console may do to a plan (each exactly what the CLI's command of that name does)."""
GATE_ACTIONS: Final = frozenset({"approve", "reject"})


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """What an action did, in words a page shows.

    Attributes:
        ok: Whether it was applied.
        status_code: The HTTP status the answer carries.
        message: One line: what happened, or why nothing was.
        plan_status: The plan's status after it (``""`` when not applied).
    """

    ok: bool
    status_code: int
    message: str
    plan_status: str = ""


_NO_VALUE: Final = object()


@dataclass(frozen=True, slots=True)
class Decision:
    """What an approval carries besides its rationale (each as the CLI's ``approve`` options).

    Attributes:
        value: A gate's value (``--value``); ``has_value`` says whether there is one (a value
            may be JSON's null).
        arguments: A tool gate's arguments as edited (``--arguments``).
        output: A reconcile gate's output, recorded instead of running the step (``--output``).
    """

    value: Any = None
    has_value: bool = False
    arguments: dict[str, Any] | None = None
    output: dict[str, Any] | None = None


def _read_field(kind: str, text: str, label: str) -> Any:
    if kind == "string":
        return text
    if kind == "integer":
        try:
            return int(text.strip())
        except ValueError:
            raise InputError(f"{label}: {text!r} is not an integer") from None
    if kind == "number":
        try:
            number = float(text.strip())
        except ValueError:
            raise InputError(f"{label}: {text!r} is not a number") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise InputError(f"{label}: {text!r} is not a finite number")
        return int(number) if number.is_integer() and "." not in text else number
    if kind == "boolean":
        if text not in ("true", "false"):
            raise InputError(f"{label}: {text!r} is not true or false")
        return text == "true"
    if kind == "json":
        return parse_json_value(text, label)
    raise InputError(f"{label}: unknown field kind {kind!r}")


def decision_from_form(form: Mapping[str, str]) -> Decision:
    """An approval's value, arguments and output from a gate form's fields (see ``GateField``):
    ``value:KIND:PROPERTY`` fields make the value (an object of the properties filled in, or the
    whole value when ``PROPERTY`` is empty), ``arguments`` and ``output`` are JSON objects.
    An empty field is left out (the agent then names a required one that is missing).

    Raises:
        InputError: A field that cannot be read, in one line naming it (``value.amount: 'x' is
            not an integer``).
    """
    whole: Any = _NO_VALUE
    properties: dict[str, Any] = {}
    for name, text in form.items():
        if not name.startswith("value:") or text == "":
            continue
        _, kind, prop = [*name.split(":", 2), "", ""][:3]
        label = f"value.{prop}" if prop else "value"
        read = _read_field(kind, text, label)
        if prop:
            properties[prop] = read
        else:
            whole = read
    value: Any = properties if properties else whole
    arguments = form.get("arguments", "").strip()
    output = form.get("output", "").strip()
    return Decision(
        value=None if value is _NO_VALUE else value,
        has_value=value is not _NO_VALUE,
        arguments=parse_json_object(arguments, "arguments") if arguments else None,
        output=parse_json_object(output, "output") if output else None,
    )


def _refusal(exc: InvalidArgumentError) -> str:
    """An agent's INVALID_ARGUMENT in one line, its field violations named."""
    if exc.violations:
        return "; ".join(f"{v.field}: {v.description}" for v in exc.violations)
    return exc.message


async def act(
    data: ConsoleData,
    action: str,
    plan_id: str,
    gate_id: str = "",
    rationale: str = "",
    decision: Decision | None = None,
) -> ActionOutcome:
    """Apply ``action`` to ``plan_id`` as the operator, through the operator API (audited by the
    agent exactly as the CLI's command: the caller is the operator). An approval carries
    ``decision`` (a value, edited arguments, a reconcile output) as ``stratagem approve`` carries
    ``--value``, ``--arguments``, ``--output``. A gate that is not open, a plan that does not
    exist, a value or arguments that do not fit or bad arguments come back as a refusal, nothing
    applied."""
    from stratagem.protocol import FailedPreconditionError, NotFoundError

    if action not in ACTIONS:
        return ActionOutcome(False, 404, f"unknown action {action!r}; valid: {', '.join(ACTIONS)}")
    if not plan_id:
        return ActionOutcome(False, 400, "no plan named")
    gate = ""
    if action in GATE_ACTIONS:
        if not gate_id:
            return ActionOutcome(False, 400, f"{action} needs the gate's id")
        if not rationale.strip():
            return ActionOutcome(False, 400, f"{action} needs a rationale (it is audited)")
        gate = f" gate {gate_id} of"
    carried: dict[str, Any] = {}
    if action == "approve" and decision is not None:
        if decision.has_value:
            carried["value"] = decision.value
        if decision.arguments is not None:
            carried["arguments"] = decision.arguments
        if decision.output is not None:
            carried["output"] = decision.output
    try:
        snapshot = await data.operator.control(
            plan_id,
            action,  # type: ignore[arg-type]  # checked against ACTIONS above
            gate_id=gate_id if action in GATE_ACTIONS else "",
            rationale=rationale.strip(),
            **carried,
        )
    except PlanNotFoundError as exc:
        return ActionOutcome(False, 404, str(exc))
    except InputError as exc:
        return ActionOutcome(False, 400, str(exc))
    except InvalidArgumentError as exc:
        return ActionOutcome(False, 400, f"{action}{gate} plan {plan_id}: refused: {_refusal(exc)}")
    except FailedPreconditionError as exc:
        return ActionOutcome(
            False, 409, f"{action}{gate} plan {plan_id}: not applied: {exc.message}"
        )
    except NotFoundError as exc:
        return ActionOutcome(False, 404, f"{action}{gate} plan {plan_id}: {exc.message}")
    except READ_ERRORS as exc:
        return ActionOutcome(False, 502, f"{action}{gate} plan {plan_id}: {problem_line(exc)}")
    return ActionOutcome(
        True,
        200,
        f"{action}{gate} plan {snapshot.plan_id}: the plan is {snapshot.status}",
        snapshot.status,
    )
