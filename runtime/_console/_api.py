"""The console's JSON API under ``/api/``: the same reads and actions as its pages, for scripts
holding a session (``401`` without one, answered by the session guard). Actions need the session's
CSRF token in the ``X-CSRF-Token`` header (``GET /api/session`` gives it); their body is at most
``MAX_ACTION_BYTES`` (else ``413``, read no further) and nested at most ``MAX_JSON_DEPTH`` deep
(else ``400``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse

from stratagem.protocol import InvalidArgumentError, json_object
from stratagem.runtime._console._auth import CSRF_HEADER, Session
from stratagem.runtime._console._data import READ_ERRORS, Gate, act, problem_line
from stratagem.runtime._console._pages import _console, _filters, csrf_ok
from stratagem.runtime.operator._input import InputError, PlanNotFoundError

__all__ = ["MAX_ACTION_BYTES", "action", "agents", "audit", "gates", "plan", "plans", "session"]

MAX_ACTION_BYTES: Final = 64 * 1024
"""The largest body an action takes (a plan id, a gate id and a rationale fit many times)."""


def _json(data: Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status_code, headers={"Cache-Control": "no-store"})


async def session(request: Request) -> JSONResponse:
    """The session's CSRF token (what an action sends back in ``X-CSRF-Token``)."""
    record: Session = request.scope["session_record"]
    return _json({"csrf_token": record.csrf_token, "operator": "operator"})


async def plans(request: Request) -> JSONResponse:
    """``GET /api/plans?agent=&status=&goal=&q=&trace=&since=&until=&page=``: one page of the
    history API's plans, newest first; ``next_page_token`` goes in ``page`` for the next."""
    try:
        page = await _console(request).data.plans(
            **_filters(request), page_token=request.query_params.get("page", ""), every=True
        )
    except InputError as exc:
        return _json({"error": str(exc)}, 400)
    except READ_ERRORS as exc:
        return _json({"error": problem_line(exc)}, 502)
    return _json(
        {
            "plans": [view.model_dump(mode="json") for view in page.plans],
            "next_page_token": page.next_token,
            "unreadable": page.problems,
        }
    )


def _gate(gate: Gate) -> dict[str, Any]:
    return {
        "plan_id": gate.plan.plan_id,
        "agent": gate.plan.agent,
        "revision": gate.plan.revision,
        "gate_id": gate.step.id,
        "prompt": gate.prompt,
    }


async def plan(request: Request) -> JSONResponse:
    """``GET /api/plans/{id}``: the history API's plan (with its sub-plans and what each step
    did), its revisions and its open gates."""
    plan_id = request.path_params["plan_id"]
    try:
        detail = await _console(request).data.plan(plan_id)
    except PlanNotFoundError as exc:
        return _json({"error": str(exc)}, 404)
    except InputError as exc:
        return _json({"error": str(exc)}, 400)
    return _json(
        {
            **detail.history.model_dump(mode="json"),
            "revisions": [r.model_dump(mode="json") for r in detail.revisions],
            "gates": [_gate(g) for g in detail.gates],
            "problems": detail.problems,
        }
    )


async def gates(request: Request) -> JSONResponse:
    """``GET /api/gates``: every gate waiting for a decision."""
    found, problems = await _console(request).data.gates()
    return _json({"gates": [_gate(g) for g in found], "problems": problems})


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
    raw = await _bounded_body(request, MAX_ACTION_BYTES)
    if raw is None:
        return _json({"error": f"the body is larger than {MAX_ACTION_BYTES} bytes"}, 413)
    try:
        body = json_object(raw.decode("utf-8"), "the body")
    except UnicodeDecodeError:
        return _json({"error": "the body is not UTF-8"}, 400)
    except InvalidArgumentError as exc:
        return _json({"error": exc.message}, 400)
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


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or ``None`` once it is known to be longer than ``limit`` (by its
    ``Content-Length`` or by what arrived: the rest is not read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
