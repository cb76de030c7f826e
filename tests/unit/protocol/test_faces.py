"""The wire faces' one seam: ``FACES``, ``FaceSettings`` and ``start_face`` (no sockets here).

A face is one row; mutual TLS leaves out or refuses the faces that take bearer tokens only,
before anything starts; a toy row starts through the same seam as the shipped ones; and no
product module outside ``protocol/_faces.py`` (and each face's own package) builds a face's
server, so a host can only start faces through the table.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import cast

import pytest

from stratagem.protocol import (
    FACES,
    AgentBackend,
    AgentServer,
    Face,
    FaceError,
    FaceKind,
    FaceSettings,
    ProtocolUsageError,
    face_kind,
    start_face,
)

REPO = Path(__file__).resolve().parents[3]
# A face's server and its configuration: built by its row in ``protocol/_faces.py`` only.
FACE_SERVERS = frozenset({"A2AServer", "A2AConfig", "McpFace", "McpFaceConfig"})
# Where they may be named: the table, each face's own package, and the package's re-exports.
ALLOWED = ("protocol/_faces.py", "protocol/_a2a/", "protocol/_mcp/", "protocol/__init__.py")


class _Untouchable:
    """A server or backend that no path under test may use."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"touched {name}")


SERVER = cast(AgentServer, _Untouchable())
BACKEND = cast(AgentBackend, _Untouchable())


def test_the_table_has_grpc_first_then_a2a_and_mcp() -> None:
    assert [kind.name for kind in FACES] == ["grpc", "a2a", "mcp"]
    assert len({kind.info_key for kind in FACES}) == len(FACES)
    assert face_kind("mcp") is FACES[2]
    with pytest.raises(ProtocolUsageError, match=r"no wire face 'smtp' \(known: grpc, a2a, mcp\)"):
        face_kind("smtp")


async def test_mutual_tls_leaves_a2a_out_before_it_starts() -> None:
    assert await start_face(face_kind("a2a"), SERVER, BACKEND, FaceSettings(mtls=True)) is None


async def test_mutual_tls_refuses_the_mcp_face_naming_the_setting() -> None:
    settings = FaceSettings(mtls=True, setting="mcp_ports")
    with pytest.raises(FaceError) as raised:
        await start_face(face_kind("mcp"), SERVER, BACKEND, settings)
    assert str(raised.value) == (
        "the MCP face takes bearer tokens; it cannot serve with auth=mtls "
        "(remove the role from mcp_ports)"
    )


@pytest.mark.parametrize(("field", "value"), [("port", 70000), ("max_message_bytes", 0)])
def test_bad_face_settings_name_the_field(field: str, value: int) -> None:
    with pytest.raises(ProtocolUsageError, match=rf"FaceSettings\.{field}"):
        FaceSettings(**{field: value})  # type: ignore[arg-type]


class _ToyFace:
    def __init__(self, settings: FaceSettings) -> None:
        self.url = f"toy://{settings.host}:{settings.port}"
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


async def test_a_new_face_is_one_row() -> None:
    seen: list[tuple[AgentServer, AgentBackend, FaceSettings]] = []

    async def start(server: AgentServer, backend: AgentBackend, settings: FaceSettings) -> Face:
        seen.append((server, backend, settings))
        return _ToyFace(settings)

    toy = FaceKind("toy", "toy face", start, under_mtls="serve", info_key="toy_url")
    settings = FaceSettings(port=4242, mtls=True)
    face = await start_face(toy, SERVER, BACKEND, settings)
    assert face is not None
    assert face.url == "toy://127.0.0.1:4242"
    assert seen == [(SERVER, BACKEND, settings)]


def _face_servers_named(path: Path) -> set[str]:
    """The face servers' names ``path`` imports or uses."""
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            named |= {alias.name for alias in node.names} & FACE_SERVERS
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in FACE_SERVERS:
                named.add(name)
    return named


def _product_sources() -> list[Path]:
    return [
        path
        for layer in ("protocol", "planning", "agents", "runtime")
        for path in sorted((REPO / layer).rglob("*.py"))
        if "_gen" not in path.parts
    ]


def test_only_the_table_builds_a_face() -> None:
    outside = {
        str(path.relative_to(REPO)): named
        for path in _product_sources()
        if not str(path.relative_to(REPO)).startswith(ALLOWED)
        if (named := _face_servers_named(path))
    }
    assert outside == {}


def test_the_face_check_sees_a_face_built_inline(tmp_path: Path) -> None:
    # The check itself, on the regression it guards against: the actor as it is, plus A2A
    # started inline again.
    actor = tmp_path / "_actor.py"
    actor.write_text(
        (REPO / "runtime" / "host" / "_actor.py").read_text()
        + "\n\nasync def _inline(server, agent):\n"
        + "    from stratagem.protocol import A2AConfig, A2AServer\n"
        + "    await A2AServer(server, agent, A2AConfig()).start()\n"
    )
    assert _face_servers_named(actor) == {"A2AServer", "A2AConfig"}
