"""The console's research reads: the knowledge base (a claim with the passage it cites, read from
the cited file within the file scopes) and the investigations, through the operator API's reads of
the deployment's memory (``runtime.operator._research``: what the ``kb`` and ``hypotheses``
commands read)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from stratagem.protocol import ProtocolError
from stratagem.runtime.operator._input import InputError

if TYPE_CHECKING:
    from stratagem.agents.research import Investigation, KbEntry
    from stratagem.runtime.config._settings import Settings

__all__ = ["CitedPassage", "claim_view", "investigation_views", "knowledge_view"]

CONTEXT_LINES: Final = 2
"""Lines shown around a cited passage."""
MAX_SHOWN_LINES: Final = 80


@dataclass(frozen=True, slots=True)
class CitedPassage:
    """A citation as the console shows it: the file's lines around it, the cited ones marked."""

    locator: str
    location: str
    digest: str
    quote: str
    lines: tuple[tuple[int, str, bool], ...] = ()
    note: str = ""


def _problem(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


async def knowledge_view(settings: Settings, query: str) -> tuple[list[KbEntry], str]:
    """The kept claims (matching ``query``), or why they could not be read."""
    from stratagem.runtime.operator._research import knowledge

    try:
        return await knowledge(settings, query=query, limit=500), ""
    except (ProtocolError, OSError, ValueError) as exc:
        return [], f"the knowledge base cannot be read: {_problem(exc)}"


def _passage(settings: Settings, entry: KbEntry, index: int) -> CitedPassage:
    from stratagem.agents.research import FileScopes

    citation = entry.citations[index]
    base = CitedPassage(citation.locator, citation.location, citation.digest, citation.quote)
    lines_part = citation.location.rsplit("L", 1)[-1]
    start, _, end = lines_part.partition("-")
    path = Path(citation.locator)
    if not FileScopes.of(settings.research_roots).allows(path):
        return _with(base, note="outside the file scopes: only the quote is shown")
    try:
        text = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return _with(base, note=f"the file cannot be read now: {_problem(exc)}")
    first, last = int(start), int(end)
    low, high = max(1, first - CONTEXT_LINES), min(len(text), last + CONTEXT_LINES)
    high = min(high, low + MAX_SHOWN_LINES - 1)
    shown = tuple((n, text[n - 1], first <= n <= last) for n in range(low, high + 1))
    note = "the file changed since it was read: these are its lines now" if entry.stale else ""
    return CitedPassage(base.locator, base.location, base.digest, base.quote, shown, note)


def _with(base: CitedPassage, *, note: str) -> CitedPassage:
    return CitedPassage(base.locator, base.location, base.digest, base.quote, (), note)


async def claim_view(
    settings: Settings, claim_id: str
) -> tuple[KbEntry | None, list[CitedPassage], str]:
    """One kept claim and each passage it cites; or why it could not be read."""
    from stratagem.runtime.operator._research import knowledge

    try:
        found = await knowledge(settings, claim_id=claim_id)
    except (ProtocolError, OSError, ValueError, InputError) as exc:
        return None, [], f"the knowledge base cannot be read: {_problem(exc)}"
    if not found:
        return None, [], ""
    entry = found[0]
    return entry, [_passage(settings, entry, n) for n in range(len(entry.citations))], ""


async def investigation_views(
    settings: Settings, investigation_id: str = ""
) -> tuple[list[Investigation], str]:
    """The investigations (or the one named), or why they could not be read."""
    from stratagem.runtime.operator._research import investigations

    try:
        return await investigations(settings, investigation_id), ""
    except (ProtocolError, OSError, ValueError) as exc:
        return [], f"the investigations cannot be read: {_problem(exc)}"
