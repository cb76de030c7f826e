"""The console's JSON API under ``/api/``: the same reads and actions as its pages, for scripts
holding a session (``401`` without one, answered by the session guard). Actions need the session's
CSRF token in the ``X-CSRF-Token`` header (``GET /api/session`` gives it); their body is at most
``MAX_ACTION_BYTES`` (else ``413``, read no further) and nested at most ``MAX_JSON_DEPTH`` deep
(else ``400``). An approval decides what the CLI's ``approve`` can (``value``, ``arguments``,
``output``), and ``/api/gates`` says what each gate asks."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse

from stratagem.protocol import InvalidArgumentError, json_object
from stratagem.runtime._console._auth import CSRF_HEADER, Session
from stratagem.runtime._console._data import READ_ERRORS, Decision, Gate, act, problem_line
from stratagem.runtime._console._pages import _console, _filters, csrf_ok
from stratagem.runtime._console._research import claim_view, investigation_views, knowledge_view
from stratagem.runtime.operator._input import InputError, PlanNotFoundError

__all__ = ["MAX_ACTION_BYTES", "action", "agents", "audit", "gates", "plan", "plans", "session"]

MAX_ACTION_BYTES: Final = 64 * 1024
"""The largest body an action takes (a plan id, a gate id and a rationale fit many times)."""

TEXT_FIELDS: Final = ("plan_id", "gate_id", "rationale")
"""An action body's text fields."""
DECISION_FIELDS: Final = ("value", "arguments", "output")
"""What an approval carries besides its rationale (the CLI's ``--value``, ``--arguments``,
``--output``)."""


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


def _parsed(text: str) -> Any:
    """A gate record's JSON field (``None`` when empty or unreadable)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _gate(gate: Gate) -> dict[str, Any]:
    """A gate as the API shows it: where it is and what an approval of it carries (its value's
    ``input_schema`` or ``choices``, a tool approval's ``tool`` and proposed ``arguments``), as
    the page's form is built."""
    info = gate.info
    return {
        "plan_id": gate.plan.plan_id,
        "agent": gate.plan.agent,
        "revision": gate.plan.revision,
        "gate_id": gate.step.id,
        "kind": gate.kind,
        "prompt": gate.prompt,
        "input_schema": _parsed(info.input_schema_json) if info else None,
        "choices": _parsed(info.choices_json) if info else None,
        "tool": info.tool if info else "",
        "arguments": _parsed(info.arguments_json) if info else None,
        "deciders": list(info.deciders) if info else [],
        "deadline": info.deadline if info else 0.0,
        "carries": sorted({f.name.split(":", 1)[0] for f in gate.fields}),
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
    """``POST /api/actions/{action}`` with ``{"plan_id", "gate_id", "rationale"}`` and, for an
    approval, any of ``value`` (any JSON, ``null`` too), ``arguments`` and ``output`` (JSON
    objects), as ``stratagem approve`` takes ``--value``, ``--arguments`` and ``--output``."""
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
    name = request.path_params["action"]
    try:
        texts, decision = _action_body(body, name)
    except InputError as exc:
        return _json({"error": str(exc)}, 400)
    outcome = await act(_console(request).data, name, *texts, decision)
    return _json(
        {"ok": outcome.ok, "message": outcome.message, "status": outcome.plan_status},
        outcome.status_code,
    )


def _action_body(body: Mapping[str, Any], action: str) -> tuple[tuple[str, str, str], Decision]:
    """An action body's plan id, gate id and rationale, and what an approval carries.

    Raises:
        InputError: A field that is not known, not of its type, or not carried by ``action``
            (a rejection carries no value), in one line naming it.
    """
    known = (*TEXT_FIELDS, *DECISION_FIELDS)
    for key in body:
        if key not in known:
            raise InputError(f"unknown field {key!r}; an action takes {', '.join(known)}")
    texts: list[str] = []
    for key in TEXT_FIELDS:
        text = body.get(key, "")
        if not isinstance(text, str):
            raise InputError(f"{key} must be a string")
        texts.append(text)
    carried = [key for key in DECISION_FIELDS if key in body]
    if carried and action != "approve":
        raise InputError(f"{carried[0]}: only an approval carries it, not {action}")
    for key in ("arguments", "output"):
        if key in body and not isinstance(body[key], dict):
            raise InputError(f"{key} must be a JSON object")
    decision = Decision(
        value=body.get("value"),
        has_value="value" in body,
        arguments=body.get("arguments"),
        output=body.get("output"),
    )
    return (texts[0], texts[1], texts[2]), decision


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


async def knowledge(request: Request) -> JSONResponse:
    """``GET /api/knowledge?q=``: the kept claims (as ``kb list --json``)."""
    query = request.query_params.get("q", "")[:2000]
    entries, problem = await knowledge_view(_console(request).data.operator.settings, query)
    if problem:
        return _json({"error": problem}, 503)
    return _json([e.model_dump(mode="json") for e in entries])


async def claim(request: Request) -> JSONResponse:
    """``GET /api/knowledge/{claim_id}``: one claim and the lines each citation points at."""
    claim_id = request.path_params["claim_id"]
    entry, passages, problem = await claim_view(_console(request).data.operator.settings, claim_id)
    if problem:
        return _json({"error": problem}, 503)
    if entry is None:
        return _json({"error": f"no claim {claim_id[:80]} in the knowledge base"}, 404)
    return _json(
        entry.model_dump(mode="json") | {"passages": [dataclasses.asdict(p) for p in passages]}
    )


async def hypotheses(request: Request) -> JSONResponse:
    """``GET /api/hypotheses`` (or ``/api/hypotheses/{investigation}``): the investigations."""
    name = request.path_params.get("investigation", "")
    found, problem = await investigation_views(_console(request).data.operator.settings, name)
    if problem:
        return _json({"error": problem}, 503)
    if name and not found:
        return _json({"error": f"no investigation {name[:80]}"}, 404)
    views = [
        i.model_dump(mode="json")
        | {"ranked": [s.model_dump(mode="json") for s in i.tracker.ranked()]}
        for i in found
    ]
    return _json(views[0] if name else views)
