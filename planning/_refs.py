"""References from a step's input to earlier steps' outputs.

A value ``{"$ref": "STEP_ID.path"}`` anywhere in a tool step's ``input`` or a cross-agent step's
``request`` stands for part of step ``STEP_ID``'s output, resolved just before the step runs. The
path is a sequence of:

- ``.field``: a key of a mapping;
- ``[i]``: an item of a list (negative counts from the end);
- ``[a:b]``: a slice of a list (either bound may be omitted), which stays a list;
- ``[*]``: every item of a list; the rest of the path applies to each item, giving a list.

Examples: ``extract`` (the whole output), ``extract.entities[*].id``, ``arc.beats[0:2]``,
``arc.beats[1].goals[*].object``. A mapping with a ``$ref`` key must have no other key.

A ``$ref`` is a strict shorthand of the plans' expression language (``_expr.py``): its text is a
JMESPath expression with the same value (``Ref.expression``), except that a path that does not fit
the output is an error here, where an expression gives ``null``. Anything more (conditions,
functions, filters, the plan's inputs) is written ``{"$expr": "..."}``, resolved in the same places.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from stratagem.planning._errors import ExpressionError, RefError
from stratagem.planning._expr import expression, kind_of
from stratagem.planning._plan import STEP_ID_PATTERN

__all__ = ["EXPR_KEY", "REF_KEY", "Ref", "expr", "ref", "refs_in", "resolve_refs"]

REF_KEY: Final = "$ref"
EXPR_KEY: Final = "$expr"

_REF_RE: Final = re.compile(
    rf"(?P<step>{STEP_ID_PATTERN})"
    r"(?P<path>(?:\.[A-Za-z_][A-Za-z0-9_]*|\[(?:\*|-?\d+|-?\d*:-?\d*)\])*)"
)
_TOKEN_RE: Final = re.compile(
    r"\.(?P<field>[A-Za-z_][A-Za-z0-9_]*)"
    r"|\[(?P<each>\*)\]"
    r"|\[(?P<index>-?\d+)\]"
    r"|\[(?P<start>-?\d*):(?P<stop>-?\d*)\]"
)


@dataclass(frozen=True, slots=True)
class _Field:
    name: str


@dataclass(frozen=True, slots=True)
class _Index:
    index: int


@dataclass(frozen=True, slots=True)
class _Slice:
    start: int | None
    stop: int | None


@dataclass(frozen=True, slots=True)
class _Each:
    pass


_Token = _Field | _Index | _Slice | _Each


@dataclass(frozen=True, slots=True)
class Ref:
    """A parsed reference.

    Attributes:
        text: The reference as written, e.g. ``"extract.entities[*].id"``.
        step_id: The referenced step, e.g. ``"extract"``.
        path: The path within its output, e.g. ``".entities[*].id"`` ("" for the whole output).
    """

    text: str
    step_id: str
    path: str
    _tokens: tuple[_Token, ...] = field(repr=False, compare=False)

    @staticmethod
    def parse(text: str) -> Ref:
        """Parse a reference.

        Raises:
            RefError: When ``text`` is not ``STEP_ID`` followed by a valid path.
        """
        return _parse(text)

    @property
    def expression(self) -> str:
        """The same reference as a JMESPath expression (the step id quoted)."""
        return f'"{self.step_id}"{self.path}'

    def resolve(self, outputs: Mapping[str, Any]) -> Any:
        """The referenced value in ``outputs`` (step id -> JSON-like output).

        Raises:
            RefError: When the step has no output or the path does not fit it; the message names
                the reference and the part of the path that failed.
        """
        try:
            value = outputs[self.step_id]
        except KeyError:
            raise RefError(self.text, "that step has no output", step_id=self.step_id) from None
        return self._walk(value, 0, self.step_id)

    def _walk(self, value: Any, start: int, where: str) -> Any:
        tokens = self._tokens
        for position in range(start, len(tokens)):
            token = tokens[position]
            match token:
                case _Field(name):
                    if not isinstance(value, Mapping):
                        self._fail(f"{where} is {kind_of(value)}, not an object")
                    if name not in value:
                        keys = ", ".join(sorted(map(str, value))) or "none"
                        self._fail(f"{where} has no field {name!r} (fields: {keys})")
                    value = value[name]
                    where += f".{name}"
                case _Index(index):
                    items = self._items(value, where)
                    if not -len(items) <= index < len(items):
                        self._fail(
                            f"index {index} is out of range for {where} (length {len(items)})"
                        )
                    value = items[index]
                    where += f"[{index}]"
                case _Slice(begin, end):
                    value = list(self._items(value, where)[begin:end])
                    where += f"[{'' if begin is None else begin}:{'' if end is None else end}]"
                case _Each():
                    items = self._items(value, where)
                    where += "[*]"
                    return [self._walk(item, position + 1, where) for item in items]
        return value

    def _items(self, value: Any, where: str) -> list[Any] | tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            self._fail(f"{where} is {kind_of(value)}, not a list")
        return value

    def _fail(self, reason: str) -> NoReturn:
        raise RefError(self.text, reason, step_id=self.step_id)


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Ref:
    if not isinstance(text, str):
        raise RefError(repr(text), "a reference must be a string")
    match = _REF_RE.fullmatch(text)
    if match is None:
        raise RefError(
            text,
            "expected STEP_ID followed by .field, [i], [a:b] or [*] parts, "
            "e.g. 'extract.entities[*].id'",
        )
    tokens: list[_Token] = []
    for part in _TOKEN_RE.finditer(match["path"]):
        if part["field"] is not None:
            tokens.append(_Field(part["field"]))
        elif part["each"] is not None:
            tokens.append(_Each())
        elif part["index"] is not None:
            tokens.append(_Index(int(part["index"])))
        else:
            start, stop = part["start"], part["stop"]
            tokens.append(_Slice(int(start) if start else None, int(stop) if stop else None))
    return Ref(text, match["step"], match["path"], tuple(tokens))


def ref(text: str) -> dict[str, str]:
    """The marker ``{"$ref": text}`` for a step input, after checking that ``text`` parses.

    Raises:
        RefError: When ``text`` is not a valid reference.
    """
    _parse(text)
    return {REF_KEY: text}


def expr(text: str) -> dict[str, str]:
    """The marker ``{"$expr": text}`` for a step input, after checking that ``text`` parses.

    Raises:
        ExpressionError: When ``text`` is not a valid expression.
    """
    expression(text)
    return {EXPR_KEY: text}


def _ref_text(value: Mapping[Any, Any]) -> Any:
    """The ``$ref`` value of a marker mapping, or ``None`` when ``value`` is not one."""
    if REF_KEY not in value:
        return None
    if len(value) != 1:
        others = ", ".join(sorted(str(k) for k in value if k != REF_KEY))
        raise RefError(str(value[REF_KEY]), f"a $ref object must have no other keys (has {others})")
    return value[REF_KEY]


def _expr_text(value: Mapping[Any, Any]) -> str | None:
    """The ``$expr`` text of a marker mapping, or ``None`` when ``value`` is not one."""
    if EXPR_KEY not in value:
        return None
    text = value[EXPR_KEY]
    if len(value) != 1:
        others = ", ".join(sorted(str(k) for k in value if k != EXPR_KEY))
        raise ExpressionError(str(text), f"a $expr object must have no other keys (has {others})")
    if not isinstance(text, str):
        raise ExpressionError(repr(text), "an expression must be a string")
    return text


def has_refs(value: Any) -> bool:
    """Whether ``value`` holds any ``$ref`` or ``$expr`` object (a quick scan that builds
    nothing)."""
    # Loops rather than any() over a generator, the scalar test inline: a tool step's input is
    # scanned at every attempt, and a flat one then costs this one call.
    if type(value) is dict or isinstance(value, Mapping):
        if REF_KEY in value or EXPR_KEY in value:
            return True
        items: Iterable[Any] = value.values()
    elif type(value) is list or isinstance(value, tuple):
        items = value
    else:
        return False
    for item in items:  # noqa: SIM110 (a loop, not any() over a generator: see above)
        if item is not None and type(item) not in _SCALARS and has_refs(item):
            return True
    return False


_SCALARS: Final = frozenset({str, int, float, bool})


def iter_refs(value: Any) -> Iterator[str]:
    """Every reference text in ``value``, depth first, unparsed.

    Raises:
        RefError: When a ``$ref`` object has other keys or a non-string reference.
    """
    if isinstance(value, Mapping):
        text = _ref_text(value)
        if text is not None:
            if not isinstance(text, str):
                raise RefError(repr(text), "a reference must be a string")
            yield text
            return
        for item in value.values():
            yield from iter_refs(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from iter_refs(item)


def iter_markers(value: Any) -> Iterator[tuple[str, str]]:
    """Every ``(REF_KEY, text)`` and ``(EXPR_KEY, text)`` in ``value``, depth first, unparsed.

    Raises:
        RefError: When a marker object has other keys or a non-string text.
    """
    if isinstance(value, Mapping):
        text = _ref_text(value)
        if text is not None:
            if not isinstance(text, str):
                raise RefError(repr(text), "a reference must be a string")
            yield REF_KEY, text
            return
        source = _expr_text(value)
        if source is not None:
            yield EXPR_KEY, source
            return
        for item in value.values():
            yield from iter_markers(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from iter_markers(item)


def refs_in(value: Any) -> set[str]:
    """The ids of the steps referenced anywhere in ``value`` (by ``$ref`` or ``$expr``).

    Raises:
        RefError: When a reference or an expression does not parse.
    """
    found: set[str] = set()
    for key, text in iter_markers(value):
        if key == REF_KEY:
            found.add(_parse(text).step_id)
        else:
            found |= expression(text).steps
    return found


def resolve_refs(
    value: Any,
    outputs: Mapping[str, Any],
    inputs: Mapping[str, Any] | None = None,
    bound: Mapping[str, Any] | None = None,
) -> Any:
    """``value`` with every ``{"$ref": ...}`` and ``{"$expr": ...}`` replaced by its value.

    Containers without references are returned as they are (not copied); resolved values are the
    outputs' own objects, so treat the result as read-only.

    Args:
        value: A JSON-like value (mappings, lists, scalars).
        outputs: Step id -> that step's JSON-like output (e.g. ``model.model_dump()``).
        inputs: The plan's inputs, which expressions read as ``inputs``.
        bound: Other names expressions read (a map's ``item`` and ``index``).

    Returns:
        The resolved value.

    Raises:
        RefError: When a reference does not parse or does not fit the output it names
            (``ExpressionError`` for an expression that does not parse or cannot be evaluated).
    """
    if isinstance(value, Mapping):
        text = _ref_text(value)
        if text is not None:
            if not isinstance(text, str):
                raise RefError(repr(text), "a reference must be a string")
            return _parse(text).resolve(outputs)
        source = _expr_text(value)
        if source is not None:
            return expression(source).evaluate(outputs, inputs, bound)
        resolved = {key: resolve_refs(item, outputs, inputs, bound) for key, item in value.items()}
        changed = any(resolved[key] is not item for key, item in value.items())
        return resolved if changed else value
    if isinstance(value, list):
        items = [resolve_refs(item, outputs, inputs, bound) for item in value]
        changed = any(new is not old for new, old in zip(items, value, strict=True))
        return items if changed else value
    return value
