"""What the console shows, read through the operator API (the one the CLI and the Python client
read): plans with filters and pages, one plan with its sub-plans, steps, revisions and gates, the
agents. Each read names what could not be read (an agent down, a store unreadable) instead of
failing the whole page.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from stratagem.protocol import PlanRevision, PlanSnapshot, ProtocolError, RemoteError
from stratagem.runtime._auditing import AuditCheck
from stratagem.runtime._diagram import plan_diagram
from stratagem.runtime._input import InputError, PlanNotFoundError
from stratagem.runtime._local import LaunchError
from stratagem.runtime._operator import Operator
from stratagem.runtime._restarts import gave_up_reason
from stratagem.runtime._settings import Settings

__all__ = [
    "ACTIONS",
    "FINAL_STATUSES",
    "PAGE_SIZE",
    "ActionOutcome",
    "AgentView",
    "ConsoleData",
    "GateView",
    "PlanRow",
    "PlanView",
    "PlansPage",
    "StepView",
    "act",
    "problem_line",
]

logger = logging.getLogger(__name__)

PAGE_SIZE: Final = 50
"""Plans on one page of the plans list."""
FINAL_STATUSES: Final = frozenset({"succeeded", "failed", "cancelled"})
"""Plan statuses after which nothing changes (the live stream ends)."""

READ_ERRORS: Final = (ProtocolError, LaunchError, InputError, OSError)
"""What one agent's read may fail with that the page reports instead of failing."""


def problem_line(exc: BaseException) -> str:
    """One line saying why a read failed (never a stack trace)."""
    if isinstance(exc, RemoteError):
        return f"{exc.code}: {exc.message}"
    return str(exc) or type(exc).__name__


@dataclass(frozen=True, slots=True)
class PlanRow:
    """A plan in the plans list."""

    plan_id: str
    agent: str
    status: str
    revision: int
    goal: str


@dataclass(frozen=True, slots=True)
class PlansPage:
    """One page of the plans list.

    Attributes:
        rows: The plans on it.
        total: How many plans passed the filters.
        offset: The index of its first plan among them.
        problems: Per agent that could not be asked, why.
    """

    rows: list[PlanRow]
    total: int
    offset: int
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def next_offset(self) -> int | None:
        """Where the next page starts (``None``: this is the last)."""
        following = self.offset + PAGE_SIZE
        return following if following < self.total else None

    @property
    def previous_offset(self) -> int | None:
        """Where the previous page starts (``None``: this is the first)."""
        return max(0, self.offset - PAGE_SIZE) if self.offset > 0 else None


@dataclass(frozen=True, slots=True)
class StepView:
    """One step of a plan, as its record holds it."""

    step_id: str
    kind: str
    what: str
    status: str
    depends_on: tuple[str, ...]
    input: str
    prompt: str = ""
    output: str = ""
    error: str = ""
    attempts: int = 0
    started: float = 0.0
    finished: float = 0.0


@dataclass(frozen=True, slots=True)
class GateView:
    """A gate waiting for a decision."""

    plan_id: str
    agent: str
    gate_id: str
    prompt: str
    revision: int


@dataclass(frozen=True, slots=True)
class PlanView:
    """One plan (root or sub-plan) with its steps."""

    plan_id: str
    agent: str
    status: str
    revision: int
    goal: str
    steps: list[StepView]
    parent_id: str = ""
    trace_id: str = ""

    @property
    def gates(self) -> list[GateView]:
        """Its gates waiting for a decision."""
        return [
            GateView(self.plan_id, self.agent, s.step_id, s.prompt, self.revision)
            for s in self.steps
            if s.status == "blocked"
        ]

    @property
    def final(self) -> bool:
        """Whether it is over."""
        return self.status in FINAL_STATUSES


def _pretty(value: Any) -> str:
    if value in (None, {}, []):
        return ""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _what(step: dict[str, Any]) -> str:
    kind = str(step.get("kind", ""))
    if kind == "tool":
        return f"tool {step.get('tool', '')}"
    if kind == "cross_agent":
        return f"{step.get('target', '')}.{step.get('capability', '')}"
    return kind


def _body(snapshot: PlanSnapshot) -> dict[str, Any]:
    try:
        body = json.loads(snapshot.plan_json) if snapshot.plan_json else {}
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


PLAN_ATTRIBUTE: Final = "stratagem.plan.id"


def _trace_of(settings: Settings, plan_id: str) -> str:
    """The trace of the first span in the span file that names ``plan_id`` (blocking)."""
    path = settings.trace_file or settings.state_dir / "spans.jsonl"
    needle = json.dumps(plan_id)
    try:
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if needle not in line:
                    continue
                try:
                    raw = json.loads(line)
                except ValueError:
                    continue
                if (raw.get("attributes") or {}).get(PLAN_ATTRIBUTE) == plan_id:
                    return str(raw.get("trace_id", ""))
    except OSError:
        return ""
    return ""


def plan_view(snapshot: PlanSnapshot) -> PlanView:
    """A snapshot as the page shows it."""
    body = _body(snapshot)
    steps = []
    for raw in body.get("steps") or []:
        kind = str(raw.get("kind", ""))
        given = raw.get("input") if kind == "tool" else raw.get("request")
        prompt = str(raw.get("prompt", "")) if kind == "gate" else ""
        if not prompt and raw.get("status") == "blocked":
            prompt = f"reconcile step {raw.get('id', '')}: did its effect happen?"
        steps.append(
            StepView(
                step_id=str(raw.get("id", "")),
                kind=kind,
                what=_what(raw),
                status=str(raw.get("status", "pending")),
                depends_on=tuple(str(d) for d in raw.get("depends_on") or ()),
                input=_pretty(given),
                prompt=prompt,
            )
        )
    parent = snapshot.plan_id.rsplit("/", 1)[0] if "/" in snapshot.plan_id else ""
    return PlanView(
        plan_id=snapshot.plan_id,
        agent=snapshot.agent,
        status=snapshot.status,
        revision=snapshot.revision,
        goal=str(body.get("goal", "")),
        steps=steps,
        parent_id=parent,
    )


@dataclass(frozen=True, slots=True)
class PlanDetail:
    """A plan and every sub-plan it caused, with what the page draws from them."""

    root: PlanView
    subplans: list[PlanView]
    diagram: str
    revisions: list[PlanRevision]
    problems: dict[str, str]


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

    @property
    def roles(self) -> tuple[str, ...]:
        """Every agent's role."""
        return self.operator.roles

    async def _per_agent(self, roles: Sequence[str]) -> tuple[list[PlanSnapshot], dict[str, str]]:
        async def one(role: str) -> list[PlanSnapshot]:
            return await self.operator.plans(agent=role)

        answers = await asyncio.gather(*(one(role) for role in roles), return_exceptions=True)
        snapshots: list[PlanSnapshot] = []
        problems: dict[str, str] = {}
        for role, answer in zip(roles, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, READ_ERRORS):
                    raise answer
                problems[role] = problem_line(answer)
            else:
                snapshots.extend(answer)
        return snapshots, problems

    async def plans(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        text: str = "",
        offset: int = 0,
    ) -> PlansPage:
        """One page of the plans the agents hold, newest first within each agent.

        Raises:
            InputError: An unknown agent or status.
        """
        from stratagem.runtime._operator import check_role, check_status

        if agent:
            check_role(agent, self.roles)
        if status:
            check_status(status)
        snapshots, problems = await self._per_agent([agent] if agent else list(self.roles))
        wanted = text.strip().lower()
        rows = []
        for snapshot in snapshots:
            if status and snapshot.status != status:
                continue
            body = _body(snapshot)
            goal = str(body.get("goal", ""))
            if wanted and wanted not in snapshot.plan_id.lower() and wanted not in goal.lower():
                continue
            rows.append(
                PlanRow(snapshot.plan_id, snapshot.agent, snapshot.status, snapshot.revision, goal)
            )
        offset = max(0, min(offset, max(0, len(rows) - 1)))
        return PlansPage(rows[offset : offset + PAGE_SIZE], len(rows), offset, problems)

    async def plan(self, plan_id: str) -> PlanDetail:
        """A plan and its sub-plans, its revisions and its diagram.

        Raises:
            PlanNotFoundError: No agent holds it.
        """
        snapshots = await self.operator.show(plan_id)
        views = [plan_view(s) for s in snapshots]
        root = next((v for v in views if v.plan_id == plan_id), None)
        if root is None:
            raise PlanNotFoundError(plan_id)
        problems: dict[str, str] = {}
        revisions: list[PlanRevision] = []
        try:
            revisions = (await self.operator.revisions(plan_id)).revisions
        except READ_ERRORS as exc:
            problems["revisions"] = problem_line(exc)
        subplans = sorted(
            (v for v in views if v.plan_id != plan_id),
            key=lambda v: (v.plan_id.count("/"), v.plan_id),
        )
        diagram = plan_diagram(snapshots, plan_id, "mermaid")
        return PlanDetail(root, subplans, diagram, revisions, problems)

    async def gates(self) -> tuple[list[GateView], dict[str, str]]:
        """Every gate waiting for a decision, and the agents that could not be asked."""
        snapshots, problems = await self._per_agent(list(self.roles))
        gates = [
            gate
            for snapshot in snapshots
            if snapshot.status == "blocked"
            for gate in plan_view(snapshot).gates
        ]
        return gates, problems

    async def trace_id(self, plan_id: str) -> str:
        """The trace ``plan_id`` ran in (``""`` when no span of it was recorded)."""
        return await asyncio.to_thread(_trace_of, self.operator.settings, plan_id)

    async def audit(self, keep: int) -> tuple[AuditCheck | None, str]:
        """The audit chain verified, with its last ``keep`` records; or why it could not be."""
        from stratagem.runtime._auditing import verify_audit

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
        from stratagem.runtime._operator import check_role

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


async def act(
    data: ConsoleData, action: str, plan_id: str, gate_id: str = "", rationale: str = ""
) -> ActionOutcome:
    """Apply ``action`` to ``plan_id`` as the operator, through the operator API (audited by the
    agent exactly as the CLI's command: the caller is the operator). A gate that is not open, a
    plan that does not exist or bad arguments come back as a refusal, nothing applied."""
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
    try:
        snapshot = await data.operator.control(
            plan_id,
            action,  # type: ignore[arg-type]  # checked against ACTIONS above
            gate_id=gate_id if action in GATE_ACTIONS else "",
            rationale=rationale.strip(),
        )
    except PlanNotFoundError as exc:
        return ActionOutcome(False, 404, str(exc))
    except InputError as exc:
        return ActionOutcome(False, 400, str(exc))
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
