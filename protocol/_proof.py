"""Proving an endpoint before any credentials go there.

An endpoint read from a file (an agent's published endpoint in the state directory) says only
where something listened once: the port may be another process's by now, or the file planted. A
client holding the deployment's credentials therefore asks the agent there to prove that it holds
the deployment's key before it sends a token or a payload (``prove_endpoint``): the agent answers a
fresh nonce with an HMAC that only a holder of the client's own identity key, or of the cluster
secret, can make, over the nonce, its role and the endpoint it serves on (``_identity.
endpoint_proof``). A relay listening at another address gets a real agent's proof only for the
real agent's endpoint, which is not the one the client dialed. The server side is
``prove_handler``, served beside ``AgentService`` without credentials and without audit, like the
health service (it computes one HMAC and grants nothing).

With ``STRATAGEM_AUTH=mtls`` the TLS handshake proves the server (its certificate chains to the
cluster's CA), so there is nothing to prove here; with authentication off there is no key, and no
token to protect.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Callable
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError

from stratagem.protocol._errors import ProtocolError, UnavailableError
from stratagem.protocol._gen.stratagem.v1 import endpoint_pb2
from stratagem.protocol._identity import Authenticator, Credentials
from stratagem.protocol._models import IDENTITY_PATTERN

__all__ = [
    "PROOF_SERVICE",
    "UntrustedEndpointError",
    "prove_endpoint",
    "prove_handler",
]

PROOF_SERVICE: Final = "stratagem.v1.EndpointService"
"""The gRPC service that answers ``Prove``."""
_PROVE: Final = f"/{PROOF_SERVICE}/Prove"
_NONCE_BYTES: Final = 32
_MIN_NONCE: Final = 16
_MAX_NONCE: Final = 64
_IDENTITY: Final = re.compile(IDENTITY_PATTERN)


class UntrustedEndpointError(ProtocolError):
    """The process at an endpoint read from a file could not prove that it holds the
    deployment's key: nothing was sent there. ``.endpoint`` and ``.role`` name it."""

    def __init__(self, message: str, *, role: str, endpoint: str) -> None:
        super().__init__(message)
        self.role = role
        self.endpoint = endpoint


def prove_handler(
    authenticator: Authenticator, whoami: Callable[[], tuple[str, str]]
) -> grpc.GenericRpcHandler:
    """The ``EndpointService`` of an agent server.

    Args:
        authenticator: The server's; its ``prove`` makes the proof (``None``: this mode has none).
        whoami: The agent's role and the endpoint it serves on, once it serves.
    """

    async def prove(request: bytes, context: Any) -> bytes:
        try:
            asked = endpoint_pb2.ProveRequest.FromString(request)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a ProveRequest")
        if not _MIN_NONCE <= len(asked.nonce) <= _MAX_NONCE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"nonce: {_MIN_NONCE} to {_MAX_NONCE} bytes, not {len(asked.nonce)}",
            )
        if not _IDENTITY.fullmatch(asked.identity):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "identity: not an identity")
        role, endpoint = whoami()
        proof = authenticator.prove(asked.identity, nonce=asked.nonce, role=role, endpoint=endpoint)
        if proof is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this agent authenticates with {authenticator.mode}: no key to prove",
            )
            return b""  # not reached: abort raises
        answer = endpoint_pb2.ProveResponse(role=role, endpoint=endpoint, proof=proof)
        return answer.SerializeToString()

    return grpc.method_handlers_generic_handler(
        PROOF_SERVICE, {"Prove": grpc.unary_unary_rpc_method_handler(prove)}
    )


async def prove_endpoint(
    endpoint: str,
    role: str,
    credentials: Credentials | None,
    *,
    timeout_s: float,
) -> None:
    """Have the agent at ``endpoint`` prove it is ``role``'s agent of this deployment, before
    ``credentials`` are sent there (nothing to prove without credentials, or over mTLS).

    Raises:
        UnavailableError: Something accepts connections there but does not answer within
            ``timeout_s`` (a stopped agent): one line naming the agent and the endpoint.
        UntrustedEndpointError: Nothing serves there, or what answers cannot prove it (a stale or
            planted endpoint): nothing was sent but a nonce.
    """
    if credentials is None:
        return
    nonce = os.urandom(_NONCE_BYTES)
    expected = credentials.expected_proof(nonce=nonce, role=role, endpoint=endpoint)
    if expected is None:
        return
    request = endpoint_pb2.ProveRequest(identity=credentials.identity, nonce=nonce)
    channel = grpc.aio.insecure_channel(endpoint)
    try:
        raw = await channel.unary_unary(_PROVE)(request.SerializeToString(), timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise UnavailableError(
                f"agent {role} at {endpoint} does not answer: no answer within {timeout_s:.3g} s "
                "(stopped, or its process blocked?)"
            ) from None
        if code == grpc.StatusCode.UNAVAILABLE:
            raise UntrustedEndpointError(
                f"nothing serves at {endpoint}, published as {role}'s agent (a stale endpoint)",
                role=role,
                endpoint=endpoint,
            ) from None
        raise UntrustedEndpointError(
            f"the process at {endpoint} (published as {role}'s agent) cannot prove it holds "
            f"this deployment's key ({code.name}): nothing was sent to it",
            role=role,
            endpoint=endpoint,
        ) from None
    finally:
        await channel.close()
    try:
        answer = endpoint_pb2.ProveResponse.FromString(raw)
    except DecodeError:
        answer = endpoint_pb2.ProveResponse()
    if (answer.role, answer.endpoint) != (role, endpoint) or not hmac.compare_digest(
        answer.proof, expected
    ):
        raise UntrustedEndpointError(
            f"the process at {endpoint} (published as {role}'s agent) did not prove it holds "
            "this deployment's key: nothing was sent to it (a planted or stale endpoint file, or "
            "an agent with another cluster secret)",
            role=role,
            endpoint=endpoint,
        )
