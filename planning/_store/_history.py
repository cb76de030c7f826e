"""A store's history: which plans it holds, listed newest first, with filters and pages.

Beside each plan's revisions and journal a durable store keeps one **index row per plan**
(``plan_index``): its newest revision, status, goal, trace id, last status message, and when it
was created and last changed. The row is written with the plan (``save_plan``, ``save_revision``)
and with every status record (``commit``), in the same transaction, so it never disagrees with the
journal. ``StateStore.history`` reads it:

- newest first, by the row's number (``PlanSummary.cursor``), which grows as plans are created;
  ``HistoryQuery.after`` is the cursor of the last plan of the previous page (keyset paging: a plan
  created meanwhile is newer, so it never shifts a later page);
- filtered by plan id (the plan and its sub-plans), status, goal text, free text (the id, goal,
  last message, plan body and journal), creation time and trace id.

The SQL of both durable stores is built here (``where_clause``) from one description of the
filters; a dialect supplies its placeholder and its "contains" test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from stratagem.planning._plan import PlanStatus

__all__ = [
    "HistoryQuery",
    "PlanSummary",
    "matches",
    "sub_plan_range",
    "trace_id_of",
    "where_clause",
]

MAX_TEXT: Final = 200
"""The longest goal or text filter."""


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """Which plans ``StateStore.history`` lists, and how many.

    Attributes:
        plan_id: Only this plan and its sub-plans (ids starting with ``plan_id + "/"``); "" any.
        status: Only plans whose (newest revision's) status is this.
        goal: Only plans whose goal contains this text, case-insensitively.
        text: Only plans whose id, goal, last status message, plan body or journal (outputs,
            failure messages, gate prompts and rationales) contain this text, case-insensitively.
        since: Only plans created at or after this ``time.time()`` value.
        until: Only plans created before this ``time.time()`` value.
        trace_id: Only plans whose runs belong to this trace.
        after: Only plans listed after the one with this cursor (the previous page's last).
        limit: At most this many plans.
    """

    plan_id: str = ""
    status: PlanStatus | None = None
    goal: str = ""
    text: str = ""
    since: float | None = None
    until: float | None = None
    trace_id: str = ""
    after: int | None = None
    limit: int = 100


@dataclass(frozen=True, slots=True)
class PlanSummary:
    """One plan as a store's history lists it.

    Attributes:
        plan_id: The plan.
        revision: Its newest revision.
        status: That revision's last recorded status.
        goal: The plan's goal, as stored.
        created: When the plan was first stored (``time.time()``).
        updated: When its status last changed.
        trace_id: The trace of its first traced run ("" when none was).
        message: The last status record's message (a failed plan's: which step, class and why).
        cursor: Its place in the history: pass it as ``HistoryQuery.after`` for the plans after
            it.
    """

    plan_id: str
    revision: int
    status: PlanStatus
    goal: str
    created: float
    updated: float
    trace_id: str
    message: str
    cursor: int


def trace_id_of(trace_context: str) -> str:
    """The trace id of a W3C ``traceparent`` (``"00-<trace id>-<span id>-<flags>"``), or ""."""
    parts = trace_context.split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        return parts[1].lower()
    return ""


def sub_plan_range(plan_id: str) -> tuple[str, str]:
    """The bounds of the ids of ``plan_id``'s sub-plans: ``lower <= id < upper``.

    A sub-plan's id is ``plan_id + "/" + ...``; ``"0"`` follows ``"/"`` in every collation the
    stores use (byte order), so no wildcard of ``LIKE`` is needed (plan ids may hold ``_``).
    """
    return plan_id + "/", plan_id + "0"


Contains = Callable[[str, str], str]
"""A dialect's case-insensitive "the column contains the (lower-cased) parameter" test: given
the column expression and the placeholder, the SQL condition."""


def where_clause(
    query: HistoryQuery,
    *,
    mark: str,
    contains: Contains,
    journal_text: str,
) -> tuple[str, list[Any]]:
    """The ``WHERE`` condition (``"1 = 1"`` for none) over ``plan_index`` columns, and its
    parameters in order.

    Args:
        query: The filters.
        mark: The dialect's placeholder (``?`` or ``%s``).
        contains: The dialect's "contains" test.
        journal_text: The dialect's condition that the plan's bodies or journal contain the text
            (one placeholder per use of ``mark`` in it, each bound to the lower-cased text).
    """
    conditions: list[str] = []
    params: list[Any] = []
    if query.after is not None:
        conditions.append(f"id < {mark}")
        params.append(query.after)
    if query.plan_id:
        lower, upper = sub_plan_range(query.plan_id)
        conditions.append(f"(plan_id = {mark} OR (plan_id >= {mark} AND plan_id < {mark}))")
        params.extend([query.plan_id, lower, upper])
    if query.status is not None:
        conditions.append(f"status = {mark}")
        params.append(query.status.value)
    if query.goal:
        conditions.append(contains("goal", mark))
        params.append(query.goal.lower())
    if query.since is not None:
        conditions.append(f"created >= {mark}")
        params.append(query.since)
    if query.until is not None:
        conditions.append(f"created < {mark}")
        params.append(query.until)
    if query.trace_id:
        conditions.append(f"trace_id = {mark}")
        params.append(query.trace_id.lower())
    if query.text:
        needle = query.text.lower()
        tests = [contains(column, mark) for column in ("plan_id", "goal", "message")]
        conditions.append("(" + " OR ".join([*tests, journal_text]) + ")")
        params.extend([needle] * (len(tests) + journal_text.count(mark)))
    return (" AND ".join(conditions) or "1 = 1"), params


def matches(summary: PlanSummary, query: HistoryQuery, texts: Sequence[str] = ()) -> bool:
    """Whether ``summary`` passes ``query``'s filters (``texts``: the plan's body and journal
    as text, for ``query.text``); the in-memory store's filter, the SQL's twin."""
    if query.after is not None and summary.cursor >= query.after:
        return False
    if query.plan_id:
        lower, upper = sub_plan_range(query.plan_id)
        if summary.plan_id != query.plan_id and not lower <= summary.plan_id < upper:
            return False
    if query.status is not None and summary.status is not query.status:
        return False
    if query.goal and query.goal.lower() not in summary.goal.lower():
        return False
    if query.since is not None and summary.created < query.since:
        return False
    if query.until is not None and summary.created >= query.until:
        return False
    if query.trace_id and summary.trace_id != query.trace_id.lower():
        return False
    if query.text:
        needle = query.text.lower()
        fields = (summary.plan_id, summary.goal, summary.message, *texts)
        if not any(needle in field.lower() for field in fields):
            return False
    return True
