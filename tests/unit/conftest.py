"""Unit tests run without the network and without Ray: a guard fails any test that tries.

While a test under ``tests/unit`` is set up, run and torn down (fixtures of every scope included),
the Python socket calls that reach the network (``connect``, ``connect_ex`` and ``bind`` on an IPv4
or IPv6 socket), gRPC's server and channel constructors (``grpc`` and ``grpc.aio``) and
``ray.init`` raise ``NetworkInUnitTest``: such a test belongs under ``tests/integration/``. Local
socket pairs (asyncio's wake-up pipe) stay allowed. ``ray.init`` is replaced from the first test
phase that starts with Ray loaded (before that, starting Ray still meets the socket guard). Not
seen: C libraries that open sockets themselves (libpq, for the tests marked ``postgres``, which
need an external server and skip without one) and child processes; ``tests/unit/test_kinds.py``
checks statically that no unit test file imports Ray.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import NoReturn

import grpc
import grpc.aio
import pytest

_INET = (socket.AF_INET, socket.AF_INET6)
_GRPC_CONSTRUCTORS = ("server", "insecure_channel", "secure_channel")


class NetworkInUnitTest(AssertionError):
    """A unit test opened a network socket, a gRPC server or channel, or started Ray."""


def _refuse(what: str) -> Callable[..., NoReturn]:
    def refused(*args: object, **kwargs: object) -> NoReturn:
        raise NetworkInUnitTest(f"{what} in a unit test: move the test to tests/integration/")

    return refused


def _guarded_socket_method(name: str) -> Callable[..., object]:
    original = getattr(socket.socket, name)

    def guarded(self: socket.socket, *args: object, **kwargs: object) -> object:
        if self.family in _INET:
            _refuse(f"socket.{name}")()
        return original(self, *args, **kwargs)

    return guarded


@contextmanager
def no_network() -> Iterator[None]:
    """Within the block, reaching the network or starting Ray raises ``NetworkInUnitTest``."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("connect", "connect_ex", "bind"):
            patch.setattr(socket.socket, name, _guarded_socket_method(name))
        for module in (grpc, grpc.aio):
            for name in _GRPC_CONSTRUCTORS:
                patch.setattr(module, name, _refuse(f"{module.__name__}.{name}"))
        ray = sys.modules.get("ray")
        if ray is not None:
            patch.setattr(ray, "init", _refuse("ray.init"))
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with no_network():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with no_network():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    if nextitem is None:  # the session's own fixtures (other folders' too) are torn down here
        return (yield)
    with no_network():
        return (yield)
