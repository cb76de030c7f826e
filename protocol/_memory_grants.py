"""The policy's ``[[memory]]`` rules: who may read or write which memory namespace.

Deny by default, like the rest of the policy: an identity may read (``get``, ``list``, ``search``)
or write (``put``, ``delete``) a namespace only when a rule names it (or ``"*"``) as ``caller``,
the access among ``access``, and a pattern of ``namespaces`` that covers the namespace::

    [[memory]]
    caller = "*"
    namespaces = ["agent/{caller}"]   # each identity its own namespace
    access = ["read", "write"]

    [[memory]]
    caller = "tactical"
    namespaces = ["goal/*", "user/ana"]
    access = ["read"]

A pattern is parts joined by ``/``: a part is a name, ``*`` (any one part) or ``{caller}`` (the
identity asking). A pattern covers a namespace whose first parts it matches, so a grant of
``user/ana`` covers ``user/ana/notes`` too but never ``user`` (whose list would show every user);
the pattern ``*`` alone covers every namespace.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

__all__ = ["CALLER_PART", "MemoryAccess", "MemoryRule"]

MemoryAccess = Literal["read", "write"]
"""What a memory call does: ``read`` (get, list, search) or ``write`` (put, delete)."""

CALLER_PART: Final = "{caller}"
"""A namespace pattern's part that stands for the identity asking."""

_PART: Final = r"(\*|\{caller\}|[A-Za-z0-9_.:@+\-]{1,128})"
_PATTERN: Final = rf"^(\*|{_PART}(/{_PART}){{0,7}})$"
_Caller = Annotated[str, StringConstraints(pattern=r"^(\*|[A-Za-z][A-Za-z0-9_.-]{0,63})$")]


@dataclass(frozen=True, slots=True)
class MemoryRule:
    """One ``[[memory]]`` rule of the policy.

    Attributes:
        caller: The identity granted, or ``"*"`` for any.
        namespaces: The namespace patterns granted (``"user/*"``, ``"agent/{caller}"``, ``"*"``).
        access: ``read``, ``write`` or both.
    """

    caller: str
    namespaces: tuple[str, ...]
    access: frozenset[MemoryAccess]

    def matches(self, caller: str, namespace: Sequence[str], access: MemoryAccess) -> bool:
        """Whether this rule lets ``caller`` ``access`` ``namespace``."""
        if self.caller not in (caller, "*") or access not in self.access:
            return False
        return any(_covers(pattern, caller, namespace) for pattern in self.namespaces)


def _covers(pattern: str, caller: str, namespace: Sequence[str]) -> bool:
    if pattern == "*":
        return True
    parts = pattern.split("/")
    if len(namespace) < len(parts):
        return False
    for part, actual in zip(parts, namespace, strict=False):
        if part == CALLER_PART:
            if actual != caller:
                return False
        elif part != "*" and part != actual:
            return False
    return True


class MemoryRuleFile(BaseModel):
    """A ``[[memory]]`` table as the policy file writes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    caller: _Caller
    namespaces: list[str] = Field(min_length=1, max_length=64)
    access: list[MemoryAccess] = Field(min_length=1, max_length=2)

    @field_validator("namespaces")
    @classmethod
    def _patterns(cls, namespaces: list[str]) -> list[str]:
        for pattern in namespaces:
            if not is_pattern(pattern):
                raise ValueError(
                    f"{pattern!r} is not a namespace pattern: '*', or 1 to 8 parts joined by '/', "
                    "each a name of letters, digits and _ . : @ + -, '*' or '{caller}'"
                )
        return namespaces

    def rule(self) -> MemoryRule:
        """The rule it declares."""
        return MemoryRule(self.caller, tuple(self.namespaces), frozenset(self.access))


def is_pattern(text: str) -> bool:
    """Whether ``text`` is a namespace pattern a rule may name."""
    return re.fullmatch(_PATTERN, text) is not None
