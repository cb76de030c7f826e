"""What the console shows, read through the history API (``Operator.history``, ``plan``,
``watch``: the one the CLI and the Python client read) and the operator API's other reads
(revisions, agents' health and cards), plus the audit chain's verification. Each read names what
could not be read (an agent down, a store unreadable) instead of failing the whole page.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from stratagem.protocol import PlanRevision, ProtocolError, RemoteError
from stratagem.runtime._auditing import AuditCheck
from stratagem.runtime._diagram import plan_diagram
from stratagem.runtime._history import PlanHistory, PlanView, StepView
from stratagem.runtime._input import InputError, PlanNotFoundError
from stratagem.runtime._local import LaunchError
from stratagem.runtime._operator import Operator
from stratagem.runtime._restarts import gave_up_reason

__all__ = [
    "ACTIONS",
    "FINAL_STATUSES",
    "MAX_BLOCKED",
    "PAGE_SIZE",
    "ActionOutcome",
    "AgentView",
    "ConsoleData",
    "Gate",
    "PlanDetail",
    "PlansPage",
    "act",
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
    """

    plans: list[PlanView]
    next_token: str
    first: bool
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Gate:
    """A gate waiting for a decision: the plan (as the history API has it) and the step."""

    plan: PlanView
    step: StepView

    @property
    def prompt(self) -> str:
        """What it asks."""
        if self.step.kind == "gate":
            return self.step.does
        return f"reconcile step {self.step.id} ({self.step.does}): did its effect happen?"


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
    ) -> PlansPage:
        """One page of the plans, newest first (the history API's ``history``).

        Raises:
            InputError: A filter or page token that is malformed or unknown.
        """
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
        )
        more = page.next_page_token if len(page.plans) == PAGE_SIZE else ""
        return PlansPage(page.plans, more, not page_token, list(page.unreadable))

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
