"""An agent actor's wire faces: the deployment's settings in ``protocol.FaceSettings``' one shape,
and the loop over ``protocol.FACES`` that starts them and closes them.

The settings each face reads (unchanged names): gRPC ``grpc_host`` (else the node's address),
``ports`` and ``max_message_bytes``; A2A ``a2a`` (on by default), ``a2a_host``, ``a2a_ports``,
``max_message_bytes`` and ``a2a_task_deadline_s``; MCP ``mcp_ports`` (the roles that serve it, on
loopback). A face that cannot start stops the agent with one line (``McpSetupError``, whose
message the launcher prints as it is), after the faces already started are closed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from stratagem.protocol import (
    FACES,
    AgentBackend,
    AgentServer,
    Face,
    FaceError,
    FaceKind,
    FaceSettings,
    start_face,
)
from stratagem.runtime.config._settings import Settings
from stratagem.runtime.host._mcp import McpSetupError

__all__ = ["close_faces", "face_settings", "start_faces"]

logger = logging.getLogger(__name__)


def face_settings(settings: Settings, role: str, node_ip: str) -> dict[str, FaceSettings]:
    """The faces ``role``'s agent serves in this deployment, by ``FACES`` name, each with its
    settings; a face the settings do not ask for is absent."""
    mtls = settings.auth == "mtls"
    faces = {
        "grpc": FaceSettings(
            host=settings.grpc_host or node_ip,
            port=settings.ports.get(role, 0),
            max_message_bytes=settings.max_message_bytes,
            mtls=mtls,
            setting="ports",
        )
    }
    if settings.a2a:
        faces["a2a"] = FaceSettings(
            host=settings.a2a_host,
            port=settings.a2a_ports.get(role, 0),
            max_message_bytes=settings.max_message_bytes,
            task_deadline_s=settings.a2a_task_deadline_s,
            mtls=mtls,
            setting="a2a",
        )
    if role in settings.mcp_ports:
        faces["mcp"] = FaceSettings(
            port=settings.mcp_ports[role],
            max_message_bytes=settings.max_message_bytes,
            mtls=mtls,
            setting="mcp_ports",
        )
    return faces


async def start_faces(
    server: AgentServer,
    backend: AgentBackend,
    wanted: dict[str, FaceSettings],
    role: str,
    faces: Sequence[FaceKind] = FACES,
) -> dict[str, Face]:
    """Start the ``wanted`` faces in the order of ``faces`` (``FACES``: gRPC first, the others
    serve through its pipeline); the started ones by name (a face mutual TLS leaves out is not
    among them).

    Raises:
        McpSetupError: A face refuses this deployment or cannot bind (one line naming the agent);
            the faces started before it are closed.
    """
    started: dict[str, Face] = {}
    for kind in faces:
        if kind.name not in wanted:
            continue
        try:
            face = await start_face(kind, server, backend, wanted[kind.name])
        except FaceError as exc:
            await close_faces(started)
            raise McpSetupError(f"agent {role}: {exc}") from None
        except BaseException:
            await close_faces(started)
            raise
        if face is not None:
            started[kind.name] = face
    return started


async def close_faces(faces: dict[str, Face]) -> None:
    """Close ``faces`` in the reverse of their start order (gRPC last); a face that fails to
    close is logged and the others are still closed."""
    for name in reversed(list(faces)):
        try:
            await faces.pop(name).aclose()
        except Exception:
            logger.exception("cannot close the %s face", name)
