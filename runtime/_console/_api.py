"""The console's JSON API under ``/api/``: the same reads and actions as its pages, for scripts
holding a session (``401`` without one, answered by the session guard). Actions need the session's
CSRF token in the ``X-CSRF-Token`` header (``GET /api/session`` gives it)."""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from stratagem.runtime._console._auth import CSRF_HEADER, Session
from stratagem.runtime._console._data import act
from stratagem.runtime._console._pages import _console, _offset, csrf_ok
from stratagem.runtime._input import InputError, PlanNotFoundError

__all__ = ["action", "agents", "audit", "gates", "plan", "plans", "session"]


def _json(data: Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status_code, headers={"Cache-Control": "no-store"})


async def session(request: Request) -> JSONResponse:
    """The session's CSRF token (what an action sends back in ``X-CSRF-Token``)."""
    record: Session = request.scope["session_record"]
    return _json({"csrf_token": record.csrf_token, "operator": "operator"})


async def plans(request: Request) -> JSONResponse:
    """``GET /api/plans?agent=&status=&q=&offset=``: one page of plans."""
    query = request.query_params
    try:
        page = await _console(request).data.plans(
            agent=query.get("agent") or None,
            status=query.get("status") or None,
            text=query.get("q", ""),
            offset=_offset(request),
        )
    except InputError as exc:
        return _json({"error": str(exc)}, 400)
    return _json(
        {
            "plans": [dataclasses.asdict(row) for row in page.rows],
            "total": page.total,
            "offset": page.offset,
            "next_offset": page.next_offset,
            "problems": page.problems,
        }
    )


async def plan(request: Request) -> JSONResponse:
    """``GET /api/plans/{id}``: a plan and its sub-plans, steps, gates and revisions."""
    plan_id = request.path_params["plan_id"]
    try:
        detail = await _console(request).data.plan(plan_id)
    except PlanNotFoundError as exc:
        return _json({"error": str(exc)}, 404)
    return _json(
        {
            "plan": dataclasses.asdict(detail.root),
            "subplans": [dataclasses.asdict(v) for v in detail.subplans],
            "gates": [
                dataclasses.asdict(g) for v in [detail.root, *detail.subplans] for g in v.gates
            ],
            "revisions": [r.model_dump(mode="json") for r in detail.revisions],
            "problems": detail.problems,
        }
    )


async def gates(request: Request) -> JSONResponse:
    """``GET /api/gates``: every gate waiting for a decision."""
    found, problems = await _console(request).data.gates()
    return _json({"gates": [dataclasses.asdict(g) for g in found], "problems": problems})


async def agents(request: Request) -> JSONResponse:
    """``GET /api/agents``: each agent's endpoint, health, capabilities and tools."""
    found = await _console(request).data.agents()
    return _json({"agents": [dataclasses.asdict(a) for a in found]})


async def audit(request: Request) -> JSONResponse:
    """``GET /api/audit``: the chain's verdict and its last records."""
    check, problem = await _console(request).data.audit(50)
    if check is None:
        return _json({"ok": None, "problem": problem}, 503)
    verdict = check.verdict
    return _json(
        {
            "ok": verdict.ok,
            "records": verdict.count,
            "first_broken_seq": verdict.first_broken_seq,
            "reason": verdict.reason,
            "signed_heads": verdict.sealed,
            "head": check.head,
            "last": [dataclasses.asdict(r) for r in check.last],
        }
    )


async def action(request: Request) -> JSONResponse:
    """``POST /api/actions/{action}`` with ``{"plan_id", "gate_id", "rationale"}``."""
    if not csrf_ok(request, request.headers.get(CSRF_HEADER)):
        return _json({"error": "refused: send the session's X-CSRF-Token"}, 403)
    try:
        body = await request.json()
    except ValueError:
        return _json({"error": "the body must be a JSON object"}, 400)
    if not isinstance(body, dict):
        return _json({"error": "the body must be a JSON object"}, 400)
    outcome = await act(
        _console(request).data,
        request.path_params["action"],
        str(body.get("plan_id", "")),
        str(body.get("gate_id", "")),
        str(body.get("rationale", "")),
    )
    return _json(
        {"ok": outcome.ok, "message": outcome.message, "status": outcome.plan_status},
        outcome.status_code,
    )
