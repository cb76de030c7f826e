"""What the role model planners share: the world's vocabulary as enums, labels of actions and
relations, one line from a validation error."""

from __future__ import annotations

from typing import Any

from stratagem.protocol import (
    Action,
)

KINDS = ["character", "place", "object"]
PREDICATES = ["at", "in", "has", "connected", "locked", "opens", "knows", "wants"]


def action_label(action: Action) -> str:
    return f"{action.name}({','.join(action.args)})"


def relation_text(fact: Any) -> str:
    return f"{fact.subject} {fact.predicate} {fact.object}"


def one_line_error(exc: ValueError) -> str:
    """A pydantic error (or any ``ValueError``) as one short line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "value"
        return f"{where}: {first.get('msg', '')}"
    return str(exc).splitlines()[0][:200]
