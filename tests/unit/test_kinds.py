"""Tests sit in the folder of their kind: unit tests reach no network and start no Ray."""

from __future__ import annotations

import ast
import socket
import sys
from pathlib import Path

import grpc
import grpc.aio
import pytest

import stratagem.runtime.host._launcher
from tests.conftest import KINDS, kind_of, mark_kinds
from tests.unit.conftest import NetworkInUnitTest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("family", "address"), [(socket.AF_INET, ("127.0.0.1", 0)), (socket.AF_INET6, ("::1", 0))]
)
def test_a_unit_test_cannot_bind_or_connect_a_network_socket(
    family: socket.AddressFamily, address: tuple[str, int]
) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        with pytest.raises(NetworkInUnitTest, match=r"socket\.bind"):
            sock.bind(address)
        with pytest.raises(NetworkInUnitTest, match=r"socket\.connect"):
            sock.connect(address)
        with pytest.raises(NetworkInUnitTest, match=r"socket\.connect_ex"):
            sock.connect_ex(address)


def test_a_local_socket_pair_still_works() -> None:
    # asyncio's event loop wakes itself through one.
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"


@pytest.mark.parametrize("module", [grpc, grpc.aio], ids=["grpc", "grpc.aio"])
@pytest.mark.parametrize("name", ["server", "insecure_channel", "secure_channel"])
def test_a_unit_test_cannot_make_a_grpc_server_or_channel(module: object, name: str) -> None:
    with pytest.raises(NetworkInUnitTest, match=name):
        getattr(module, name)("127.0.0.1:1")


def test_a_unit_test_cannot_start_ray() -> None:
    # The launcher loads Ray when this module is collected, before the guard of this test starts.
    assert stratagem.runtime.host._launcher.ray is sys.modules["ray"]
    with pytest.raises(NetworkInUnitTest, match=r"ray\.init"):
        sys.modules["ray"].init()


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_unit_test_file_imports_ray() -> None:
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted((TESTS / "unit").rglob("*.py"))
        if any(name == "ray" or name.startswith("ray.") for name in _imported_modules(path))
    ]
    assert offenders == [], f"move to tests/integration/: {offenders}"


def test_every_test_gets_the_marker_of_its_folder(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert kind_of(TESTS / "unit" / "x.py") == "unit"
    assert kind_of(TESTS / "integration" / "protocol" / "x.py") == "integration"
    assert kind_of(TESTS / "e2e" / "x.py") == "e2e"
    assert kind_of(TESTS / "cluster" / "x.py") == "integration"
    assert kind_of(TESTS / "bench" / "x.py") is None


def test_the_kinds_are_declared_markers(pytestconfig: pytest.Config) -> None:
    declared = {line.split(":")[0].strip() for line in pytestconfig.getini("markers")}
    assert set(KINDS) <= declared


def test_a_test_marked_with_another_kind_than_its_folder_is_named(
    pytester: pytest.Pytester,
) -> None:
    unit = pytester.mkdir("unit")
    (unit / "test_misfiled.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.integration\ndef test_misfiled():\n    pass\n\n"
        "def test_plain():\n    pass\n",
        encoding="utf-8",
    )
    items, _ = pytester.inline_genitems(
        str(unit), "-o", "asyncio_default_fixture_loop_scope=function"
    )
    assert mark_kinds(items, pytester.path) == [
        "unit/test_misfiled.py::test_misfiled is marked integration (unit folder)"
    ]
    assert all(item.get_closest_marker("unit") for item in items)
