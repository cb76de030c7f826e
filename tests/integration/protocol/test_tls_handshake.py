"""Mutual TLS over real handshakes on 127.0.0.1: who is let in and who is not."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from stratagem.protocol import OPERATOR
from stratagem.protocol._tls import (
    CHANNEL_OPTIONS,
    TLS_SERVER_NAME,
    TlsFiles,
    channel_credentials,
    identity_from_auth_context,
    init_certificates,
    server_credentials,
)

METHOD = "/stratagem.test.Whoami/Call"


# --- real handshakes over 127.0.0.1 ---------------------------------------------------------------


@dataclass
class Whoami:
    """A generic server whose one method answers with the caller's verified identity."""

    port: int
    calls: int = 0
    contexts: list[dict[str, list[bytes]]] = field(default_factory=list)


@asynccontextmanager
async def _serving(files: TlsFiles) -> AsyncIterator[Whoami]:
    server = grpc.aio.server()
    whoami = Whoami(port=0)

    async def call(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        whoami.calls += 1
        auth = {key: list(values) for key, values in context.auth_context().items()}
        whoami.contexts.append(auth)
        return (identity_from_auth_context(auth) or "<none>").encode()

    handler = grpc.method_handlers_generic_handler(
        "stratagem.test.Whoami", {"Call": grpc.unary_unary_rpc_method_handler(call)}
    )
    server.add_generic_rpc_handlers((handler,))
    whoami.port = server.add_secure_port("127.0.0.1:0", server_credentials(files))
    await server.start()
    try:
        yield whoami
    finally:
        await server.stop(None)


Call = Callable[[grpc.ChannelCredentials], Awaitable[bytes]]


def _caller(port: int) -> Call:
    async def call(credentials: grpc.ChannelCredentials) -> bytes:
        target = f"127.0.0.1:{port}"
        async with grpc.aio.secure_channel(target, credentials, options=CHANNEL_OPTIONS) as channel:
            answer: bytes = await channel.unary_unary(METHOD)(b"", timeout=10)
            return answer

    return call


async def test_mtls_call_reaches_the_handler_with_the_client_identity(tls_dir: Path) -> None:
    async with _serving(TlsFiles.for_identity(tls_dir, "perception")) as server:
        call = _caller(server.port)
        for identity in ("orchestrator", OPERATOR):
            assert await call(channel_credentials(TlsFiles.for_identity(tls_dir, identity))) == (
                identity.encode()
            )
    assert server.calls == 2
    context = server.contexts[-1]
    assert context["transport_security_type"] == [b"ssl"]
    assert context["x509_common_name"] == [b"operator"]
    assert context["x509_subject_alternative_name"] == [
        TLS_SERVER_NAME.encode(),
        b"spiffe://stratagem/operator",
    ]
    assert context["x509_pem_cert"]


async def test_an_identity_added_later_is_trusted_by_a_running_server(tls_dir: Path) -> None:
    async with _serving(TlsFiles.for_identity(tls_dir, "perception")) as server:
        init_certificates(tls_dir, ["replayer"])
        credentials = channel_credentials(TlsFiles.for_identity(tls_dir, "replayer"))
        assert await _caller(server.port)(credentials) == b"replayer"


async def test_a_client_certificate_from_another_ca_fails_the_handshake(
    tls_dir: Path, foreign_dir: Path
) -> None:
    async with _serving(TlsFiles.for_identity(tls_dir, "perception")) as server:
        # The foreign client trusts the server's CA, so only the server's check can refuse it.
        foreign = TlsFiles.for_identity(foreign_dir, OPERATOR)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(tls_dir / "ca.pem").read_bytes(),
            private_key=foreign.key.read_bytes(),
            certificate_chain=foreign.cert.read_bytes(),
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _caller(server.port)(credentials)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.calls == 0


async def test_a_client_without_a_certificate_fails_the_handshake(tls_dir: Path) -> None:
    async with _serving(TlsFiles.for_identity(tls_dir, "perception")) as server:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(tls_dir / "ca.pem").read_bytes()
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _caller(server.port)(credentials)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.calls == 0


async def test_a_client_refuses_a_server_from_another_ca(tls_dir: Path, foreign_dir: Path) -> None:
    async with _serving(TlsFiles.for_identity(foreign_dir, "perception")) as server:
        credentials = channel_credentials(TlsFiles.for_identity(tls_dir, OPERATOR))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _caller(server.port)(credentials)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.calls == 0


async def test_a_plaintext_client_fails(tls_dir: Path) -> None:
    async with (
        _serving(TlsFiles.for_identity(tls_dir, "perception")) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(METHOD)(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.calls == 0
