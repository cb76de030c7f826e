"""Intents: what a capability is for, in example phrasings with typed slots.

A capability may declare intents (``CapabilitySpec.intents``): phrasings a person would use to ask
for it, each with slots in braces that name fields of its request model
(``"weather in {city}"``, ``"set a timer for {minutes} minutes"``). The orchestrator's goal planner
matches a goal's clauses against them and fills the request from the slots
(``agents._goals``). An intent is checked when its capability is registered
(``check_intents``): a slot that is not a scalar field of the request model, an unbalanced brace or
an empty phrasing is refused in one line naming the capability, the intent and the slot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel

__all__ = [
    "MAX_INTENTS",
    "Intent",
    "IntentError",
    "SlotType",
    "check_intents",
    "parse_intent",
    "slot_types",
]

MAX_INTENTS: Final = 32
"""The most intents one capability declares."""
_MAX_PHRASE: Final = 200
_SLOT: Final = re.compile(r"\{([^{}]*)\}")
_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")

SlotType = Literal["string", "integer", "number", "boolean", "enum"]
"""What a slot holds: the JSON type of its request field, or ``enum`` (one of listed values)."""


class Declares(Protocol):
    """What declares intents: a capability (``CapabilitySpec``), read without importing it."""

    @property
    def name(self) -> str: ...
    @property
    def request(self) -> type[BaseModel]: ...
    @property
    def intents(self) -> tuple[str, ...]: ...
    @property
    def cost(self) -> float: ...


class IntentError(ValueError):
    """An intent that does not parse or does not fit its capability's request model."""


@dataclass(frozen=True, slots=True)
class Intent:
    """One parsed phrasing.

    Attributes:
        phrase: As declared, e.g. ``"weather in {city}"``.
        parts: The phrasing's literal text and slots in order: a slot is ``("slot", name)``, text
            is ``("text", words)``.
        slots: The slots' names, in order.
    """

    phrase: str
    parts: tuple[tuple[Literal["text", "slot"], str], ...]
    slots: tuple[str, ...]

    @property
    def text(self) -> str:
        """The phrasing's words without its slots (what a lexical scorer indexes)."""
        return " ".join(value for kind, value in self.parts if kind == "text")


def parse_intent(phrase: str) -> Intent:
    """``phrase`` as an ``Intent``.

    Raises:
        IntentError: Empty or too long, an unbalanced brace, a slot name that is not a lowercase
            identifier, a slot twice, two slots with no word between them.
    """
    if not isinstance(phrase, str) or not phrase.strip():
        raise IntentError("an intent is an empty phrasing")
    if len(phrase) > _MAX_PHRASE:
        raise IntentError(f"intent {phrase[:40]!r}...: longer than {_MAX_PHRASE} characters")
    parts: list[tuple[Literal["text", "slot"], str]] = []
    slots: list[str] = []
    at = 0
    for match in _SLOT.finditer(phrase):
        text = phrase[at : match.start()]
        if "{" in text or "}" in text:
            raise IntentError(f"intent {phrase!r}: unbalanced braces")
        if text.strip():
            parts.append(("text", " ".join(text.split())))
        elif parts and parts[-1][0] == "slot":
            raise IntentError(f"intent {phrase!r}: two slots need a word between them")
        name = match.group(1).strip()
        if not _NAME.fullmatch(name):
            raise IntentError(
                f"intent {phrase!r}: slot {{{match.group(1)}}} is not a lowercase identifier"
            )
        if name in slots:
            raise IntentError(f"intent {phrase!r}: slot {{{name}}} appears twice")
        slots.append(name)
        parts.append(("slot", name))
        at = match.end()
    rest = phrase[at:]
    if "{" in rest or "}" in rest:
        raise IntentError(f"intent {phrase!r}: unbalanced braces")
    if rest.strip():
        parts.append(("text", " ".join(rest.split())))
    if not any(kind == "text" for kind, _ in parts):
        raise IntentError(f"intent {phrase!r}: has no words besides its slots")
    return Intent(phrase=phrase, parts=tuple(parts), slots=tuple(slots))


def _slot_type(prop: dict[str, Any], defs: dict[str, Any]) -> SlotType | None:
    if "$ref" in prop:
        prop = defs.get(str(prop["$ref"]).rsplit("/", 1)[-1], {})
    if "enum" in prop or "const" in prop:
        return "enum"
    kind = prop.get("type")
    if kind in ("string", "integer", "number", "boolean"):
        return kind  # type: ignore[no-any-return]
    return None


def slot_types(spec: Declares) -> dict[str, tuple[SlotType, dict[str, Any]]]:
    """The request fields of ``spec`` a slot may fill: name -> (its type, its JSON Schema)."""
    schema = spec.request.model_json_schema()
    defs = schema.get("$defs", {})
    found: dict[str, tuple[SlotType, dict[str, Any]]] = {}
    for name, prop in schema.get("properties", {}).items():
        kind = _slot_type(prop, defs)
        if kind is not None:
            found[name] = (kind, prop if "$ref" not in prop else defs.get(prop["$ref"][8:], {}))
    return found


def check_intents(spec: Declares) -> list[Intent]:
    """Parse and check ``spec``'s intents against its request model.

    Raises:
        IntentError: One line naming the capability, the intent and what is wrong: it does not
            parse, a slot is not a field of the request model, or not a field a slot can fill
            (a string, a number, a boolean or an enum); too many intents; a negative cost.
    """
    where = f"capability {spec.name!r}"
    if len(spec.intents) > MAX_INTENTS:
        raise IntentError(f"{where}: more than {MAX_INTENTS} intents")
    if spec.cost < 0:
        raise IntentError(f"{where}: cost must be 0 or more, not {spec.cost}")
    if not spec.intents:
        return []
    fields = spec.request.model_fields
    fillable = slot_types(spec)
    parsed = []
    for phrase in spec.intents:
        try:
            intent = parse_intent(phrase)
        except IntentError as exc:
            raise IntentError(f"{where}: {exc}") from None
        for slot in intent.slots:
            if slot not in fields:
                raise IntentError(
                    f"{where}: intent {phrase!r}: slot {{{slot}}} is not a field of "
                    f"{spec.request.__name__} (fields: {', '.join(fields) or 'none'})"
                )
            if slot not in fillable:
                raise IntentError(
                    f"{where}: intent {phrase!r}: slot {{{slot}}} is not a string, number, "
                    f"boolean or enum field of {spec.request.__name__}"
                )
        parsed.append(intent)
    return parsed
