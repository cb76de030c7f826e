"""The operator's part for the plans' history: one page of the deployment's plans (``history``),
one plan and its sub-plans (``plan``, ``show``), the traces, every plan (``plans``), who holds a
plan (``owner``), its revisions and its replay, all read from every agent's durable store."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

from pydantic import ValidationError

from stratagem.protocol import (
    MAX_PLANS_PAGE,
    AgentClient,
    PlanSnapshot,
    PlansQuery,
    PlansView,
    ReplayResult,
    RevisionsResponse,
)
from stratagem.runtime.operator._history import (
    DEFAULT_HISTORY_PAGE,
    HistoryFilter,
    HistoryPage,
    PlanHistory,
    PlanView,
    TraceSummary,
    check_plan_id,
    decode_page_token,
    encode_page_token,
    plan_history,
    plan_view,
    trace_summaries,
)
from stratagem.runtime.operator._input import InputError, PlanNotFoundError, validation_line
from stratagem.runtime.operator._link import Link, check_status

__all__ = ["FINAL", "Plans"]

T = TypeVar("T")

FINAL = frozenset({"succeeded", "failed", "cancelled"})
"""The plan statuses that end it (``planning.PlanStatus.is_final``; not imported here)."""
_FIRST_SCAN = 1
"""A page of top-level plans first asks the agents for this many plans per plan wanted; then
for as many as the plans scanned so far held per top-level plan (10 for a demo goal)."""


def _moment(value: datetime | float | None) -> datetime | None:
    """A time bound as an aware datetime (epoch seconds are UTC; a naive datetime is local)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.astimezone()
    return datetime.fromtimestamp(value, UTC)


class Plans:
    """The plans' history API, through ``link``."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def history(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        goal: str | None = None,
        text: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        trace_id: str | None = None,
        plan_id: str | None = None,
        page_size: int = DEFAULT_HISTORY_PAGE,
        page_token: str = "",
        top_level: bool = False,
    ) -> HistoryPage:
        """One page of the deployment's plans, newest first, from every agent's durable store
        (whatever the agents hold in memory, across restarts): the history API.

        Args:
            agent: Only this agent's plans (a role).
            status: Only plans in this status (``running``, ``blocked``, ``failed``...).
            goal: Only plans whose goal contains this text (case-insensitive).
            text: Only plans whose id, goal, steps, outputs or messages contain this text.
            since: Only plans created at or after this time (a datetime or epoch seconds).
            until: Only plans created before this time.
            trace_id: Only plans of this trace.
            plan_id: Only this plan and its sub-plans.
            page_size: At most this many plans (1 to 1000).
            page_token: ``""`` for the first page, else the previous page's
                ``next_page_token`` (made for the same filters).
            top_level: Only plans that are no other plan's sub-plan (a goal's plan, a plan run
                by hand: no ``/`` in the id), each with how many sub-plans it caused
                (``HistoryPage.sub_plans``, counted on every agent).

        Returns:
            The page: plan summaries, the next page's token, and what an agent could not read
            (an agent that does not answer is named there; the others' plans are listed).

        Raises:
            InputError: A filter, page size or page token that is malformed or unknown (an
                unknown agent or status, a malformed trace or plan id, a range that ends before
                it starts, a token made for other filters).
        """
        query = self._history_filter(
            agent=agent,
            status=status,
            goal=goal,
            text=text,
            since=since,
            until=until,
            trace_id=trace_id,
            plan_id=plan_id,
        )
        if not 1 <= page_size <= MAX_PLANS_PAGE:
            raise InputError(f"page size must be from 1 to {MAX_PLANS_PAGE}, not {page_size}")
        cursors = decode_page_token(page_token, query)
        if not top_level:
            views, cursors, unreadable = await self._history_round(query, page_size, cursors)
            return HistoryPage(
                plans=views,
                next_page_token=encode_page_token(query, cursors),
                unreadable=unreadable,
            )
        # Rounds until the page holds page_size top-level plans or nothing is left; the plans
        # scanned on the way are the sub-plans folded under them.
        started_at_top = not page_token and query.until is None
        roots: list[PlanView] = []
        seen: list[PlanView] = []
        unreadable = []
        while len(roots) < page_size:
            need = page_size - len(roots)
            per_root = len(seen) / len(roots) if roots else (_FIRST_SCAN if not seen else 10)
            ask = min(MAX_PLANS_PAGE, max(need, math.ceil(need * per_root * 1.2)))
            views, cursors, problems = await self._history_round(
                query, ask, cursors, roots=page_size - len(roots)
            )
            unreadable.extend(problems)
            seen.extend(views)
            roots.extend(view for view in views if "/" not in view.plan_id)
            if not views or all(cursor is None for cursor in cursors.values()):
                break
        counts = await self._sub_plan_counts(roots, seen, exact_from_scan=started_at_top)
        return HistoryPage(
            plans=roots,
            next_page_token=encode_page_token(query, cursors),
            unreadable=unreadable,
            sub_plans=counts,
        )

    async def _history_round(
        self,
        query: HistoryFilter,
        page_size: int,
        cursors: dict[str, str | None],
        *,
        roots: int = 0,
    ) -> tuple[list[PlanView], dict[str, str | None], list[str]]:
        """One merged page of every agent's history after ``cursors``: the plans (at most
        ``page_size``; with ``roots``, cut after that many top-level ones), each agent's cursor
        after them, and what could not be read."""
        roles = (query.agent,) if query.agent else self._link.roles
        asked = [role for role in roles if role not in cursors or cursors[role] is not None]
        wire = self._plans_query(query, page_size=page_size, view="summary")
        found, unreadable = await self._link.each(
            asked,
            lambda role, client: client.history(
                wire.model_copy(update={"page_token": cursors.get(role) or ""})
            ),
        )
        # Each agent's order: newest first, or for a plan and its sub-plans the order they were
        # made (the plan first); the merge keeps it, so each agent's part is a prefix of its page.
        way = 1 if query.plan_id else -1
        merged = sorted(
            ((role, snapshot) for role, page in found for snapshot in page.plans),
            key=lambda item: (way * item[1].created, item[1].agent, item[1].plan_id),
        )
        taken = merged[:page_size]
        if roots:
            tops = [i for i, (_, snapshot) in enumerate(taken) if "/" not in snapshot.plan_id]
            if len(tops) >= roots:  # cut after the last top-level plan wanted
                taken = taken[: tops[roots - 1] + 1]
        next_cursors: dict[str, str | None] = {role: cursors[role] for role in cursors}
        for role, page in found:
            mine = [snapshot for owner, snapshot in taken if owner == role]
            unreadable.extend(f"{role}: {line}" for line in page.unreadable)
            if len(mine) == len(page.plans):  # everything it sent was taken
                next_cursors[role] = page.next_page_token or None
            elif mine:
                next_cursors[role] = mine[-1].cursor
            else:
                next_cursors[role] = cursors.get(role) or ""
        for role in asked:
            next_cursors.setdefault(role, cursors.get(role) or "")
        return [plan_view(snapshot) for _, snapshot in taken], next_cursors, unreadable

    async def _sub_plan_counts(
        self, roots: Sequence[PlanView], seen: Sequence[PlanView], *, exact_from_scan: bool
    ) -> dict[str, int]:
        """How many sub-plans each of ``roots`` caused. A sub-plan is made after its plan and,
        once the plan ended, never again: a scan from the newest plan saw them all, and so did
        any scan for a plan that ended before the newest plan scanned was made; the others are
        asked for (their sub-plans, on every agent)."""
        counts = {root.plan_id: 0 for root in roots}
        for view in seen:
            top = view.plan_id.split("/", 1)[0]
            if top != view.plan_id and top in counts:
                counts[top] += 1
        if exact_from_scan or not seen:
            return counts
        newest = max((view.created for view in seen if view.created is not None), default=None)
        unsure = [
            root.plan_id
            for root in roots
            if root.status not in FINAL
            or root.updated is None
            or newest is None
            or root.updated >= newest
        ]

        async def count(plan_id: str) -> tuple[str, int]:
            query = PlansQuery(plan_id=plan_id, page_size=MAX_PLANS_PAGE, view="summary")
            snapshots, _ = await self.every_page(self._link.roles, query)
            return plan_id, sum(1 for s in snapshots if s.plan_id != plan_id)

        counts.update(await asyncio.gather(*(count(plan_id) for plan_id in unsure)))
        return counts

    async def plan(self, plan_id: str, *, full: bool = False) -> PlanHistory:
        """One plan and every sub-plan it caused, from every agent's store: what each step did
        (input, output, error, attempts, timing, revision, author), and for a failed plan the one
        line naming where it went wrong (what ``plans show`` prints).

        Args:
            plan_id: The plan.
            full: Step values whole, as far as the message limit allows (else long values are
                cut, and the step says so).

        Raises:
            InputError: A malformed plan id.
            PlanNotFoundError: No agent holds it.
        """
        check_plan_id(plan_id)
        query = PlansQuery(plan_id=plan_id, view="steps", full=full)
        snapshots, unreadable = await self.every_page(self._link.roles, query)
        if not snapshots:
            raise PlanNotFoundError(plan_id)
        return plan_history(plan_id, [plan_view(s) for s in snapshots], unreadable)

    async def traces(self, *, limit: int = 20) -> list[TraceSummary]:
        """The most recent traces (newest first), each with the plans that ran in it, read from
        the agents' histories (what ``stratagem trace`` with no id lists)."""
        if not 1 <= limit <= MAX_PLANS_PAGE:
            raise InputError(f"limit must be from 1 to {MAX_PLANS_PAGE}, not {limit}")
        views: list[PlanView] = []
        token = ""
        # Newest first: a trace's first plan comes after its sub-plans, so read past the limit.
        for _ in range(10):
            page = await self.history(page_size=MAX_PLANS_PAGE // 5, page_token=token)
            views.extend(page.plans)
            token = page.next_page_token
            if not token or len({v.trace_id for v in views if v.trace_id}) > limit:
                break
        return trace_summaries(views, limit)

    async def plans(self, *, agent: str | None = None, status: str | None = None) -> list[PlanView]:
        """Every plan in the agents' stores (``agent``'s only; in ``status`` only), by agent and
        id: every page of ``history``."""
        views: list[PlanView] = []
        token = ""
        while True:
            page = await self.history(
                agent=agent, status=status, page_size=MAX_PLANS_PAGE, page_token=token
            )
            views.extend(page.plans)
            token = page.next_page_token
            if not token:
                return sorted(views, key=lambda v: (v.agent, v.plan_id))

    async def show(self, plan_id: str) -> list[PlanView]:
        """The plan and every sub-plan it caused, from every agent (the owner's first): the
        ``plans`` of ``plan(plan_id)``.

        Raises:
            PlanNotFoundError: No agent holds it.
        """
        return (await self.plan(plan_id)).plans

    async def owner(self, plan_id: str) -> str:
        """The role of the agent that holds ``plan_id`` (asked through each agent's ``Plans``).

        Raises:
            InputError: A malformed plan id.
            PlanNotFoundError: No agent holds it.
        """
        check_plan_id(plan_id)
        query = PlansQuery(plan_id=plan_id, page_size=1, view="summary")

        async def holds(client: AgentClient) -> bool:
            page = await client.history(query)
            return any(snapshot.plan_id == plan_id for snapshot in page.plans)

        for role, held in await self._link.across(self._link.roles, holds):
            if held:
                return role
        raise PlanNotFoundError(plan_id)

    def _history_filter(
        self,
        *,
        agent: str | None,
        status: str | None,
        goal: str | None,
        text: str | None,
        since: datetime | float | None,
        until: datetime | float | None,
        trace_id: str | None,
        plan_id: str | None,
    ) -> HistoryFilter:
        if agent is not None:
            self._link.check_role(agent)
        if status is not None:
            check_status(status)
        try:
            query = HistoryFilter(
                agent=agent or "",
                status=status or "",
                goal=goal or "",
                text=text or "",
                since=_moment(since),
                until=_moment(until),
                trace_id=trace_id or "",
                plan_id=plan_id or "",
            )
        except ValidationError as exc:
            raise InputError(validation_line("history filter", exc)) from exc
        query.check()
        return query

    @staticmethod
    def _plans_query(query: HistoryFilter, *, page_size: int, view: PlansView) -> PlansQuery:
        since, until = query.seconds()
        return PlansQuery(
            plan_id=query.plan_id,
            page_size=page_size,
            status=query.status,
            goal=query.goal,
            text=query.text,
            since=since,
            until=until,
            trace_id=query.trace_id,
            view=view,
        )

    async def every_page(
        self, roles: Sequence[str], query: PlansQuery
    ) -> tuple[list[PlanSnapshot], list[str]]:
        """Every page of ``query`` from each of ``roles``, and what could not be read."""

        async def pages(role: str, client: AgentClient) -> tuple[list[PlanSnapshot], list[str]]:
            snapshots: list[PlanSnapshot] = []
            problems: list[str] = []
            token = ""
            while True:
                page = await client.history(query.model_copy(update={"page_token": token}))
                snapshots.extend(page.plans)
                problems.extend(f"{role}: {line}" for line in page.unreadable)
                token = page.next_page_token
                if not token:
                    return snapshots, problems

        found, unreadable = await self._link.each(roles, pages)
        snapshots = [snapshot for _, (got, _) in found for snapshot in got]
        unreadable.extend(line for _, (_, problems) in found for line in problems)
        return snapshots, unreadable

    async def on_owner(self, plan_id: str, send: Callable[[AgentClient], Awaitable[T]]) -> T:
        """``send`` to the agent that holds ``plan_id``.

        Raises:
            InputError: A malformed plan id.
            PlanNotFoundError: No agent holds it.
        """
        owner = await self.owner(plan_id)
        endpoints, _ = await self._link.find((owner,))
        return await send(self._link.client(endpoints[owner]))

    async def revisions(self, plan_id: str) -> RevisionsResponse:
        """The plan's revision history on its owner, oldest first."""
        return await self.on_owner(plan_id, lambda client: client.revisions(plan_id))

    async def replay(
        self,
        plan_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline sent with the call)
    ) -> ReplayResult:
        """Re-run a finished plan on its owner from its recorded outputs (no side effects) and
        compare every decision; ``ReplayResult.diverged`` says whether any differs."""
        return await self.on_owner(plan_id, lambda c: c.replay(plan_id, timeout=timeout))
