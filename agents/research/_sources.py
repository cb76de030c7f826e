"""Sources: reading local files within the allowed file scopes, caching their bytes once.

The cache is a small protocol (``SourceCache``: keep these bytes, give me their digest; give me
the bytes of a digest) so that the artifact store, when a deployment has one, is wired in one
place; ``DirectorySourceCache`` (content-addressed files) and ``InMemorySourceCache`` ship with it.
``FetchLedger`` remembers which plan fetched which locator, so a research plan resumed after a
crash fetches nothing twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import re
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl

from stratagem.agents.research._types import Source
from stratagem.planning import ArtifactError, ArtifactProvenance, ArtifactStore, ToolContext

__all__ = [
    "MAX_FILES",
    "MAX_PDF_PAGES",
    "MAX_SOURCE_BYTES",
    "MCP_PREFIX",
    "ArtifactSourceCache",
    "DirectorySourceCache",
    "FetchLedger",
    "FileScopes",
    "InMemorySourceCache",
    "SourceCache",
    "SourceRefusedError",
    "ToolCaller",
    "expand_sources",
    "fetch_mcp",
    "fetch_path",
    "mcp_tool",
    "source_text",
]

MAX_SOURCE_BYTES = 5 * 1024 * 1024
"""The largest file a research goal reads (5 MiB); a larger one is recorded as unreadable."""
MAX_PDF_PAGES = 200
"""The most pages read from a PDF (a PDF bomb declares millions)."""
MAX_PDF_CHARS = 2 * 1024 * 1024
"""The most characters of text taken from a PDF."""
MAX_FILES = 500
"""The most files a research goal's sources expand to."""

TEXT_SUFFIXES = {".md": "text/markdown", ".markdown": "text/markdown", ".txt": "text/plain",
                 ".rst": "text/plain", ".pdf": "application/pdf"}  # fmt: skip


class SourceRefusedError(ValueError):
    """A source the research goal may not read (outside the file scopes, not there, too many).

    Attributes:
        locator: The source as given.
    """

    def __init__(self, locator: str, why: str) -> None:
        super().__init__(f"source {locator}: {why}")
        self.locator = locator


class SourceCache(Protocol):
    """Where a source's bytes are kept, by digest (the artifact store's seam)."""

    def put(
        self,
        data: bytes,
        *,
        name: str,
        media_type: str,
        ctx: ToolContext | None = None,
        tool: str = "",
    ) -> str:
        """Keep ``data``; return its digest (``sha256:...``).

        ``ctx`` is the plan step that read it and ``tool`` the tool that did (a cache that keeps
        provenance records them; one that keeps only bytes ignores them).
        """
        ...

    def get(self, digest: str) -> bytes:
        """The bytes of ``digest`` (``KeyError`` when not kept)."""
        ...


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class InMemorySourceCache:
    """A ``SourceCache`` in memory (tests); counts its ``put`` calls."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.puts = 0

    def put(
        self,
        data: bytes,
        *,
        name: str,
        media_type: str,
        ctx: ToolContext | None = None,
        tool: str = "",
    ) -> str:
        """Keep ``data``; return its digest."""
        self.puts += 1
        digest = _digest(data)
        self.blobs[digest] = data
        return digest

    def get(self, digest: str) -> bytes:
        """The bytes of ``digest``."""
        return self.blobs[digest]


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DirectorySourceCache:
    """A ``SourceCache`` of content-addressed files: ``ROOT/sha256/ab/cdef...``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, digest: str) -> Path:
        hexa = digest.removeprefix("sha256:")
        if len(hexa) != 64 or any(c not in "0123456789abcdef" for c in hexa):
            raise KeyError(digest)
        return self.root / "sha256" / hexa[:2] / hexa[2:]

    def put(
        self,
        data: bytes,
        *,
        name: str,
        media_type: str,
        ctx: ToolContext | None = None,
        tool: str = "",
    ) -> str:
        """Keep ``data`` (once: the same bytes are one file); return its digest."""
        digest = _digest(data)
        path = self._path(digest)
        if not path.exists():
            _write_atomically(path, data)
        return digest

    def get(self, digest: str) -> bytes:
        """The bytes of ``digest``."""
        try:
            return self._path(digest).read_bytes()
        except FileNotFoundError:
            raise KeyError(digest) from None


class FetchLedger:
    """Which plan fetched which locator, and what it got: a fetch is done once per plan.

    One small JSON file per (plan, locator), written atomically after the bytes are cached; a
    plan resumed after a crash finds the entry and reads nothing again. ``None`` as the folder
    keeps the ledger in memory.
    """

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._memory: dict[str, Source] = {}
        self.fetches = 0

    @staticmethod
    def _key(plan_id: str, locator: str) -> str:
        return hashlib.sha256(f"{plan_id}\0{locator}".encode()).hexdigest()

    def recorded(self, plan_id: str, locator: str) -> Source | None:
        """The source this plan fetched for ``locator``, if it did."""
        key = self._key(plan_id, locator)
        if self.root is None:
            return self._memory.get(key)
        path = self.root / f"{key}.json"
        if not path.exists():
            return None
        return Source.model_validate_json(path.read_bytes())

    def record(self, plan_id: str, locator: str, source: Source) -> None:
        """Remember what this plan fetched for ``locator``."""
        key = self._key(plan_id, locator)
        self.fetches += 1
        if self.root is None:
            self._memory[key] = source
            return
        _write_atomically(self.root / f"{key}.json", source.model_dump_json().encode())


@dataclass(frozen=True, slots=True)
class FileScopes:
    """The folders a research goal may read under (the policy's file scopes)."""

    roots: tuple[Path, ...]

    @classmethod
    def of(cls, roots: Iterable[str | Path]) -> FileScopes:
        """Scopes of these folders (resolved: symbolic links followed)."""
        return cls(tuple(Path(root).resolve() for root in roots))

    def allows(self, path: Path) -> bool:
        """Whether ``path`` (resolved) lies under one of the roots."""
        resolved = path.resolve()
        return any(resolved == root or resolved.is_relative_to(root) for root in self.roots)

    def describe(self) -> str:
        """The roots, comma separated."""
        return ", ".join(str(root) for root in self.roots) or "(none)"


def expand_sources(locators: Sequence[str], scopes: FileScopes, *, base: Path) -> list[str]:
    """The files the sources name: a folder's text, Markdown and PDF files (sorted), a file as
    is, an MCP source (``mcp:SERVER.TOOL?key=value``) as given.

    Raises:
        SourceRefusedError: A source outside the scopes, not there, an MCP source not of that
            form, or too many files.
    """
    files: list[str] = []
    for locator in locators:
        if locator.startswith(MCP_PREFIX):
            mcp_tool(locator)  # its form checked; the agent says whether the server answers
            files.append(locator)
            continue
        path = Path(locator) if Path(locator).is_absolute() else base / locator
        if not scopes.allows(path):
            raise SourceRefusedError(
                locator, f"outside the allowed file scopes ({scopes.describe()})"
            )
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES and p.is_file()
            )
            files.extend(str(p.resolve()) for p in found if scopes.allows(p))
        elif path.exists():
            files.append(str(path.resolve()))
        else:
            raise SourceRefusedError(locator, "no such file or folder")
        if len(files) > MAX_FILES:
            raise SourceRefusedError(locator, f"the sources hold more than {MAX_FILES} files")
    return list(dict.fromkeys(files))


def _unreadable(source_id: str, locator: str, reason: str, size: int = 0) -> Source:
    return Source(
        id=source_id,
        locator=locator,
        fetched_at=time.time(),
        status="unreadable",
        reason=reason[:500],
        size=size,
    )


def fetch_path(
    source_id: str,
    locator: str,
    scopes: FileScopes,
    cache: SourceCache,
    ctx: ToolContext | None = None,
) -> Source:
    """Read one file within the scopes and cache its bytes (as read by ``ctx``'s step); a failure
    is a recorded ``Source``.

    Never raises for what the file holds: outside the scopes, missing, unreadable, too large,
    binary, or a PDF that cannot be read is a source with ``status="unreadable"`` and the reason.
    """
    path = Path(locator)
    if not scopes.allows(path):
        return _unreadable(source_id, locator, "outside the allowed file scopes")
    media_type = TEXT_SUFFIXES.get(path.suffix.lower(), "text/plain")
    try:
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:
            return _unreadable(
                source_id, locator, f"larger than {MAX_SOURCE_BYTES} bytes ({size})", size
            )
        data = path.read_bytes()
    except OSError as exc:
        return _unreadable(source_id, locator, exc.strerror or type(exc).__name__)
    problem = _pdf_problem(data) if media_type == "application/pdf" else _text_problem(data)
    if problem:
        return _unreadable(source_id, locator, problem, len(data))
    digest = cache.put(
        data, name=path.name, media_type=media_type, ctx=ctx, tool="research_collect"
    )
    return Source(
        id=source_id,
        locator=locator,
        digest=digest,
        fetched_at=time.time(),
        status="read",
        media_type=media_type,
        size=len(data),
    )


def _text_problem(data: bytes) -> str:
    if b"\0" in data[:8192]:
        return "a binary file (it holds NUL bytes), not text"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start})"
    return ""


def _pdf_problem(data: bytes) -> str:
    try:
        _pdf_pages(data)
    except ValueError as exc:
        return str(exc)
    return ""


def _pdf_pages(data: bytes) -> list[str]:
    """A PDF's pages as text, bounded in pages and characters (``ValueError`` says why not)."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise ValueError(
            "a PDF, and the pypdf library is not installed (pip install pypdf)"
        ) from None

    try:
        reader = PdfReader(io.BytesIO(data))
        count = len(reader.pages)
        if count > MAX_PDF_PAGES:
            raise ValueError(f"a PDF of {count} pages; at most {MAX_PDF_PAGES} are read")
        pages: list[str] = []
        total = 0
        for page in reader.pages:
            text = page.extract_text() or ""
            total += len(text)
            if total > MAX_PDF_CHARS:
                raise ValueError(f"a PDF with more than {MAX_PDF_CHARS} characters of text")
            pages.append(text)
    except (PdfReadError, OSError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"an unreadable PDF ({type(exc).__name__})") from exc
    return pages


def source_text(source: Source, cache: SourceCache) -> list[tuple[int | None, str]]:
    """A read source's text from the cache: ``[(None, text)]``, or ``[(page, text), ...]``."""
    data = cache.get(source.digest)
    if source.media_type == "application/pdf":
        return [(number, text) for number, text in enumerate(_pdf_pages(data), start=1)]
    return [(None, data.decode("utf-8"))]


class ArtifactSourceCache:
    """A ``SourceCache`` over the artifact store: each source a versioned ``research-<name>``
    artifact with its provenance, its digest the blob's (``sha256:`` + hex).

    Bytes read by a plan step (``ctx`` given) are an artifact of that plan (scope ``plan``, its
    id), their provenance the step, its attempt and the plan's revision; bytes kept outside a
    plan (no ``ctx``) are the deployment's. The same bytes saved again by the same step are the
    version already there (the store's save is idempotent), so a retried step adds none.
    """

    def __init__(self, store: ArtifactStore, *, agent: str = "perception") -> None:
        self.store = store
        self.agent = agent

    def put(
        self,
        data: bytes,
        *,
        name: str,
        media_type: str,
        ctx: ToolContext | None = None,
        tool: str = "",
    ) -> str:
        """Save ``data`` as an artifact (of ``ctx``'s plan when given); its digest."""
        safe = "research-" + "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        made_by = tool or "research_collect"
        if ctx is not None and ctx.plan_id:
            scope, scope_id = "plan", ctx.plan_id
            provenance = ArtifactProvenance(
                agent=ctx.agent or self.agent,
                plan_id=ctx.plan_id,
                revision=ctx.revision,
                step_id=ctx.step_id,
                attempt=ctx.attempt,
                tool=made_by,
            )
        else:
            scope, scope_id = "deployment", ""
            provenance = ArtifactProvenance(agent=self.agent, tool=made_by)
        record = self.store.save_blocking(
            safe[:200],
            data,
            media_type=media_type,
            scope=scope,
            scope_id=scope_id,
            provenance=provenance,
        )
        return "sha256:" + record.digest

    def get(self, digest: str) -> bytes:
        """The bytes of ``digest`` (``KeyError`` when the store has none)."""
        try:
            return self.store.bytes_blocking(digest.removeprefix("sha256:"))
        except (ArtifactError, KeyError, OSError, ValueError) as exc:
            raise KeyError(digest) from exc


MCP_PREFIX = "mcp:"
_MCP_LOCATOR = re.compile(r"mcp:([a-z][a-z0-9_-]{0,63})\.([A-Za-z0-9_.-]{1,128})(?:\?(.*))?")

ToolCaller = Callable[[str, dict[str, Any], ToolContext], Awaitable[dict[str, Any]]]
"""Calls one of the agent's tools by name (``ToolRegistry.run_tool``): how an MCP server's tool
is reached, under the policy that registered it."""


def mcp_tool(locator: str) -> tuple[str, dict[str, Any]]:
    """An MCP source's tool (``server.tool``) and arguments: ``mcp:SERVER.TOOL?key=value&...``.

    Raises:
        SourceRefusedError: Not of that form.
    """
    match = _MCP_LOCATOR.fullmatch(locator)
    if match is None:
        raise SourceRefusedError(
            locator, "an MCP source is mcp:SERVER.TOOL, optionally ?key=value&... arguments"
        )
    arguments: dict[str, Any] = dict(parse_qsl(match.group(3) or "", keep_blank_values=True))
    return f"{match.group(1)}.{match.group(2)}", arguments


async def fetch_mcp(
    source_id: str,
    locator: str,
    call_tool: ToolCaller | None,
    cache: SourceCache,
    ctx: ToolContext,
    *,
    timeout_s: float,
) -> Source:
    """Call an MCP server's tool and cache its text as a source; a failure is a recorded
    ``Source`` (no server attached, the tool failed, it did not answer in time, not text)."""

    def unreadable(reason: str) -> Source:
        return Source(id=source_id, locator=locator, kind="mcp", fetched_at=time.time(),
                      status="unreadable", reason=reason[:500])  # fmt: skip

    try:
        name, arguments = mcp_tool(locator)
    except SourceRefusedError as exc:
        return unreadable(str(exc).removeprefix(f"source {locator}: "))
    if call_tool is None:
        return unreadable("no MCP server is attached to the agent that runs research")
    try:
        async with asyncio.timeout(timeout_s):
            output = await call_tool(name, arguments, ctx)
    except TimeoutError:
        return unreadable(f"the MCP tool {name} did not answer within {timeout_s:g} s")
    except Exception as exc:  # the tool's failure is the source's, recorded
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return unreadable(f"the MCP tool {name} failed: {first}")
    text = output.get("text") or ""
    if not text and output.get("structured") is not None:
        text = json.dumps(output["structured"], indent=2)
    data = str(text).encode()
    if not data.strip():
        return unreadable(f"the MCP tool {name} answered no text")
    if len(data) > MAX_SOURCE_BYTES:
        return unreadable(f"larger than {MAX_SOURCE_BYTES} bytes ({len(data)})")
    digest = cache.put(
        data, name=f"{name}.txt", media_type="text/plain", ctx=ctx, tool="research_collect"
    )
    return Source(id=source_id, locator=locator, kind="mcp", digest=digest,
                  fetched_at=time.time(), status="read", size=len(data))  # fmt: skip
