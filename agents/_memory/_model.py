"""Memory's types and the checks every store applies before it writes anything.

A memory item is a JSON value kept under a **namespace** (a tuple of short names, such as
``("user", "ana")``, ``("agent", "tactical")`` or ``("goal", "g-17")``) and a **key** (a string).
Its namespace scopes it: a reader of ``("user", "ana")`` sees that namespace and every namespace
below it (``("user", "ana", "notes")``), and the policy grants namespaces the same way
(``docs/artifacts-memory.md``).

Limits (``MemoryLimits``): a namespace has 1 to 8 parts, each 1 to 128 characters of letters,
digits and ``_ . : @ + -`` (but not ``.`` or ``..``); a key is a string of 1 to 512 characters
without control characters; a value is any JSON value whose compact UTF-8 encoding is at most 64
KiB; a TTL is a positive number of seconds (at most ten years). Input that breaks one raises
``MemoryInputError`` naming the field, before anything is written.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeAlias

from stratagem.agents._errors import AgentError

__all__ = [
    "DEFAULT_LIMITS",
    "JsonValue",
    "MemoryDeniedError",
    "MemoryInputError",
    "MemoryItem",
    "MemoryLimits",
    "Namespace",
    "check_filter",
    "check_key",
    "check_limit",
    "check_namespace",
    "check_offset",
    "check_query",
    "check_ttl",
    "encode_value",
    "filter_kind",
    "format_namespace",
    "matches_filter",
    "parse_namespace",
    "searchable_text",
]

JsonValue: TypeAlias = Any
"""A JSON value: ``None``, a bool, a number, a string, a list or a dict of JSON values."""

Namespace: TypeAlias = tuple[str, ...]
"""A memory namespace, such as ``("user", "ana")``: its parts, outermost first."""

_PART: Final = re.compile(r"[A-Za-z0-9_.:@+\-]{1,128}")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_FILTER_PATH: Final = re.compile(r"[A-Za-z0-9_\-]{1,64}(\.[A-Za-z0-9_\-]{1,64}){0,7}")
_MAX_TTL_S: Final = 10 * 365 * 24 * 3600.0


class MemoryInputError(AgentError, ValueError):
    """A memory call's input is refused; nothing was written.

    Attributes:
        field: The input that is wrong (``namespace``, ``key``, ``value``, ``ttl_s``, ``query``,
            ``filter``, ``limit``).
        reason: The problem, one line.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class MemoryDeniedError(AgentError, PermissionError):
    """The policy does not let ``caller`` read or write ``namespace`` (deny by default).

    Attributes:
        caller: The identity that asked.
        namespace: The namespace it named.
        access: ``"read"`` or ``"write"``.
    """

    def __init__(self, caller: str, namespace: Namespace, access: str) -> None:
        super().__init__(
            f"namespace: {caller!r} may not {access} memory namespace "
            f"{format_namespace(namespace)!r} (no [[memory]] rule of the policy allows it)"
        )
        self.caller = caller
        self.namespace = namespace
        self.access = access


@dataclass(frozen=True)
class MemoryLimits:
    """What a store accepts.

    Attributes:
        max_value_bytes: The largest value, as compact UTF-8 JSON.
        max_key_chars: The longest key.
        max_depth: The most parts a namespace has.
        max_results: The most items one ``list`` or ``search`` returns.
    """

    max_value_bytes: int = 64 * 1024
    max_key_chars: int = 512
    max_depth: int = 8
    max_results: int = 1000


DEFAULT_LIMITS: Final = MemoryLimits()


@dataclass(frozen=True)
class MemoryItem:
    """One memory item as a store returned it.

    Attributes:
        namespace: Where it is kept.
        key: Its key within the namespace.
        value: Its JSON value.
        created_at: When the key was first written in the namespace (UTC).
        updated_at: When it was last written (UTC).
        expires_at: When it stops being returned (UTC), ``None`` for never.
        score: From ``search`` with a query only: how well it matched (higher is better; BM25,
            ``ts_rank_cd`` or cosine, comparable within one search only), else ``None``.
    """

    namespace: Namespace
    key: str
    value: JsonValue
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    score: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The item as a JSON object (``namespace`` as its ``a/b`` form, times as ISO 8601)."""
        return {
            "namespace": format_namespace(self.namespace),
            "key": self.key,
            "value": self.value,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
            "score": self.score,
        }


def format_namespace(namespace: Sequence[str]) -> str:
    """``("user", "ana")`` as ``"user/ana"``."""
    return "/".join(namespace)


def parse_namespace(text: str, limits: MemoryLimits = DEFAULT_LIMITS) -> Namespace:
    """``"user/ana"`` as ``("user", "ana")``, checked (``MemoryInputError`` naming
    ``namespace``)."""
    if not isinstance(text, str):
        raise MemoryInputError("namespace", f"expected a string like 'user/ana', got {text!r}")
    return check_namespace(tuple(text.split("/")) if text else (), limits)


def check_namespace(namespace: object, limits: MemoryLimits = DEFAULT_LIMITS) -> Namespace:
    """``namespace`` as a tuple of parts, or ``MemoryInputError`` naming ``namespace``."""
    if isinstance(namespace, str):
        return parse_namespace(namespace, limits)
    if not isinstance(namespace, (tuple, list)) or not namespace:
        raise MemoryInputError(
            "namespace", f"expected 1 to {limits.max_depth} parts, got {namespace!r}"
        )
    if len(namespace) > limits.max_depth:
        raise MemoryInputError(
            "namespace", f"has {len(namespace)} parts, at most {limits.max_depth} are allowed"
        )
    for part in namespace:
        if not isinstance(part, str) or not _PART.fullmatch(part) or part in (".", ".."):
            raise MemoryInputError(
                "namespace",
                f"part {part!r} is not 1-128 letters, digits or _ . : @ + -",
            )
    return tuple(namespace)


def check_key(key: object, limits: MemoryLimits = DEFAULT_LIMITS) -> str:
    """``key`` when it is a usable key, else ``MemoryInputError`` naming ``key``."""
    if not isinstance(key, str):
        raise MemoryInputError("key", f"must be a string, got {type(key).__name__}")
    if not key or len(key) > limits.max_key_chars:
        raise MemoryInputError("key", f"must have 1 to {limits.max_key_chars} characters")
    if _CONTROL.search(key):
        raise MemoryInputError("key", "must not contain control characters")
    return key


def check_ttl(ttl_s: object) -> float | None:
    """``ttl_s`` as seconds (``None``: no expiry), else ``MemoryInputError`` naming ``ttl_s``."""
    if ttl_s is None:
        return None
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)):
        raise MemoryInputError("ttl_s", f"must be a number of seconds, got {ttl_s!r}")
    if not math.isfinite(ttl_s) or ttl_s <= 0:
        raise MemoryInputError("ttl_s", f"must be positive, got {ttl_s!r}")
    if ttl_s > _MAX_TTL_S:
        raise MemoryInputError("ttl_s", f"must be at most {_MAX_TTL_S:.0f} (ten years)")
    return float(ttl_s)


def encode_value(value: object, limits: MemoryLimits = DEFAULT_LIMITS) -> str:
    """``value`` as compact JSON text, else ``MemoryInputError`` naming ``value`` (not JSON, a
    NaN, or too big)."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise MemoryInputError("value", f"is not a JSON value: {exc}") from None
    size = len(text.encode("utf-8"))
    if size > limits.max_value_bytes:
        raise MemoryInputError(
            "value", f"is {size} bytes as JSON, at most {limits.max_value_bytes} are allowed"
        )
    return text


def check_query(query: object) -> str | None:
    """A search's query text (``None`` or blank: no text), else ``MemoryInputError``."""
    if query is None:
        return None
    if not isinstance(query, str):
        raise MemoryInputError("query", f"must be a string, got {type(query).__name__}")
    if len(query) > 4096:
        raise MemoryInputError("query", "must have at most 4096 characters")
    return query if query.strip() else None


def check_filter(filter: object) -> dict[str, JsonValue]:
    """A search's filter: a mapping from a field path of the value (``status`` or
    ``author.name``) to the JSON scalar (string, number, bool or null) it must equal; else
    ``MemoryInputError`` naming ``filter``.

    Equality is JSON's: ``true`` is not ``1``, ``"1"`` is not ``1``; ``1`` equals ``1.0``.
    """
    if filter is None:
        return {}
    if not isinstance(filter, Mapping):
        raise MemoryInputError("filter", f"must be an object of field: value, got {filter!r}")
    if len(filter) > 16:
        raise MemoryInputError("filter", "may name at most 16 fields")
    checked: dict[str, JsonValue] = {}
    for path, wanted in filter.items():
        if not isinstance(path, str) or not _FILTER_PATH.fullmatch(path):
            raise MemoryInputError(
                "filter", f"{path!r} is not a field path such as 'status' or 'author.name'"
            )
        if wanted is not None and not isinstance(wanted, (str, int, float, bool)):
            raise MemoryInputError(
                "filter", f"{path!r}: a filter compares a string, number, bool or null"
            )
        if isinstance(wanted, float) and not math.isfinite(wanted):
            raise MemoryInputError("filter", f"{path!r}: {wanted!r} is not a JSON number")
        checked[path] = wanted
    return checked


def filter_kind(wanted: JsonValue) -> str:
    """The JSON type a filter's value matches: ``string``, ``number``, ``true``, ``false`` or
    ``null``."""
    if wanted is None:
        return "null"
    if isinstance(wanted, bool):
        return "true" if wanted else "false"
    if isinstance(wanted, (int, float)):
        return "number"
    return "string"


def check_limit(limit: object, limits: MemoryLimits = DEFAULT_LIMITS) -> int:
    """A result count between 1 and ``limits.max_results``, else ``MemoryInputError``."""
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= limits.max_results
    ):
        raise MemoryInputError("limit", f"must be an integer from 1 to {limits.max_results}")
    return limit


def check_offset(offset: object) -> int:
    """A count of results to skip (0 or more), else ``MemoryInputError`` naming ``offset``."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise MemoryInputError("offset", "must be an integer of 0 or more")
    return offset


def searchable_text(key: str, value: JsonValue) -> str:
    """What full-text recall indexes of an item: its key and every string and number in its
    value (field names excluded), one per line."""
    parts = [key]

    def walk(node: JsonValue) -> None:
        if isinstance(node, str):
            parts.append(node)
        elif isinstance(node, bool) or node is None:
            return
        elif isinstance(node, (int, float)):
            parts.append(str(node))
        elif isinstance(node, list):
            for child in node:
                walk(child)
        elif isinstance(node, dict):
            for child in node.values():
                walk(child)

    walk(value)
    return "\n".join(parts)


def matches_filter(value: JsonValue, filter: Mapping[str, JsonValue]) -> bool:
    """Whether every field path of ``filter`` holds the JSON scalar it names in ``value``."""
    for path, wanted in filter.items():
        node = value
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        if node is None or isinstance(node, (bool, str)) or wanted is None:
            if filter_kind(node) != filter_kind(wanted) or node != wanted:
                return False
        elif (
            not isinstance(node, (int, float)) or filter_kind(wanted) != "number" or node != wanted
        ):
            return False
    return True
