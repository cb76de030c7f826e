"""Expressions over a run's data, in JMESPath: references and conditions alike.

An expression reads a document whose top-level names are the ids of the plan's steps (each the
step's output) and ``inputs`` (the plan's inputs), e.g. ``extract.entities[*].id``,
``length(search.hits) > `0```, ``inputs.language == 'en'`` or ``"step-2".total`` (an id with a
``-`` is quoted). It is used:

- as a value: ``{"$expr": "search.hits[0].url"}`` anywhere in a tool step's ``input``, a
  cross-agent step's ``request`` or a ``compensate_input``, resolved just before the step runs;
- as a step's condition, ``when``: the step runs only when its value is truthy (JMESPath's truth:
  ``false``, ``null``, ``""``, ``[]`` and ``{}`` are false).

A step that has not succeeded (skipped, failed, not run) reads as ``null``. An expression is parsed
and checked when the plan is validated: it must parse, call only JMESPath's functions with the
right number of arguments, and read only steps its step depends on (transitively); reading the
whole document (``@``, ``*`` at the top) is refused, so every expression names what it reads.

The older ``{"$ref": "STEP_ID.path"}`` form (``_refs.py``) stays as a strict shorthand: its path
is a JMESPath expression too (``Ref.expression``), but a path that does not fit the output is an
error rather than ``null``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import jmespath
from jmespath import exceptions as jmespath_errors
from jmespath.functions import Functions
from jmespath.parser import ParsedResult
from jmespath.visitor import TreeInterpreter

from stratagem.planning._errors import ExpressionError

__all__ = ["INPUTS", "Expression", "expression", "list_kind", "truthy"]

INPUTS: Final = "inputs"
"""The top-level name under which an expression reads the plan's inputs."""

MAX_LENGTH: Final = 2000
"""The longest expression accepted, in characters."""

MAX_DEPTH: Final = 64
"""The deepest nesting accepted: of brackets in the text, and of the parsed expression's tree.
JMESPath parses and evaluates recursively, so a deeper expression (500 nested parentheses) would
exhaust Python's stack; it is refused when the plan is validated."""

_OPENING: Final = frozenset("([{")
_CLOSING: Final = frozenset(")]}")
# Quoted identifiers, raw strings and JSON literals: their brackets are text, not nesting.
_QUOTES: Final = frozenset("\"'`")

_FUNCTIONS: Final = Functions().FUNCTION_TABLE
# Nodes whose children are evaluated against what their left part gives, not the current node.
_SCOPED: Final = frozenset({"projection", "value_projection", "filter_projection", "pipe"})


@dataclass(frozen=True, slots=True)
class Expression:
    """A parsed, checked expression.

    Attributes:
        text: The expression as written.
        steps: The step ids it reads (the top-level names other than ``inputs``).
        reads_inputs: Whether it reads the plan's inputs.
    """

    text: str
    steps: frozenset[str]
    reads_inputs: bool
    _parsed: ParsedResult

    def evaluate(
        self,
        outputs: Mapping[str, Any],
        inputs: Mapping[str, Any] | None,
        bound: Mapping[str, Any] | None = None,
        *,
        max_items: int | None = None,
    ) -> Any:
        """The expression's value over the succeeded steps' ``outputs`` and the plan's ``inputs``.

        ``bound`` names values that are not steps' outputs (a map's ``item`` and ``index``); a
        bound name hides a step of the same id. ``max_items`` bounds every list the evaluation
        builds (projections, filters, flattening): it stops as soon as one passes the bound,
        rather than building it whole first.

        Raises:
            ExpressionError: When evaluating fails (a function given the wrong type, ...), or a
                list it builds passes ``max_items``.
        """
        document: dict[str, Any] = {
            step_id: outputs[step_id] for step_id in self.steps if step_id in outputs
        }
        if self.reads_inputs:
            document[INPUTS] = dict(inputs or {})
        if bound:
            document.update((name, value) for name, value in bound.items() if name in self.steps)
        try:
            if max_items is None:
                return self._parsed.search(document)
            return _BoundedInterpreter(max_items).visit(self._parsed.parsed, document)
        except _TooMany:
            raise ExpressionError(
                self.text, f"it gives more than max_items {max_items} items (stopped there)"
            ) from None
        except jmespath_errors.JMESPathError as exc:
            raise ExpressionError(self.text, _one_line(exc)) from exc
        except (TypeError, ValueError) as exc:  # jmespath lets some comparisons of types through
            raise ExpressionError(self.text, f"{type(exc).__name__}: {exc}") from exc


class _TooMany(Exception):
    """A list being built passed its bound."""


class _BoundedInterpreter(TreeInterpreter):
    """JMESPath's evaluation, each list it builds counted as it grows: a projection, filter or
    flattening that would pass ``limit`` items stops at the next one (``_TooMany``)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit

    def _add(self, collected: list[Any], value: Any) -> None:
        if value is not None:
            if len(collected) >= self._limit:
                raise _TooMany
            collected.append(value)

    def visit_projection(self, node: Any, value: Any) -> Any:
        left, right = node["children"][0], node["children"][1]
        base = self.visit(left, value)
        if not isinstance(base, list):
            return None
        collected: list[Any] = []
        for element in base:
            self._add(collected, self.visit(right, element))
        return collected

    def visit_value_projection(self, node: Any, value: Any) -> Any:
        left, right = node["children"][0], node["children"][1]
        base = self.visit(left, value)
        if not isinstance(base, dict):
            return None
        collected: list[Any] = []
        for element in base.values():
            self._add(collected, self.visit(right, element))
        return collected

    def visit_filter_projection(self, node: Any, value: Any) -> Any:
        left, right, condition = node["children"][0], node["children"][1], node["children"][2]
        base = self.visit(left, value)
        if not isinstance(base, list):
            return None
        collected: list[Any] = []
        for element in base:
            if truthy(self.visit(condition, element)):
                self._add(collected, self.visit(right, element))
        return collected

    def visit_flatten(self, node: Any, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        collected: list[Any] = []
        for element in base:
            if isinstance(element, list):
                if len(collected) + len(element) > self._limit:
                    raise _TooMany
                collected.extend(element)
            else:
                if len(collected) >= self._limit:
                    raise _TooMany
                collected.append(element)
        return collected


def expression(text: str) -> Expression:
    """Parse and check ``text`` (cached by text).

    Raises:
        ExpressionError: When it does not parse, calls an unknown function or one with the wrong
            number of arguments, or reads the whole document.
    """
    if not isinstance(text, str):
        raise ExpressionError(repr(text), "an expression must be a string")
    return _parse(text)


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Expression:
    if not text.strip():
        raise ExpressionError(text, "the expression is empty")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(text[:40] + "...", f"longer than {MAX_LENGTH} characters")
    too_deep = f"nested deeper than {MAX_DEPTH} levels"
    if _bracket_depth(text) > MAX_DEPTH:
        raise ExpressionError(_shown(text), too_deep)
    try:
        parsed = jmespath.compile(text)
    except jmespath_errors.JMESPathError as exc:
        raise ExpressionError(text, _one_line(exc)) from exc
    except RecursionError:  # nesting without brackets (``!!!...a``): the parser recursed
        raise ExpressionError(_shown(text), too_deep) from None
    if _tree_depth(parsed.parsed) > MAX_DEPTH:
        raise ExpressionError(_shown(text), too_deep)
    names: set[str] = set()
    for problem in _check(parsed.parsed, True, names):
        raise ExpressionError(text, problem)
    return Expression(text, frozenset(names - {INPUTS}), INPUTS in names, parsed)


def _bracket_depth(text: str) -> int:
    """The deepest nesting of brackets in ``text``, quoted parts skipped, without recursion."""
    depth = deepest = 0
    quote = ""
    escaped = False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in _QUOTES:
            quote = char
        elif char in _OPENING:
            depth += 1
            deepest = max(deepest, depth)
        elif char in _CLOSING:
            depth -= 1
    return deepest


def _tree_depth(root: Any) -> int:
    """The depth of a parsed expression's tree, without recursion."""
    deepest = 0
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.get("children", []))
    return deepest


def _shown(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "..."


def _check(node: Any, at_root: bool, names: set[str]) -> Iterator[str]:
    """Collect the top-level names ``node`` reads into ``names``; yield what is wrong with it.

    ``at_root``: whether ``node`` is evaluated against the whole document (not an item of it).
    """
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    children = [c for c in node.get("children", []) if isinstance(c, dict)]
    if kind == "field":
        if at_root:
            names.add(node["value"])
        return
    if at_root and kind in ("current", "identity"):
        yield "it reads the whole document (@): name the steps it reads"
        return
    if kind == "function_expression":
        name = node["value"]
        spec = _FUNCTIONS.get(name)
        if spec is None:
            yield f"unknown function {name}() (JMESPath's: {', '.join(sorted(_FUNCTIONS))})"
            return
        signature = spec["signature"]
        variadic = bool(signature) and bool(signature[-1].get("variadic"))
        count = len(node["children"])
        if (variadic and count < len(signature)) or (not variadic and count != len(signature)):
            expected = f"at least {len(signature)}" if variadic else str(len(signature))
            yield f"{name}() takes {expected} argument(s), not {count}"
            return
        for child in children:
            yield from _check(child, at_root and child.get("type") != "expref", names)
        return
    if kind == "expref":
        for child in children:
            yield from _check(child, False, names)
        return
    if kind in _SCOPED or kind in ("subexpression", "index_expression"):
        # The left part is read where this node is; the rest against what it gives.
        if at_root and kind == "value_projection" and children:
            first = children[0]
            if first.get("type") in ("current", "identity"):
                yield "it reads the whole document (*): name the steps it reads"
                return
        for position, child in enumerate(children):
            yield from _check(child, at_root and position == 0, names)
        return
    for child in children:  # comparators, and/or/not, multi-selects, flatten, literals, ...
        yield from _check(child, at_root, names)


# What a function gives, for the functions whose value is never a list (JMESPath's table says what
# they take, not what they give).
_SCALAR_FUNCTIONS: Final = {
    "abs": "a number",
    "avg": "a number",
    "ceil": "a number",
    "floor": "a number",
    "length": "a number",
    "sum": "a number",
    "to_number": "a number",
    "contains": "a boolean",
    "ends_with": "a boolean",
    "starts_with": "a boolean",
    "join": "a string",
    "to_string": "a string",
    "type": "a string",
    "merge": "an object",
}


def list_kind(text: str) -> str | None:
    """What expression ``text`` gives when that is certainly not a list (``"a number"``, ...), as
    far as its form shows; ``None`` when it may give a list.

    Raises:
        ExpressionError: When ``text`` is not a valid expression.
    """
    node: Any = expression(text)._parsed.parsed
    while isinstance(node, dict) and node.get("type") == "pipe":  # a pipe gives its right side
        node = node["children"][-1]
    if not isinstance(node, dict):
        return None
    kind = node.get("type")
    if kind == "comparator" or kind in ("and_expression", "or_expression", "not_expression"):
        return "a boolean"
    if kind == "multi_select_dict":
        return "an object"
    if kind == "literal":
        value = node.get("value")
        return None if isinstance(value, list) else kind_of(value)
    if kind == "function_expression":
        return _SCALAR_FUNCTIONS.get(node["value"])
    return None


def kind_of(value: Any) -> str:
    """A JSON-ish name for the type of ``value`` (``an object``, ``a list``, ...), for messages."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"


def truthy(value: Any) -> bool:
    """JMESPath's truth: ``false``, ``null``, ``""``, ``[]`` and ``{}`` are false."""
    if value is None or value is False:
        return False
    if isinstance(value, str | list | tuple | dict):
        return len(value) > 0
    return True


def _one_line(exc: jmespath_errors.JMESPathError) -> str:
    if isinstance(exc, jmespath_errors.IncompleteExpressionError):
        return "the expression is incomplete"
    if isinstance(exc, jmespath_errors.ParseError):
        where = f" at column {exc.lex_position}" if exc.lex_position is not None else ""
        token = f" near {exc.token_value!r}" if exc.token_value not in (None, "") else ""
        return f"does not parse{where}{token}: {exc.msg}"
    if isinstance(exc, jmespath_errors.UnknownFunctionError):
        return str(exc)
    return " ".join(str(exc).split())
