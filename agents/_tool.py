"""Tools and the per-agent tool registry.

A :class:`Tool` is an async function from a pydantic input model to a pydantic output model, with
the facts the engine needs to run it safely: whether it has side effects, whether repeating it is
harmless, and what it costs. A :class:`ToolRegistry` holds the only tools one agent may call and is
that agent's :class:`planning.ToolRunner`: it validates each input and output at the boundary, so a
plan step with a bad input fails as a logic error naming the field instead of crashing the tool.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar, get_args, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from stratagem.planning import LogicError, ToolContext

__all__ = ["Tool", "ToolRegistry", "tool"]

logger = logging.getLogger(__name__)

InT = TypeVar("InT", bound=BaseModel)
OutT = TypeVar("OutT", bound=BaseModel)
T = TypeVar("T")

_RESULT_FIELD = "result"

VALIDATES_OFF_LOOP: Final = "validates_off_loop_"
"""A model class attribute: ``True`` when validating the model may take far longer than the
microseconds pydantic's own checks take (a foreign JSON Schema's patterns, checked within a
deadline of seconds): the registry then validates that tool's input and output in a worker thread.
``agents.JsonSchemaModel`` sets it; a tool whose models, and the models in their fields, do not
set it is validated on the event loop, without a thread hop per step."""


@dataclass(frozen=True, slots=True)
class Tool(Generic[InT, OutT]):
    """One tool an agent may call.

    Attributes:
        name: The tool's name, unique in its registry; plan steps name it.
        description: One line on what the tool does.
        input_model: The pydantic model its input is validated against.
        output_model: The pydantic model its output is validated against.
        fn: The implementation: ``await fn(input, ctx)`` returns an ``output_model`` instance.
        side_effects: Whether it changes anything outside its output (the world model, a store).
        idempotent: Whether running it twice with the same input is the same as running it once;
            the engine re-runs an interrupted step only when it is (otherwise the plan waits at a
            reconcile gate). When not given: ``True`` for a tool without side effects, ``False``
            for one with side effects, so exactly-once is the default a tool opts out of.
        cost: Cost units charged to a plan's budget per call.
    """

    name: str
    description: str
    input_model: type[InT]
    output_model: type[OutT]
    fn: Callable[[InT, ToolContext], Awaitable[OutT]]
    side_effects: bool = False
    idempotent: bool | None = None
    cost: float = 1.0

    def __post_init__(self) -> None:
        if self.idempotent is None:
            object.__setattr__(self, "idempotent", not self.side_effects)

    async def __call__(self, data: InT, ctx: ToolContext) -> OutT:
        """Run the tool on an already validated input."""
        return await self.fn(data, ctx)


def _model_name(name: str, suffix: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + suffix


def _model(model_name: str, fields: dict[str, Any]) -> type[BaseModel]:
    model: type[BaseModel] = create_model(
        model_name, __config__=ConfigDict(extra="forbid", frozen=True), **fields
    )
    return model


def _derive(
    fn: Callable[..., Awaitable[Any]],
    name: str,
) -> tuple[type[BaseModel], type[BaseModel], Callable[[Any, ToolContext], Awaitable[Any]]]:
    """Input model, output model and a ``(input, ctx)`` adapter for an annotated function."""
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    ctx_params = [p.name for p in params if hints.get(p.name) is ToolContext]
    data_params = [p for p in params if p.name not in ctx_params]
    for param in params:
        if param.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {param.name!r} has no annotation")
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs are not supported")
    if "return" not in hints:
        raise TypeError(f"tool {name!r}: the return type must be annotated")
    ctx_name = ctx_params[0] if ctx_params else None

    single = (
        len(data_params) == 1
        and isinstance(hints[data_params[0].name], type)
        and issubclass(hints[data_params[0].name], BaseModel)
    )
    input_model: type[BaseModel]
    if single:
        input_model = hints[data_params[0].name]
    else:
        input_model = _model(
            _model_name(name, "Input"),
            {
                p.name: (hints[p.name], ... if p.default is p.empty else p.default)
                for p in data_params
            },
        )
    returns = hints["return"]
    wrapped = not (isinstance(returns, type) and issubclass(returns, BaseModel))
    output_model: type[BaseModel]
    if wrapped:
        output_model = _model(_model_name(name, "Output"), {_RESULT_FIELD: (returns, ...)})
    else:
        output_model = returns

    async def adapter(data: Any, ctx: ToolContext) -> Any:
        if single:
            args: dict[str, Any] = {data_params[0].name: data}
        else:
            args = {p.name: getattr(data, p.name) for p in data_params}
        if ctx_name is not None:
            args[ctx_name] = ctx
        result = await fn(**args)
        return output_model.model_validate({_RESULT_FIELD: result}) if wrapped else result

    return input_model, output_model, adapter


async def in_thread(fn: Callable[..., T], /) -> T:
    """Run CPU-bound work on a worker thread, where cancellation can still reach it.

    ``fn`` is called as ``fn(should_stop=...)``: a function it must ask every few milliseconds,
    returning as soon as it says ``True``. When the awaiting task is cancelled (the request's
    deadline passed, the step timed out, the plan was cancelled), ``should_stop`` starts saying
    so, and the thread ends with the next look instead of running on for nothing. A function that
    never asks runs to its end on its thread, as any blocking call does: only cooperation stops
    a Python thread.
    """
    stop = threading.Event()
    try:
        return await asyncio.to_thread(fn, should_stop=stop.is_set)
    except asyncio.CancelledError:
        stop.set()
        raise


@overload
def tool(fn: Callable[[InT, ToolContext], Awaitable[OutT]], /) -> Tool[InT, OutT]: ...


@overload
def tool(fn: Callable[..., Awaitable[Any]], /) -> Tool[Any, Any]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    idempotent: bool | None = None,
    cost: float = 1.0,
) -> Callable[[Callable[..., Awaitable[Any]]], Tool[Any, Any]]: ...


def tool(
    fn: Callable[..., Awaitable[Any]] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    idempotent: bool | None = None,
    cost: float = 1.0,
) -> Tool[Any, Any] | Callable[[Callable[..., Awaitable[Any]]], Tool[Any, Any]]:
    """Make a :class:`Tool` from an annotated async function.

    The function either takes one pydantic model (plus, optionally, a parameter annotated
    ``ToolContext``) and returns a pydantic model, or takes plain annotated parameters, from which
    the input model is derived, and returns any annotated type, which is wrapped in an output model
    with a single ``result`` field.

    Example::

        @tool(side_effects=False)
        async def count_words(text: str) -> int:
            \"\"\"Count the words of a text.\"\"\"
            return len(text.split())

    Args:
        fn: The function, when used as a bare ``@tool``.
        name: The tool's name (default: the function's name).
        description: What it does (default: the first line of the function's docstring).
        side_effects: Whether it changes anything outside its output.
        idempotent: Whether repeating a call with the same input is harmless (default: when it
            has no side effects). A side-effecting tool is re-run after a crash only when it says
            ``idempotent=True``; otherwise its interrupted step waits at a reconcile gate.
        cost: Cost units per call.

    Returns:
        The tool (or, with keyword arguments only, a decorator that makes it).

    Raises:
        TypeError: The function is not async or is not fully annotated.
    """

    def make(func: Callable[..., Awaitable[Any]]) -> Tool[Any, Any]:
        tool_name = name or func.__name__
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"tool {tool_name!r}: the function must be async")
        input_model, output_model, adapter = _derive(func, tool_name)
        doc = inspect.getdoc(func) or ""
        return Tool(
            name=tool_name,
            description=description or (doc.splitlines()[0] if doc else tool_name),
            input_model=input_model,
            output_model=output_model,
            fn=adapter,
            side_effects=side_effects,
            idempotent=idempotent,
            cost=cost,
        )

    if fn is not None:
        return make(fn)
    return make


def _field_lines(exc: ValidationError) -> list[str]:
    """One ``"field.path[0]: message"`` line per error (the message alone at the top)."""
    problems = []
    for error in exc.errors(include_url=False):
        path = ""
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        problems.append(f"{path}: {error['msg']}" if path else str(error["msg"]))
    return problems


def _violations(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        if error["type"] == "json_schema" and not error["loc"]:
            parts.append(error["msg"])  # a JSON Schema's check names its own paths
            continue
        path = ""
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        parts.append(f"field {path or '(input)'!r}: {error['msg']}")
    return "; ".join(parts)


class ToolRegistry:
    """The tools one agent may call; implements :class:`planning.ToolRunner`.

    It is also a collection of tool names (``in``, ``len``, iteration), so it can be handed to
    ``planning.validate_plan(plan, tools=registry)`` as it is.

    Attributes:
        agent: The role of the agent that owns the registry (named in error messages).
    """

    def __init__(self, agent: str) -> None:
        """Create an empty registry for ``agent``."""
        self.agent = agent
        self._tools: dict[str, Tool[Any, Any]] = {}
        # The tools whose models validate off the event loop (see ``VALIDATES_OFF_LOOP``).
        self._off_loop: set[str] = set()

    def register(self, item: Tool[Any, Any], *, replace: bool = False) -> Tool[Any, Any]:
        """Add a tool.

        Args:
            item: The tool.
            replace: Allow replacing a tool of the same name.

        Returns:
            The tool, so ``registry.register(tool(fn))`` can be used inline.

        Raises:
            ValueError: A different tool with that name is registered and ``replace`` is false.
        """
        existing = self._tools.get(item.name)
        if existing is not None and existing is not item and not replace:
            raise ValueError(f"agent {self.agent!r} already has a tool named {item.name!r}")
        self._tools[item.name] = item
        self._off_loop.discard(item.name)
        if validates_off_loop(item.input_model) or validates_off_loop(item.output_model):
            self._off_loop.add(item.name)
        return item

    def get(self, name: str) -> Tool[Any, Any]:
        """The tool called ``name``.

        Raises:
            KeyError: The registry has no such tool.
        """
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"agent {self.agent!r} has no tool {name!r}") from None

    def is_idempotent(self, name: str) -> bool:
        """Whether tool ``name`` may be re-run safely (its ``Tool.idempotent``).

        The engine asks this when it resumes a plan whose step was in flight at a crash: an
        idempotent tool is re-run, any other step waits at a reconcile gate. An unknown tool is not
        idempotent.
        """
        item = self._tools.get(name)
        return item is not None and item.idempotent is True

    def cost(self, name: str) -> float:
        """The cost units a call of tool ``name`` reserves from a plan's budget (``Tool.cost``).

        An unknown tool costs 1.0; its call fails with a ``logic`` failure anyway.
        """
        item = self._tools.get(name)
        return 1.0 if item is None else item.cost

    def input_problems(self, name: str, input: dict[str, Any]) -> list[str]:
        """What is wrong with ``input`` as tool ``name``'s input: one line per field, naming it
        (``"amount: Input should be a valid number"``); empty when it fits its input model.

        The engine asks this of arguments an approver edited at a tool's approval gate.
        """
        item = self._tools.get(name)
        if item is None:
            return [f"agent {self.agent!r} has no tool {name!r}"]
        try:
            item.input_model.model_validate(input)
        except ValidationError as exc:
            return _field_lines(exc)
        return []

    def output_problems(self, name: str, output: dict[str, Any]) -> list[str]:
        """What is wrong with ``output`` as tool ``name``'s output (its JSON form, as a step's
        output holds it): one line per field, naming it; empty when it fits its output model.

        The engine asks this of an output substituted when a plan is forked.
        """
        item = self._tools.get(name)
        if item is None:
            return [f"agent {self.agent!r} has no tool {name!r}"]
        try:
            item.output_model.model_validate(output)
        except ValidationError as exc:
            return _field_lines(exc)
        return []

    def names(self) -> list[str]:
        """The tools' names, in registration order."""
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    async def run_tool(self, name: str, input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Validate ``input``, run the tool, validate and return its output as JSON-like data.

        Args:
            name: The tool's name.
            input: The tool's input, references already resolved.
            ctx: The step the tool runs for.

        Returns:
            The output model dumped in JSON mode.

        Raises:
            planning.LogicError: The tool is unknown, the input does not validate (the message
                names the field), or the output does not validate.
        """
        item = self._tools.get(name)
        if item is None:
            known = ", ".join(self._tools) or "none"
            raise LogicError(f"agent {self.agent!r} has no tool {name!r} (tools: {known})")
        # A tool whose models apply a foreign JSON Schema (an MCP tool's) is validated in a worker
        # thread: that check is bounded in time (planning.schema_errors) but must not hold the
        # event loop, which answers the agent's other calls meanwhile. Any other tool's models
        # validate in microseconds, less than the thread round trip would cost.
        off_loop = name in self._off_loop
        try:
            data = await _validated(item.input_model, input, off_loop=off_loop)
        except ValidationError as exc:
            raise LogicError(f"tool {name!r}: invalid input: {_violations(exc)}") from None
        result = await item.fn(data, ctx)
        try:
            if isinstance(result, item.output_model):
                output = result
            else:
                output = await _validated(
                    item.output_model,
                    result.model_dump() if isinstance(result, BaseModel) else result,
                    off_loop=off_loop,
                )
        except ValidationError as exc:
            raise LogicError(f"tool {name!r}: invalid output: {_violations(exc)}") from None
        logger.debug("agent %s tool %s ran", self.agent, name)
        dumped: dict[str, Any] = output.model_dump(mode="json")
        return dumped


async def _validated(model: type[BaseModel], data: Any, *, off_loop: bool) -> BaseModel:
    """``model.model_validate(data)``, in a worker thread when ``off_loop``."""
    if off_loop:
        return await asyncio.to_thread(model.model_validate, data)
    return model.model_validate(data)


def validates_off_loop(model: type[BaseModel]) -> bool:
    """Whether ``model``, or a model in its fields (nested in lists, unions, dicts...), sets
    ``VALIDATES_OFF_LOOP``."""
    seen: set[type[BaseModel]] = set()
    pending: list[Any] = [model]
    while pending:
        annotation = pending.pop()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation in seen:
                continue
            seen.add(annotation)
            if getattr(annotation, VALIDATES_OFF_LOOP, False) is True:
                return True
            pending.extend(field.annotation for field in annotation.model_fields.values())
        else:
            pending.extend(get_args(annotation))
    return False
