"""Ray as part of the trust boundary: the local head's token and loopback, and external clusters.

Whoever can talk to a deployment's Ray can run code in the agents' processes (call their actor
methods, read the secrets they hold in memory, read the state directory on their node): Ray
access is root over Stratagem. So:

- the local Ray head ``stratagem up`` starts uses Ray's token authentication
  (``RAY_AUTH_MODE=token``, the token in ``STATE_DIR/ray.token``, mode 0600, written by ``up``)
  and binds every port to 127.0.0.1; the Stratagem commands that join it present that token;
- deploying onto an external Ray that is not on loopback and does not ask for a token is refused
  unless the operator opts in (``--allow-unauthenticated-ray``, or
  ``STRATAGEM_ALLOW_UNAUTHENTICATED_RAY=1``).

Ray reads its authentication mode and token through its own configuration and a process-wide
token cache, and resolves ``127.0.0.1`` to the machine's network address unless multi-node
clusters are switched off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, a Ray constant read at import):
``join_local_head`` sets all three for this process before it connects. Those are Ray internals
(Ray 2.60); the integration test that connects with and without the token guards them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import socket
from enum import Enum
from pathlib import Path

__all__ = [
    "RayAuth",
    "create_token",
    "head_environment",
    "is_loopback",
    "join_local_head",
    "probe_auth",
]

LOOPBACK = "127.0.0.1"
_TOKEN_BYTES = 32


class RayAuth(Enum):
    """Whether a Ray cluster's GCS asks its callers for a token."""

    TOKEN = "token"
    NONE = "none"
    UNKNOWN = "unknown"


def create_token(path: Path) -> str:
    """Write a new random Ray token to ``path`` (mode 0600, replacing any older one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(_TOKEN_BYTES)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token)
    partial.replace(path)
    return token


def head_environment(token_path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``ray start --head`` that asks for ``token_path``'s token and binds
    to loopback (its GCS, raylet, workers and agents follow ``--node-ip-address=127.0.0.1`` only
    while multi-node clusters are switched off)."""
    env = dict(os.environ if base is None else base)
    env.pop("RAY_AUTH_TOKEN", None)  # it would take precedence over the file
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token_path),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    return env


def join_local_head(token_path: Path) -> None:
    """Make this process present ``token_path``'s token and keep the local head's loopback address.

    Raises:
        OSError: When the token file cannot be read.
    """
    if not token_path.read_text(encoding="ascii").strip():
        raise OSError(f"{token_path} is empty")
    from ray._private import ray_constants
    from ray._raylet import (  # type: ignore[attr-defined]  # compiled, untyped
        AuthenticationTokenLoader,
        Config,
    )

    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    ray_constants.ENABLE_RAY_CLUSTER = False  # do not turn 127.0.0.1 into the network address


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) resolves to loopback addresses only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def probe_auth(gcs_address: str, timeout_s: float = 5.0) -> RayAuth:
    """Ask the GCS at ``HOST:PORT`` for its cluster id without a token: refused means it asks for
    one, answered means anyone who reaches it may join."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = grpc.insecure_channel(gcs_address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)  # type: ignore[no-untyped-call]
        request = gcs_service_pb2.GetClusterIdRequest()  # type: ignore[attr-defined]
        stub.GetClusterId(request, timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        return RayAuth.TOKEN if code == grpc.StatusCode.UNAUTHENTICATED else RayAuth.UNKNOWN
    finally:
        with contextlib.suppress(Exception):
            channel.close()
    return RayAuth.NONE
