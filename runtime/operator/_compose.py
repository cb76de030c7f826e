"""How ``Operator`` is composed: one part per noun, each built with only what it uses, and one
table of verbs that ``Operator`` and ``SyncOperator`` both read.

A part is a plain class in a module of its own (``_agents.Agents``, ``_plans.Plans``,
``_worlds.Worlds``...): its constructor names, by type, the services it uses (the ``_link.Link``
to the agents, or other parts), and ``Parts`` builds each part on first use from those
annotations, once per operator. No part inherits from another or reads another's fields: what a
part may touch is visible in its constructor (STYLE rules 16 and 20).

A verb is one line of ``_operator.Verbs``, ``name = verb(Part.method)``: on an ``Operator`` it
is the part's coroutine method (the same signature, types and doc), on a ``SyncOperator`` the
same method run to completion on that operator's loop. Neither class writes the method again.
"""

from __future__ import annotations

import functools
import sys
import typing
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

__all__ = ["Parts", "stream", "verb", "verbs"]

S = TypeVar("S")
P = ParamSpec("P")
T = TypeVar("T")
Y = TypeVar("Y")


class AwaitingHost(Protocol):
    """What a verb needs of ``_operator.Operator``: its parts, and no way to finish a coroutine
    (its caller awaits it)."""

    _parts: Parts
    _finish: None


class BlockingHost(Protocol):
    """What a verb needs of ``_operator_sync.SyncOperator``: the parts of its operator and the
    way it runs a coroutine to its end (on its loop)."""

    _parts: Parts
    _finish: Callable[[Coroutine[Any, Any, Any]], Any]


class Parts:
    """An operator's parts, each built on first use from the services its constructor names by
    type (``services``: those given ready-made, such as the ``Link``), and kept."""

    def __init__(self, *services: object) -> None:
        self._built: dict[type[Any], object] = {type(service): service for service in services}

    def get(self, part: type[S]) -> S:
        """The operator's ``part``, built now if it was not yet (and the parts it names)."""
        found = self._built.get(part)
        if found is None:
            found = part(**{name: self.get(kind) for name, kind in needs(part).items()})
            self._built[part] = found
        return cast(S, found)

    def built(self) -> list[object]:
        """The services and parts made so far, in the order they were."""
        return list(self._built.values())


def needs(part: type[Any]) -> dict[str, type[Any]]:
    """What ``part``'s constructor takes: each parameter's name and the class it names.

    Raises:
        TypeError: A parameter that does not name a service's class (a part takes services
            only: no value such as an ``int``, no union), or names one its module imports only
            for the type checker.
    """
    try:
        hints = typing.get_type_hints(part.__init__)
    except NameError as exc:  # a service's class imported under TYPE_CHECKING only
        raise TypeError(
            f"{part.__name__} names a service its module does not import at run time: {exc}"
        ) from exc
    hints.pop("return", None)
    wrong = [
        name
        for name, kind in hints.items()
        if not isinstance(kind, type) or kind.__module__ == "builtins"
    ]
    if wrong:
        raise TypeError(f"{part.__name__} takes services by their class only, not {wrong}")
    return hints


class verb(Generic[S, P, T]):
    """An operator verb: the coroutine method ``method`` of a part (``Part.method``), offered by
    ``Operator`` as is and by ``SyncOperator`` run to completion."""

    def __init__(self, method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]]) -> None:
        self.method = method
        self.name = method.__name__
        functools.update_wrapper(self, method)  # its name and doc

    @functools.cached_property
    def part(self) -> type[S]:
        """The part class ``method`` is defined on."""
        return cast(type[S], _part_class(self.method))

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> verb[S, P, T]: ...
    @overload
    def __get__(
        self, instance: AwaitingHost, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, instance: BlockingHost, owner: type[Any]) -> Callable[P, T]: ...
    def __get__(
        self, instance: AwaitingHost | BlockingHost | None, owner: type[Any]
    ) -> verb[S, P, T] | Callable[P, Coroutine[Any, Any, T]] | Callable[P, T]:
        if instance is None:
            return self
        bound: Callable[P, Coroutine[Any, Any, T]] = getattr(
            instance._parts.get(self.part), self.name
        )
        finish: Callable[[Coroutine[Any, Any, Any]], Any] | None = instance._finish
        if finish is None:
            return bound

        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            done: T = finish(bound(*args, **kwargs))
            return done

        functools.update_wrapper(run, bound)  # the bound method's name, doc and signature
        return run

    def __call__(self, host: AwaitingHost | BlockingHost, /, *args: Any, **kwargs: Any) -> Any:
        """The verb called through the class, ``Operator.fork(op, ...)``, as ``op.fork(...)``."""
        return self.__get__(host, type(host))(*args, **kwargs)


def _part_class(method: Callable[..., Any]) -> type[Any]:
    """The class ``method`` is defined on (a module-level class of its module)."""
    owner, _, _ = method.__qualname__.rpartition(".")
    found = getattr(sys.modules[method.__module__], owner, None)
    if not isinstance(found, type):
        raise TypeError(f"{method.__name__!r}: {owner!r} is not a module-level part class")
    return found


class stream(Generic[S, P, Y]):
    """An ``Operator`` method that is a part's stream (an async generator method): the part's
    method as is (``SyncOperator`` iterates it in a method of its own)."""

    def __init__(self, method: Callable[Concatenate[S, P], AsyncGenerator[Y, None]]) -> None:
        self.method = method
        functools.update_wrapper(self, method)  # type: ignore[arg-type]  # its name and doc

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> stream[S, P, Y]: ...
    @overload
    def __get__(
        self, instance: AwaitingHost, owner: type[Any]
    ) -> Callable[P, AsyncGenerator[Y, None]]: ...
    def __get__(
        self, instance: AwaitingHost | None, owner: type[Any]
    ) -> stream[S, P, Y] | Callable[P, AsyncGenerator[Y, None]]:
        if instance is None:
            return self
        found: Callable[P, AsyncGenerator[Y, None]] = getattr(
            instance._parts.get(self.part), self.method.__name__
        )
        return found

    @functools.cached_property
    def part(self) -> type[S]:
        """The part class ``method`` is defined on."""
        return cast(type[S], _part_class(self.method))


def verbs(table: type[Any]) -> dict[str, verb[Any, Any, Any]]:
    """Every verb ``table`` (a class and its bases) declares, by name."""
    found: dict[str, verb[Any, Any, Any]] = {}
    for klass in reversed(table.__mro__):
        found.update({n: v for n, v in vars(klass).items() if isinstance(v, verb)})
    return found
