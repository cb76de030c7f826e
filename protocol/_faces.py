"""The wire faces of an agent, declared once: ``FACES``, one row per way a client reaches it.

Every face reaches the agent through the one audited pipeline of its ``AgentServer``: gRPC is the
server itself; A2A (``_a2a/``) and MCP (``_mcp/``) are HTTP servers whose every request goes
through the server's stages (``AgentServer.serve_foreign``). So a face is started with the
agent's started server, the agent (its backend) and its ``FaceSettings`` (one shape for every
face), and is then a ``Face``: a URL, and ``aclose``. A host (the runtime's actor) loops over
``FACES``, starts the rows its deployment asks for with ``start_face``, and closes them in the
reverse order.

Faces that take bearer tokens only (A2A, MCP: their HTTP carries no client certificate) cannot
serve a deployment that authenticates with mutual TLS; a row says whether such a face is then
left out silently (A2A: served by default, so a mTLS deployment simply has none) or refused
(MCP: asked for by name, so asking is an error). A new face is its module (the server, with
``start`` and ``aclose``), one ``_start_*`` function here that builds its configuration from
``FaceSettings``, and one row; the SDKs a face needs are imported only when it starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._server import AgentServer
from stratagem.protocol._service import AgentBackend

__all__ = [
    "FACES",
    "Face",
    "FaceError",
    "FaceKind",
    "FaceSettings",
    "face_kind",
    "start_face",
]

_LOOPBACK: Final = "127.0.0.1"


class FaceError(ProtocolUsageError):
    """A face cannot start for a reason its host words in one line (the face's setting, the
    deployment's authentication, an address that cannot be bound)."""


@dataclass(frozen=True, slots=True)
class FaceSettings:
    """What every face is started with: one shape for all of them.

    Attributes:
        host: The address to bind (loopback unless the deployment says otherwise).
        port: The port; 0 picks a free one.
        max_message_bytes: The largest request a client may send.
        task_deadline_s: How long work nobody waits for may run (A2A's ``returnImmediately``
            tasks); faces without such work do not read it.
        mtls: Whether the deployment authenticates with mutual TLS.
        setting: The host's setting that asked for this face, named in a refusal (``mcp_ports``).
    """

    host: str = _LOOPBACK
    port: int = 0
    max_message_bytes: int = 1 << 20
    task_deadline_s: float = 3600.0
    mtls: bool = False
    setting: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ProtocolUsageError(f"FaceSettings.port must be in 0..65535, not {self.port}")
        if self.max_message_bytes <= 0:
            raise ProtocolUsageError("FaceSettings.max_message_bytes must be positive")


class Face(Protocol):
    """A started face: where clients reach it, and how it stops."""

    @property
    def url(self) -> str:
        """Where its clients reach it (``host:port`` for gRPC, an ``http://`` URL otherwise)."""
        ...

    async def aclose(self) -> None:
        """Stop serving (calls in flight finish first, as the face allows)."""
        ...


_Start = Callable[[AgentServer, AgentBackend, FaceSettings], Awaitable[Face]]


@dataclass(frozen=True, slots=True)
class FaceKind:
    """One row of ``FACES``.

    Attributes:
        name: The face's name (``grpc``, ``a2a``, ``mcp``).
        title: How a one-line message names it.
        start: Starts it for a started server (see ``start_face``).
        under_mtls: What becomes of it in a mutual-TLS deployment: ``serve``, ``skip`` (no face,
            no error) or ``refuse`` (a ``FaceError``).
        info_key: The key of its URL in the host's report of the agent (``a2a_url``).
    """

    name: str
    title: str
    start: _Start
    under_mtls: Literal["serve", "skip", "refuse"]
    info_key: str


class _GrpcFace:
    """The gRPC face: the server itself, configured where it was built (the pipeline of every
    face is this server's, so its host builds it before any face starts)."""

    def __init__(self, server: AgentServer) -> None:
        self._server = server

    @property
    def url(self) -> str:
        return self._server.endpoint

    async def aclose(self) -> None:
        await self._server.aclose()


async def _start_grpc(server: AgentServer, backend: AgentBackend, settings: FaceSettings) -> Face:
    # Its host, port and message bound are the ServerConfig's: the host builds that from the
    # same FaceSettings, since the server exists before any face.
    await server.start()
    return _GrpcFace(server)


async def _start_a2a(server: AgentServer, backend: AgentBackend, settings: FaceSettings) -> Face:
    # Imported here: the A2A SDK, Starlette and uvicorn load only where A2A is served.
    from stratagem.protocol._a2a import A2AConfig, A2AServer

    face = A2AServer(
        server,
        backend,
        A2AConfig(
            host=settings.host,
            port=settings.port,
            max_message_bytes=settings.max_message_bytes,
            task_deadline_s=settings.task_deadline_s,
        ),
    )
    await face.start()
    return face


async def _start_mcp(server: AgentServer, backend: AgentBackend, settings: FaceSettings) -> Face:
    # Imported here: the mcp SDK's server, Starlette and uvicorn load only where MCP is served.
    from stratagem.protocol._mcp._face import McpFace, McpFaceConfig

    face = McpFace(
        server,
        McpFaceConfig(
            host=settings.host, port=settings.port, max_message_bytes=settings.max_message_bytes
        ),
    )
    try:
        await face.start()
    except Exception as exc:
        raise FaceError(str(exc)) from None
    return face


FACES: Final[tuple[FaceKind, ...]] = (
    FaceKind("grpc", "gRPC server", _start_grpc, under_mtls="serve", info_key="endpoint"),
    FaceKind("a2a", "A2A face", _start_a2a, under_mtls="skip", info_key="a2a_url"),
    FaceKind("mcp", "MCP face", _start_mcp, under_mtls="refuse", info_key="mcp_url"),
)
"""Every wire face, in the order a host starts them (and closes them in reverse): gRPC first,
since every other face serves through its pipeline."""


def face_kind(name: str) -> FaceKind:
    """The row named ``name``.

    Raises:
        ProtocolUsageError: No face has that name.
    """
    for kind in FACES:
        if kind.name == name:
            return kind
    known = ", ".join(kind.name for kind in FACES)
    raise ProtocolUsageError(f"no wire face {name!r} (known: {known})")


async def start_face(
    kind: FaceKind, server: AgentServer, backend: AgentBackend, settings: FaceSettings
) -> Face | None:
    """Start the face ``kind`` for ``backend`` behind ``server`` (started already, unless
    ``kind`` is gRPC's); ``None`` when a mutual-TLS deployment leaves it out.

    Raises:
        FaceError: It cannot serve this deployment (mutual TLS) or cannot bind its address.
        ProtocolUsageError: Another failure to start (A2A: its address cannot be bound).
    """
    if settings.mtls and kind.under_mtls != "serve":
        if kind.under_mtls == "skip":
            return None
        hint = f" (remove the role from {settings.setting})" if settings.setting else ""
        raise FaceError(
            f"the {kind.title} takes bearer tokens; it cannot serve with auth=mtls{hint}"
        )
    return await kind.start(server, backend, settings)
