"""The console's memory page (``/memory``) and its JSON twin (``/api/memory``): a namespace's
items, or those a query recalls, read through the operator's memory client
(``runtime.operator._memory``, as ``stratagem memory`` reads them), as the operator under the
deployment's policy. Values are shown as JSON text (the templates escape them); a namespace the
policy refuses or bad input is named on the page in one line."""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stratagem.protocol import StorageError
from stratagem.runtime._console._app import Console
from stratagem.runtime.config._errors import StratagemRuntimeError
from stratagem.runtime.operator._memory import MemoryClient

__all__ = ["memory", "memory_api"]

LIMIT: Final = 100
"""The most items the page lists (a search: the best 100)."""


async def _read(request: Request) -> tuple[dict[str, str], list[dict[str, Any]], str]:
    console: Console = request.app.state.console
    asked = {
        "namespace": request.query_params.get("namespace", "").strip(),
        "q": request.query_params.get("q", "").strip(),
    }
    if not asked["namespace"]:
        return asked, [], ""
    try:
        async with MemoryClient(settings=console.config.settings) as client:
            if asked["q"]:
                items = await client.search(asked["namespace"], asked["q"], limit=LIMIT)
            else:
                items = await client.list(asked["namespace"], limit=LIMIT)
    except (StratagemRuntimeError, StorageError) as exc:
        return asked, [], str(exc)
    return asked, [item.to_json() for item in items], ""


async def memory(request: Request) -> Response:
    """A namespace's items, or the ones a query recalls, best first."""
    console: Console = request.app.state.console
    asked, items, problem = await _read(request)
    for item in items:
        item["shown"] = json.dumps(item["value"], indent=2, ensure_ascii=False)
    return console.page(request, "memory.html", asked=asked, items=items, problem=problem)


async def memory_api(request: Request) -> Response:
    """``/api/memory?namespace=NS[&q=WORDS]``: the items as ``stratagem memory list|search
    --json`` prints them; a refusal or bad input answers 400 with ``{"error": ...}``."""
    asked, items, problem = await _read(request)
    if problem or not asked["namespace"]:
        return JSONResponse({"error": problem or "namespace: required"}, status_code=400)
    return JSONResponse(items)
