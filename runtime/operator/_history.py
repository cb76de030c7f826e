"""The history API's models: what the CLI, the Python client and the console read about plans.

One history API (``STYLE`` rule 22). Every agent serves its plans from its durable store through
the ``Plans`` RPC (``protocol.PlansQuery``: filters, pages, how much each snapshot carries); the
``Operator`` asks every agent and turns their snapshots into these models, and everything that
shows plans reads them:

- ``HistoryFilter``: which plans (agent, status, goal text, free text, time range, trace);
- ``HistoryPage``: one page of ``PlanView`` summaries across the agents, newest first, with the
  next page's token and what could not be read;
- ``PlanHistory``: one plan and every sub-plan it caused on other agents, each a ``PlanView``
  whose ``StepView``\\ s say what ran: input, output, error, attempts, timing, revision, author;
- ``TraceSummary``: a trace and the plans of it (``stratagem trace`` with no id).

Values are structured JSON (never JSON inside a string); fields the audit log redacts are redacted
by the agent before they leave it. A page token is the ``Operator``'s: per-agent cursors and a
digest of the filter they were made for, so a token is refused (``InputError``) when it is
malformed or was made for another filter.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from stratagem.protocol import (
    PLAN_ID_PATTERN,
    TRACE_ID_PATTERN,
    GateInfo,
    PlanSnapshot,
    PlansQuery,
    StepRecord,
)
from stratagem.runtime.operator._input import DEFAULT_HISTORY_PAGE, InputError

__all__ = [
    "DEFAULT_HISTORY_PAGE",
    "HistoryFilter",
    "HistoryPage",
    "PlanHistory",
    "PlanView",
    "StepView",
    "TraceSummary",
    "check_plan_id",
    "decode_page_token",
    "encode_page_token",
    "plan_history",
    "plan_view",
    "step_view",
    "trace_summaries",
]

_PLAN_ID: Final = re.compile(PLAN_ID_PATTERN)
_TRACE_ID: Final = re.compile(TRACE_ID_PATTERN)
_TOKEN_VERSION: Final = 1
_EXHAUSTED: Final = "-"


def _when(seconds: float) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds > 0 else None


def _json_object(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}
    return value if isinstance(value, dict) else {"value": value}


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepView(_View):
    """What one step did.

    Attributes:
        id: The step.
        kind: ``tool``, ``cross_agent`` or ``gate``.
        does: The tool, ``"<agent>.<capability>"``, or the gate's prompt.
        status: The step's status (``succeeded``, ``failed``, ``blocked``, ``skipped``...).
        attempts: Attempts started.
        started: When the first attempt started (``None``: it never ran).
        ended: When the last attempt ended (``None``: not ended).
        input: The input it ran with, references resolved (``None`` when it has none).
        output: Its output (``None`` when it has none).
        failure_class: Its failure's class (``""``: none).
        message: Why it failed, or a gate's decision.
        revision: The plan revision that made the step as it is.
        author: Who made that revision (``""`` when unknown).
        cut: ``input`` or ``output`` was cut to fit (``full=True`` asks for whole values, as far
            as the message limit allows).
        depends_on: The steps it waits for.
        sub_plan: The plan this cross-agent step caused on its target (``""`` for other kinds).
    """

    id: str
    kind: str = ""
    does: str = ""
    status: str = ""
    attempts: int = 0
    started: datetime | None = None
    ended: datetime | None = None
    input: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    failure_class: str = ""
    message: str = ""
    revision: int = 0
    author: str = ""
    cut: bool = False
    depends_on: list[str] = Field(default_factory=list)
    sub_plan: str = ""

    @property
    def duration_s(self) -> float | None:
        """Seconds from the first attempt's start to the last one's end (``None`` if either is
        unknown)."""
        if self.started is None or self.ended is None:
            return None
        return max(0.0, (self.ended - self.started).total_seconds())


class PlanView(_View):
    """One plan as its agent's history has it.

    Attributes:
        plan_id: The plan.
        agent: The agent that owns it.
        revision: Its newest revision.
        status: Its status.
        goal: What it is for.
        created: When it was first stored.
        updated: When its status last changed.
        trace_id: The trace its runs belong to (``""`` when unknown).
        message: The last status's line (for a failed plan: which step, which class, why).
        failure: For a failed or cancelled plan, one line: which step, which class, why
            (``""`` otherwise).
        steps: What each step did (empty in a page of ``history``).
        plan: The typed plan as its agent stores it (``None`` in a page of ``history``).
        gates: Its open gates and those decided (who may decide, deadlines, the decision).
    """

    plan_id: str
    agent: str
    revision: int = 0
    status: str = ""
    goal: str = ""
    created: datetime | None = None
    updated: datetime | None = None
    trace_id: str = ""
    message: str = ""
    failure: str = ""
    steps: list[StepView] = Field(default_factory=list)
    plan: dict[str, Any] | None = None
    gates: list[GateInfo] = Field(default_factory=list)


class PlanHistory(_View):
    """One plan and every sub-plan it caused, from every agent (what ``plans show`` shows).

    Attributes:
        plan_id: The plan asked for.
        status: Its status.
        trace_id: Its trace (``""`` when unknown).
        failure: For a failed plan, one line naming the step where it went wrong, deepest sub-plan
            first: which agent, plan and step, which class, why (``""`` otherwise): ``failed_at``
            and ``cause`` joined by ``": "``.
        failed_at: Where it went wrong: the deepest failed plan, ``"AGENT plan PLAN_ID"``.
        cause: The deepest failed step, its class and why: ``"step 'ID' failed (CLASS): WHY"``
            (a plan that failed before any step ran, e.g. one that could not be planned, gives
            the step that asked for it and the plan's own reason).
        plans: The plan first, then its sub-plans by id.
        unreadable: What an agent could not read (one line each); the rest is here.
    """

    plan_id: str
    status: str = ""
    trace_id: str = ""
    failure: str = ""
    failed_at: str = ""
    cause: str = ""
    plans: list[PlanView] = Field(default_factory=list)
    unreadable: list[str] = Field(default_factory=list)


class HistoryPage(_View):
    """One page of the deployment's plans, newest first.

    Attributes:
        plans: Summaries (no steps, no plan body).
        next_page_token: Pass it as ``page_token`` for the next page (``""`` on the last).
        unreadable: What an agent could not read, or an agent that did not answer (one line
            each); the plans of the others are here.
        sub_plans: For a page of top-level plans (``history(top_level=True)``): how many
            sub-plans each caused, by plan id (empty otherwise).
    """

    plans: list[PlanView] = Field(default_factory=list)
    next_page_token: str = ""
    unreadable: list[str] = Field(default_factory=list)
    sub_plans: dict[str, int] = Field(default_factory=dict)


class TraceSummary(_View):
    """A trace and the plans that ran in it.

    Attributes:
        trace_id: The trace.
        plan_id: Its first plan (a goal's, when the trace is a goal's).
        goal: That plan's goal.
        status: That plan's status.
        created: When that plan was first stored.
        agents: The agents with plans in the trace.
        plans: How many plans ran in it.
    """

    trace_id: str
    plan_id: str
    goal: str = ""
    status: str = ""
    created: datetime | None = None
    agents: list[str] = Field(default_factory=list)
    plans: int = 0


class HistoryFilter(_View):
    """Which plans ``Operator.history`` lists; every field left empty matches every plan.

    Attributes:
        agent: Only this agent's plans (a role).
        status: Only plans in this status.
        goal: Only plans whose goal contains this text (case-insensitive).
        text: Only plans whose id, goal, steps, outputs or messages contain this text.
        since: Only plans created at or after this time.
        until: Only plans created before this time.
        trace_id: Only plans of this trace.
        plan_id: Only this plan and its sub-plans.
    """

    agent: str = ""
    status: str = ""
    goal: str = Field(default="", max_length=200)
    text: str = Field(default="", max_length=200)
    since: datetime | None = None
    until: datetime | None = None
    trace_id: str = ""
    plan_id: str = ""

    def digest(self) -> str:
        """A short digest of the filter: a page token made for another filter is refused."""
        data = self.model_dump_json()
        return hashlib.sha256(data.encode()).hexdigest()[:12]

    def check(self) -> None:
        """Refuse what no agent could answer, in one line naming the value and the valid form.

        (The agent and the status are checked by the ``Operator``, which knows the roles.)

        Raises:
            InputError: A malformed trace or plan id, or a time range that ends before it starts.
        """
        if self.trace_id and not _TRACE_ID.fullmatch(self.trace_id):
            raise InputError(
                f"trace id {self.trace_id!r} is malformed: a trace id is 32 lowercase hex "
                "characters (stratagem trace lists them)"
            )
        if self.plan_id:
            check_plan_id(self.plan_id)
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise InputError(
                f"the time range ends ({self.until.isoformat()}) before it starts "
                f"({self.since.isoformat()}): give --since earlier than --until"
            )

    def seconds(self) -> tuple[float, float]:
        """``since`` and ``until`` as seconds since the epoch (0 for no bound)."""
        return (
            self.since.timestamp() if self.since is not None else 0.0,
            self.until.timestamp() if self.until is not None else 0.0,
        )


def check_plan_id(plan_id: str) -> None:
    """Raise ``InputError`` unless ``plan_id`` is a well-formed plan id."""
    if not plan_id or not _PLAN_ID.fullmatch(plan_id):
        raise InputError(
            f"plan id {plan_id!r} is malformed: a plan id is 1 to 200 letters, digits and "
            "'_.:/-', starting with a letter or digit (stratagem plans list shows them)"
        )


# --- page tokens ------------------------------------------------------------------------------


def encode_page_token(query: HistoryFilter, cursors: dict[str, str | None]) -> str:
    """A page token: each agent's cursor (``None``: that agent has nothing more) and the digest
    of the filter; ``""`` when no agent has anything more."""
    if all(cursor is None for cursor in cursors.values()):
        return ""
    data = {
        "v": _TOKEN_VERSION,
        "f": query.digest(),
        "c": {role: _EXHAUSTED if cursor is None else cursor for role, cursor in cursors.items()},
    }
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str, query: HistoryFilter) -> dict[str, str | None]:
    """Each agent's cursor in ``token`` (``None``: nothing more there; an agent not named starts
    from its newest plan).

    Raises:
        InputError: The token is malformed, or was made for another filter.
    """
    if not token:
        return {}
    valid = (
        "pass the next_page_token of the previous page, with the same filters (none for the "
        "first page)"
    )
    shown = token if len(token) <= 40 else token[:40] + "…"
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        cursors = data["c"]
        if data["v"] != _TOKEN_VERSION or not isinstance(cursors, dict):
            raise ValueError("not a page token")
        parsed: dict[str, str | None] = {}
        for role, cursor in cursors.items():
            if not isinstance(role, str) or not isinstance(cursor, str):
                raise ValueError("not a page token")
            if cursor not in (_EXHAUSTED, "") and not cursor.isdigit():
                raise ValueError("not a page token")
            if cursor != _EXHAUSTED:
                PlansQuery(page_token=cursor)  # the agent's own bound (ValidationError: malformed)
            parsed[role] = None if cursor == _EXHAUSTED else cursor
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError):
        raise InputError(f"page token {shown!r} is malformed: {valid}") from None
    if data.get("f") != query.digest():
        raise InputError(f"page token {shown!r} was made for other filters: {valid}")
    return parsed


# --- from the wire ----------------------------------------------------------------------------


def step_view(record: StepRecord, plan_id: str) -> StepView:
    """A ``StepRecord`` of plan ``plan_id`` as a ``StepView`` (its JSON values parsed)."""
    return StepView(
        id=record.step_id,
        kind=record.kind,
        does=record.does,
        status=record.status,
        attempts=record.attempts,
        started=_when(record.started),
        ended=_when(record.ended),
        input=_json_object(record.input_json),
        output=_json_object(record.output_json),
        failure_class=record.failure_class,
        message=record.message,
        revision=record.revision,
        author=record.author,
        cut=record.cut,
        depends_on=list(record.depends_on),
        sub_plan=f"{plan_id}/{record.step_id}" if record.kind == "cross_agent" else "",
    )


def _failure(snapshot: PlanSnapshot) -> str:
    if snapshot.status == "failed":
        return snapshot.message or "the plan failed"
    if snapshot.status == "cancelled":
        return snapshot.message or "the plan was cancelled"
    return ""


def plan_view(snapshot: PlanSnapshot) -> PlanView:
    """A ``PlanSnapshot`` as a ``PlanView`` (its plan and steps parsed, when it carries them)."""
    plan = _json_object(snapshot.plan_json)
    return PlanView(
        plan_id=snapshot.plan_id,
        agent=snapshot.agent,
        revision=snapshot.revision,
        status=snapshot.status,
        goal=snapshot.goal,
        created=_when(snapshot.created),
        updated=_when(snapshot.updated),
        trace_id=snapshot.trace_id,
        message=snapshot.message,
        failure=_failure(snapshot),
        steps=[step_view(step, snapshot.plan_id) for step in snapshot.steps],
        plan=plan,
        gates=list(snapshot.gates),
    )


def _root_cause(
    views: dict[str, PlanView], view: PlanView, asked_by: tuple[str, StepView] | None = None
) -> tuple[str, str]:
    """Where under ``view`` it went wrong and why: the deepest failed plan and its failed step
    (class, message); a failed cross-agent step whose sub-plan failed too names the sub-plan's
    instead, and a sub-plan that failed before any step ran (it could not be planned) is named
    after the step that asked for it, with the sub-plan's reason."""
    where = f"{view.agent} plan {view.plan_id}"
    for step in view.steps:
        if step.status != "failed":
            continue
        sub = views.get(step.sub_plan) if step.sub_plan else None
        if sub is not None and sub.failure and sub is not view:
            return _root_cause(views, sub, (where, step))
        return where, f"step {step.id!r} failed ({step.failure_class or 'unknown'}): {step.message}"
    if not view.failure:
        return "", ""
    if asked_by is None:
        return where, view.failure
    parent, step = asked_by
    cause = f"step {step.id!r} failed ({step.failure_class or 'unknown'}): {view.failure}"
    return f"{where} (asked for by step {step.id!r} of {parent})", cause


def plan_history(plan_id: str, views: list[PlanView], unreadable: list[str]) -> PlanHistory:
    """The plan ``plan_id`` and its sub-plans, the plan first, with its root cause when failed."""
    ordered = sorted(views, key=lambda v: (v.plan_id != plan_id, v.plan_id, v.agent))
    by_id = {view.plan_id: view for view in ordered}
    top = by_id.get(plan_id)
    failed_at = cause = ""
    if top is not None and top.failure:
        failed_at, cause = _root_cause(by_id, top)
    failure = f"{failed_at}: {cause}" if cause else ""
    trace_id = top.trace_id if top is not None else ""
    if not trace_id:
        trace_id = next((view.trace_id for view in ordered if view.trace_id), "")
    return PlanHistory(
        plan_id=plan_id,
        status=top.status if top is not None else "",
        trace_id=trace_id,
        failure=failure,
        failed_at=failed_at,
        cause=cause,
        plans=ordered,
        unreadable=unreadable,
    )


def trace_summaries(views: list[PlanView], limit: int) -> list[TraceSummary]:
    """The traces of ``views`` (newest first), each summarized by its first plan."""
    traces: dict[str, list[PlanView]] = {}
    for view in views:
        if view.trace_id:
            traces.setdefault(view.trace_id, []).append(view)
    summaries = []
    for trace_id, plans in traces.items():
        first = min(plans, key=lambda v: (len(v.plan_id.split("/")), _seconds(v.created)))
        summaries.append(
            TraceSummary(
                trace_id=trace_id,
                plan_id=first.plan_id,
                goal=first.goal,
                status=first.status,
                created=first.created,
                agents=sorted({view.agent for view in plans}),
                plans=len(plans),
            )
        )
    summaries.sort(key=lambda s: _seconds(s.created), reverse=True)
    return summaries[:limit]


def _seconds(when: datetime | None) -> float:
    return when.timestamp() if when is not None else -math.inf
