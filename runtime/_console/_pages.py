"""The console's pages: server-rendered HTML, htmx fragments, the live stream (SSE).

Every handler reads through ``ConsoleData`` (the operator API); what one agent, the trace backend
or the audit store cannot answer is named on the page while the rest of it is shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import parse_qs, quote, urlencode

from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from stratagem.protocol import PlanEvent
from stratagem.runtime._console._app import Console
from stratagem.runtime._console._auth import CSRF_FIELD, CSRF_HEADER, Session
from stratagem.runtime._console._data import (
    FINAL_STATUSES,
    READ_ERRORS,
    ActionOutcome,
    act,
    decision_from_form,
    problem_line,
)
from stratagem.runtime._console._research import claim_view, investigation_views, knowledge_view
from stratagem.runtime.operator._input import InputError, PlanNotFoundError

__all__ = [
    "action",
    "agent",
    "agents",
    "audit",
    "gates",
    "home",
    "live",
    "login",
    "logout",
    "not_found",
    "plan",
    "plan_body",
    "plans",
    "status",
    "trace",
]

logger = logging.getLogger(__name__)

KEEPALIVE_S: Final = 15.0
"""A comment goes down an idle live stream this often (proxies close silent ones)."""
AUDIT_RECORDS: Final = 50
"""The last audit records the audit page lists."""
RELOAD_ON: Final = frozenset({"blocked", "paused", "running", *FINAL_STATUSES})
"""Plan statuses after which the plan's page body is drawn again (gates appear, outputs...)."""
STEP_DONE: Final = frozenset({"succeeded", "failed", "blocked", "skipped", "cancelled"})
"""Step statuses after which the page body is drawn again (the step's output, its error)."""


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _session(request: Request) -> Session:
    session: Session = request.scope["session_record"]
    return session


MAX_FORM_BYTES: Final = 64 * 1024
"""The largest form an action takes (a rationale is at most 2,000 characters)."""


async def _form(request: Request) -> dict[str, str]:
    """An action's form fields (``application/x-www-form-urlencoded``, as browsers and htmx send
    them); empty when the body is too large or not such a form."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


def _missing(request: Request, what: str, message: str) -> HTMLResponse:
    return _console(request).page(request, "missing.html", 404, what=what, message=message)


async def not_found(request: Request, exc: Exception) -> Response:
    """A 404 page naming the path (any route that does not exist)."""
    if request.url.path.startswith("/api/"):
        from starlette.responses import JSONResponse

        code = exc.status_code if isinstance(exc, HTTPException) else 404
        return JSONResponse({"error": f"no such path: {request.url.path}"}, status_code=code)
    return _missing(request, "page", f"no page at {request.url.path}")


# -- signing in ----------------------------------------------------------------------------------


async def login(request: Request) -> Response:
    """Spend the one-time login token for a session cookie; a page that goes on to the plans.

    The answer is a page, not a redirect: the next request then starts from the console's own
    origin, so the ``SameSite=Strict`` cookie goes with it.
    """
    console = _console(request)
    session = console.sessions.sign_in(request.query_params.get("token", ""))
    if session is None:
        return console.page(request, "signin.html", 403, spent=True)
    request.scope["session_record"] = session
    response = console.page(request, "signedin.html")
    response.set_cookie(
        console.config.cookie_name,
        session.session_id,
        httponly=True,
        samesite="strict",
        secure=console.config.secure_cookie,
        path="/",
    )
    return response


def _filters(request: Request) -> dict[str, str]:
    """The plans list's filters from a query string (the same names on pages and the API)."""
    query = request.query_params
    return {
        "agent": query.get("agent", ""),
        "status": query.get("status", ""),
        "goal": query.get("goal", ""),
        "text": query.get("q", ""),
        "trace_id": query.get("trace", ""),
        "since": query.get("since", ""),
        "until": query.get("until", ""),
    }


def csrf_ok(request: Request, sent: str | None) -> bool:
    """Whether an action carries this session's CSRF token and, if the browser says where it
    comes from, comes from the console's own origin."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        return False
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    return _session(request).csrf_ok(sent)


async def logout(request: Request) -> Response:
    """End the session."""
    form = await _form(request)
    if not csrf_ok(request, form.get(CSRF_FIELD, "")):
        return HTMLResponse("refused: not from this console's page", status_code=403)
    console = _console(request)
    console.sessions.sign_out(_session(request).session_id)
    response = console.page(request, "signin.html", signed_out=True)
    response.delete_cookie(console.config.cookie_name, path="/")
    return response


async def home(request: Request) -> Response:
    """The plans."""
    return RedirectResponse("/plans", status_code=303)


# -- plans ---------------------------------------------------------------------------------------


async def plans(request: Request) -> Response:
    """The plans, newest first, filtered as the history API filters them, a page at a time;
    goals first (each top-level plan a row, its sub-plans counted) unless ``all=1`` or a filter
    other than time."""
    from stratagem.planning import PlanStatus

    console = _console(request)
    filters = _filters(request)
    token = request.query_params.get("page", "")
    every = request.query_params.get("all", "") == "1"  # the expand control: sub-plans too
    context: dict[str, Any] = {
        "filters": filters,
        "every": every,
        "roles": console.data.roles,
        "statuses": [s.value for s in PlanStatus],
    }
    try:
        page = await console.data.plans(**filters, page_token=token, every=every)
    except InputError as exc:
        return console.page(request, "plans.html", 400, page=None, error=str(exc), **context)
    except READ_ERRORS as exc:  # no agent could be asked at all: say why, keep the filters
        return console.page(request, "plans.html", page=None, error=problem_line(exc), **context)
    query = {
        "q" if k == "text" else "trace" if k == "trace_id" else k: v
        for k, v in filters.items()
        if v
    }
    if every:
        query["all"] = "1"
    context["next_url"] = (
        f"/plans?{urlencode({**query, 'page': page.next_token})}" if page.next_token else ""
    )
    context["first_url"] = "" if page.first else f"/plans?{urlencode(query)}"
    template = "plans_table.html" if request.headers.get("hx-target") == "plans" else "plans.html"
    return console.page(request, template, page=page, error="", **context)


async def _plan_context(request: Request, plan_id: str) -> dict[str, Any] | None:
    console = _console(request)
    try:
        detail = await console.data.plan(plan_id)
    except PlanNotFoundError:
        return None
    return {"detail": detail, "plan_id": plan_id}


async def plan(request: Request) -> Response:
    """One plan: its DAG, steps, sub-plans, gates, revisions, events (live) and trace."""
    plan_id = request.path_params["plan_id"]
    console = _console(request)
    try:
        context = await _plan_context(request, plan_id)
    except InputError as exc:
        return _missing(request, "plan", str(exc))
    except READ_ERRORS as exc:
        return console.page(
            request,
            "missing.html",
            502,
            what="plan",
            title=f"Cannot show plan {plan_id}",
            message=problem_line(exc),
        )
    if context is None:
        return _missing(request, "plan", f"no plan {plan_id!r} on any agent")
    return console.page(
        request, "plan.html", quoted=quote(plan_id, safe="/"), drawn=time.time(), **context
    )


async def plan_body(request: Request) -> Response:
    """The part of a plan's page that changes as it runs (drawn again when its status does)."""
    plan_id = request.path_params["plan_id"]
    console = _console(request)
    try:
        context = await _plan_context(request, plan_id)
    except READ_ERRORS as exc:
        return HTMLResponse(
            console.fragment("problems.html", problems=[f"plan: {problem_line(exc)}"]),
            status_code=502,
        )
    if context is None:
        return _missing(request, "plan", f"no plan {plan_id!r} on any agent")
    return console.page(request, "plan_body.html", **context)


TRACE_ID: Final = re.compile(r"^[0-9a-f]{32}$")


async def trace(request: Request) -> Response:
    """A trace as a waterfall (loaded after the plan's page: a slow backend delays only this)."""
    from stratagem.runtime._console._trace import load_trace

    trace_id = request.path_params["trace_id"]
    console = _console(request)
    if not TRACE_ID.match(trace_id):
        return HTMLResponse(
            console.fragment("outcome.html", ok=False, message=f"{trace_id!r} is no trace id"),
            status_code=404,
        )
    view = await asyncio.to_thread(load_trace, console.config.settings, trace_id)
    return console.page(request, "trace.html", view=view, trace_id=trace_id)


# -- the live stream -----------------------------------------------------------------------------


def _frame(event: str, data: str, event_id: int | None = None) -> str:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines += [f"data: {line}" for line in (data.splitlines() or [""])]
    return "\n".join(lines) + "\n\n"


async def live(request: Request) -> Response:
    """The plan's events as Server-Sent Events, from the owner's Watch stream: stored events
    first, then live ones, until the plan ends (``end``). Each ``update`` carries the HTML that
    changes (status badges, one more event line); ``reload`` asks the page to draw the plan's body
    again. A browser that reconnects says the last event it got and is sent only later ones."""
    plan_id = request.path_params["plan_id"]
    console = _console(request)
    raw_last = request.headers.get("last-event-id", "0")
    last = int(raw_last) if raw_last.isdigit() and len(raw_last) < 10 else 0
    try:  # when the page was drawn: older events are in it already, and ask for no redraw
        after = float(request.query_params.get("after", "0"))
    except ValueError:
        after = 0.0

    session: Session = request.scope["session_record"]
    slot = console.live.take(session.session_id)
    if isinstance(slot, str):
        logger.warning("live stream of %s refused: %s", plan_id, slot)
        return Response(
            f"refused: {slot}\n",
            status_code=429,
            media_type="text/plain",
            headers={"Retry-After": "5", "Cache-Control": "no-store"},
        )
    release = slot

    async def stream() -> AsyncIterator[str]:
        queue: asyncio.Queue[PlanEvent | BaseException | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in console.data.operator.watch(plan_id):
                    queue.put_nowait(event)
                queue.put_nowait(None)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # any failure is reported to the page, then the end
                queue.put_nowait(exc)

        task = asyncio.create_task(pump())
        seen = 0
        try:
            yield ": stream open\n\n"
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                if item is None:
                    break
                if isinstance(item, BaseException):
                    why = (
                        str(item)
                        if isinstance(item, PlanNotFoundError)
                        else problem_line(item)
                        if isinstance(item, READ_ERRORS)
                        else "the live stream failed"
                    )
                    if not isinstance(item, READ_ERRORS):
                        logger.warning("live stream of %s failed", plan_id, exc_info=item)
                    yield _frame("problem", console.fragment("live_problem.html", message=why))
                    break
                seen += 1
                if seen <= last:
                    continue
                yield _frame(
                    "update", console.fragment("live_event.html", event=item, root=plan_id), seen
                )
                # The page asks for its body again (at most once per quiet 300 ms: htmx's
                # delay) when a plan changes status or a step ends: outputs, errors and gates
                # come from the history API, never from the event itself.
                if item.timestamp > after and item.status in (
                    STEP_DONE if item.step_id else RELOAD_ON
                ):
                    yield _frame("reload", "")
            yield _frame("end", "")
        finally:
            release()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # The slot is given back when the stream ends, and (if the client left before the stream
    # started, so its ``finally`` never ran) after the response, whichever comes first.
    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        background=BackgroundTask(release),
    )


# -- gates and actions ---------------------------------------------------------------------------


async def gates(request: Request) -> Response:
    """Every gate waiting for a decision, with approve and reject."""
    console = _console(request)
    found, problems = await console.data.gates()
    return console.page(request, "gates.html", gates=found, problems=problems)


async def action(request: Request) -> Response:
    """Approve, reject, pause, cancel or resume from a page's form (CSRF-checked); answers the
    line a page shows where the form was."""
    console = _console(request)
    form = await _form(request)
    sent = form.get(CSRF_FIELD, "") or request.headers.get(CSRF_HEADER)
    if not csrf_ok(request, sent):
        return HTMLResponse(
            console.fragment(
                "outcome.html", ok=False, message="refused: not from this console's page"
            ),
            status_code=403,
        )
    try:
        decision = decision_from_form(form)
    except InputError as exc:
        outcome = ActionOutcome(False, 400, f"not sent: {exc}")
    else:
        outcome = await act(
            console.data,
            request.path_params["action"],
            form.get("plan_id", ""),
            form.get("gate_id", ""),
            form.get("rationale", ""),
            decision,
        )
    body = console.fragment("outcome.html", ok=outcome.ok, message=outcome.message)
    # htmx swaps only 2xx answers by default; the line says what went wrong either way.
    status = outcome.status_code if request.headers.get("hx-request") is None else 200
    return HTMLResponse(body, status_code=status)


# -- agents and audit ----------------------------------------------------------------------------


async def agents(request: Request) -> Response:
    """Each agent's endpoint, health, capabilities and tools; their status loads after."""
    console = _console(request)
    return console.page(request, "agents.html", agents=await console.data.agents(), role="")


async def agent(request: Request) -> Response:
    """One agent."""
    console = _console(request)
    role = request.path_params["role"]
    if role not in console.data.roles:
        return _missing(
            request,
            "agent",
            f"no agent {role!r} in this deployment; agents are: {', '.join(console.data.roles)}",
        )
    return console.page(request, "agents.html", agents=[await console.data.agent(role)], role=role)


async def status(request: Request) -> Response:
    """How the agents are doing: node, process, recent restarts, plans running and blocked,
    why one gave up (asked in this process through the operator API)."""
    console = _console(request)
    return console.page(request, "status.html", view=await console.status.view())


async def audit(request: Request) -> Response:
    """The audit chain's verification and its last records."""
    console = _console(request)
    check, problem = await console.data.audit(AUDIT_RECORDS)
    return console.page(request, "audit.html", check=check, problem=problem)


_CLAIM_ID = re.compile(r"c-[0-9a-f]{12}")
_INVESTIGATION_ID = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


async def knowledge(request: Request) -> Response:
    """The knowledge base: each kept claim, its confidence and flags (``?q=`` recalls by words)."""
    console = _console(request)
    query = request.query_params.get("q", "")[:2000]
    entries, problem = await knowledge_view(console.data.operator.settings, query)
    return console.page(request, "knowledge.html", entries=entries, problem=problem, q=query)


async def claim(request: Request) -> Response:
    """One claim and the passages it cites, the cited lines marked in the file as it is now."""
    console = _console(request)
    claim_id = request.path_params["claim_id"]
    if not _CLAIM_ID.fullmatch(claim_id):
        return _missing(request, "claim", f"{claim_id[:80]!r} is no claim id (c- and 12 hex)")
    entry, passages, problem = await claim_view(console.data.operator.settings, claim_id)
    if entry is None and not problem:
        return _missing(request, "claim", f"no claim {claim_id} in the knowledge base")
    return console.page(request, "claim.html", entry=entry, passages=passages, problem=problem)


async def hypotheses(request: Request) -> Response:
    """The investigations plans track: hypotheses, the leading one, the root cause."""
    console = _console(request)
    found, problem = await investigation_views(console.data.operator.settings)
    return console.page(request, "hypotheses.html", investigations=found, problem=problem)


async def investigation(request: Request) -> Response:
    """One investigation: context, hypotheses ranked with evidence, decision table, outcome."""
    console = _console(request)
    name = request.path_params["investigation"]
    if not _INVESTIGATION_ID.fullmatch(name):
        return _missing(request, "investigation", f"{name[:80]!r} is no investigation id")
    found, problem = await investigation_views(console.data.operator.settings, name)
    if not found and not problem:
        return _missing(request, "investigation", f"no investigation {name}")
    item = found[0] if found else None
    ranked = item.tracker.ranked() if item else []
    return console.page(request, "investigation.html", item=item, ranked=ranked, problem=problem)
