"""The console's artifact pages: the list, one version (its provenance linked to the step that
made it, its content rendered in the page, escaped), and an image's bytes.

They read through ``ConsoleData.artifacts`` (``runtime.operator.ArtifactsClient``, what
``stratagem artifacts`` reads). What renders: text (``text/*``, Markdown included: shown as its
source, never as HTML), JSON (indented), and PNG, JPEG, GIF and WebP images (from
``/artifacts/raw``, served with their own type only when the digest-checked bytes start as that
type says); other types are named with their size, never rendered. Every value goes through the
templates' autoescaping.
"""

from __future__ import annotations

import json
from typing import Any, Final
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from stratagem.runtime._console._app import Console
from stratagem.runtime.config._errors import StratagemRuntimeError

__all__ = ["artifact", "artifact_raw", "artifacts"]

PREVIEW_BYTES: Final = 1 << 20
"""The largest artifact whose content the page renders."""
IMAGES: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")
_MAGIC: Final = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _where(request: Request) -> dict[str, Any]:
    query = request.query_params
    version = query.get("version") or ""
    return {
        "scope": query.get("scope") or "deployment",
        "scope_id": query.get("scope_id") or "",
        "version": int(version) if version.isdigit() else None,
    }


def _missing(request: Request, message: str) -> Response:
    return _console(request).page(request, "missing.html", 404, what="artifact", message=message)


async def artifacts(request: Request) -> Response:
    """Every artifact's newest version (every version with ``all=1``), by scope and name."""
    console = _console(request)
    query = request.query_params
    problem = ""
    records: list[Any] = []
    try:
        records = await console.data.artifacts.list(
            scope=query.get("scope") or None,
            scope_id=query.get("scope_id") or None,
            all_versions=query.get("all") == "1",
        )
    except StratagemRuntimeError as exc:
        problem = str(exc)
    links = {
        r.key: "/artifacts/show?"
        + urlencode(
            {"scope": r.scope, "scope_id": r.scope_id, "name": r.name, "version": r.version}
        )
        for r in records
    }
    return console.page(request, "artifacts.html", records=records, links=links, problem=problem)


def _base(media_type: str) -> str:
    return media_type.split(";", 1)[0].strip().lower()


async def artifact(request: Request) -> Response:
    """One version: its record, provenance (the step that made it linked), content rendered."""
    console = _console(request)
    where = _where(request)
    name = request.query_params.get("name") or ""
    client = console.data.artifacts
    try:
        lineage = await client.provenance(name, **where)
    except StratagemRuntimeError as exc:
        return _missing(request, str(exc))
    record = lineage.record
    base = _base(record.media_type)
    text = ""
    problem = ""
    image = ""
    if record.size <= PREVIEW_BYTES and (
        base.startswith("text/") or base == "application/json" or base.endswith("+json")
    ):
        try:
            _, data = await client.get(name, **{**where, "version": record.version})
            text = data.decode("utf-8", errors="replace")
            if base == "application/json" or base.endswith("+json"):
                text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except StratagemRuntimeError as exc:
            problem = str(exc)
        except ValueError:
            pass  # shown as it is
    elif base in IMAGES:
        image = "/artifacts/raw?" + urlencode(
            {
                "scope": record.scope,
                "scope_id": record.scope_id,
                "name": record.name,
                "version": record.version,
            }
        )
    inputs = {
        r.key: "/artifacts/show?"
        + urlencode(
            {"scope": r.scope, "scope_id": r.scope_id, "name": r.name, "version": r.version}
        )
        for r in lineage.inputs
    }
    return console.page(
        request,
        "artifact.html",
        record=record,
        prov=record.provenance,
        lineage=lineage,
        inputs=inputs,
        text=text,
        image=image,
        problem=problem,
    )


async def artifact_raw(request: Request) -> Response:
    """An image artifact's bytes, digest checked, with its type only when the bytes are that
    image; anything else as a download of opaque bytes."""
    console = _console(request)
    name = request.query_params.get("name") or ""
    try:
        record, data = await console.data.artifacts.get(name, **_where(request))
    except StratagemRuntimeError as exc:
        return _missing(request, str(exc))
    base = _base(record.media_type)
    if base in IMAGES and any(data.startswith(m) for m in _MAGIC[base]):
        return Response(data, media_type=base, headers={"Cache-Control": "no-store"})
    return Response(
        data,
        media_type="application/octet-stream",
        headers={
            "Cache-Control": "no-store",
            "Content-Disposition": 'attachment; filename="artifact"',
        },
    )
