"""The security suite: every refusal with its exact status code and an audit record.

Real gRPC over loopback sockets, token authentication with a real cluster secret file, mutual TLS
with real certificates; the served agent is a real strategic agent for the plan test and the fake
backend elsewhere.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import jwt
import pytest

from stratagem.agents import build_agent
from stratagem.protocol import (
    AUTHORIZATION_KEY,
    AgentClient,
    AgentServer,
    CallContext,
    ClientConfig,
    ClusterSecret,
    FailedPreconditionError,
    IdentityKey,
    InMemoryAuditLog,
    InvalidArgumentError,
    MissingSecretError,
    PermissionDeniedError,
    Policy,
    ProtocolUsageError,
    ResourceExhaustedError,
    ServerConfig,
    TlsAuthenticator,
    TlsCredentials,
    TlsFiles,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
    UnauthenticatedError,
    UnavailableError,
    WireModel,
    current_call,
    init_certificates,
)
from stratagem.protocol._audit import AuditRecord
from stratagem.protocol._codec import encode_request
from stratagem.protocol._identity import Authenticator
from stratagem.protocol._models import RequestEnvelope
from stratagem.protocol._rpc import CALLER_KEY, CAPABILITY_KEY, TARGET_KEY, VERSION_KEY, method_path
from stratagem.protocol._status import from_rpc_error
from tests.integration.protocol.conftest import Tracing
from tests.unit.protocol._support import SAMPLES, FakeBackend

pytestmark = pytest.mark.integration

EXTRACT = SAMPLES["ExtractEntities"][0]


@pytest.fixture
def secret(tmp_path: Path) -> ClusterSecret:
    return ClusterSecret.load_or_create(tmp_path / "cluster.secret")


@pytest.fixture
def signer(secret: ClusterSecret) -> TokenSigner:
    return TokenSigner(secret)


Serve = Callable[..., object]


@pytest.fixture
def serve_secure(
    audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> Callable[..., AsyncIterator[AgentServer]]:
    @asynccontextmanager
    async def serving(
        backend: object,
        *,
        authenticator: Authenticator | None = None,
        **config: object,
    ) -> AsyncIterator[AgentServer]:
        settings: dict[str, object] = {"default_deadline_s": 5.0, "grace_s": 1.0, **config}
        server = AgentServer(
            backend,  # type: ignore[arg-type]
            policy=Policy.default(),
            authenticator=authenticator or TokenAuthenticator(signer),
            audit=audit,
            config=ServerConfig(**settings),  # type: ignore[arg-type]
            tracer_provider=tracing.provider,
        )
        await server.start()
        try:
            yield server
        finally:
            await server.aclose()

    return serving  # type: ignore[return-value]


async def _refusal(audit: InMemoryAuditLog, action: str) -> AuditRecord:
    """The newest record of ``action`` (the refusal is audited just after it is answered)."""
    for _ in range(200):
        found = [r for r in audit.records() if r.action == action]
        if found:
            return found[-1]
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {action} record in {[r.action for r in audit.records()]}")


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def _client(endpoint: str, tracing: Tracing, **kwargs: object) -> AgentClient:
    return AgentClient(
        endpoint,
        config=ClientConfig(default_timeout_s=5.0),
        tracer_provider=tracing.provider,
        **kwargs,  # type: ignore[arg-type]
    )


# --- the cluster secret and tokens --------------------------------------------------------------


def test_the_cluster_secret_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "state" / "cluster.secret"
    first = ClusterSecret.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ClusterSecret.load_or_create(path).reveal() == first.reveal()
    assert "redacted" in repr(first)
    assert first.reveal().hex() not in repr(first)
    path.chmod(0o644)
    with pytest.raises(ProtocolUsageError, match="readable by others"):
        ClusterSecret.load_or_create(path)


def test_loading_a_missing_secret_says_where_it_comes_from_and_makes_none(
    tmp_path: Path,
) -> None:
    path = tmp_path / "operator" / "cluster.secret"
    with pytest.raises(MissingSecretError, match=r"no cluster secret at .*stratagem up.*copy"):
        ClusterSecret.load(path)
    assert not path.exists()
    assert not path.parent.exists()
    made = ClusterSecret.load_or_create(path)
    assert ClusterSecret.load(path).reveal() == made.reveal()


def test_a_saved_secret_replaces_the_old_one_and_its_key_id_names_it(tmp_path: Path) -> None:
    path = tmp_path / "cluster.secret"
    old = ClusterSecret.load_or_create(path)
    new = ClusterSecret.generate()
    new.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ClusterSecret.load(path).reveal() == new.reveal()
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.secret"]
    # The key id names a secret (same bytes, same id) without revealing it.
    assert len(new.key_id) == 16
    assert new.key_id == ClusterSecret(new.reveal()).key_id != old.key_id
    assert new.key_id not in new.reveal().hex()
    # A token of the old secret no longer verifies with the new one.
    token = TokenSigner(old).issue("operator", 60)
    with pytest.raises(UnauthenticatedError, match="signature"):
        TokenSigner(new).verify(token)


def test_tokens_verify_expire_and_resist_forgery(secret: ClusterSecret) -> None:
    now = [1_000_000.0]
    signer = TokenSigner(secret, clock=lambda: now[0])
    token = signer.issue("perception", ttl_s=60)
    assert signer.verify(token) == ("perception", 1_000_060)
    forged = _with_claims(token, sub="strategic")
    with pytest.raises(UnauthenticatedError, match="signature"):
        signer.verify(forged)
    # A standard JWT: any library reads it; the key id names the secret, not the secret.
    claims = jwt.decode(token, options={"verify_signature": False})
    assert (claims["sub"], claims["aud"], claims["exp"]) == ("perception", "stratagem", 1_000_060)
    assert jwt.get_unverified_header(token) == {"alg": "HS256", "typ": "JWT", "kid": secret.key_id}
    # A signature with stray padding bits decodes to the same bytes, but is not the one issued.
    body, signature = token.rsplit(".", 1)
    last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".index(signature[-1])
    stray = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last ^ 1]
    with pytest.raises(UnauthenticatedError, match=r"malformed token|signature"):
        signer.verify(f"{body}.{signature[:-1]}{stray}")
    other = TokenSigner(ClusterSecret(os.urandom(32)), clock=lambda: now[0])
    with pytest.raises(UnauthenticatedError, match="signature"):
        other.verify(token)
    now[0] += 61
    with pytest.raises(UnauthenticatedError, match="expired"):
        signer.verify(token)
    with pytest.raises(UnauthenticatedError, match="malformed"):
        signer.verify("Bearer nonsense")


def test_a_token_minted_by_another_library_is_checked_for_audience_and_key_id(
    secret: ClusterSecret,
) -> None:
    # The documented recipe, as another language's JWT library follows it: HS256 with the
    # identity's key HMAC-SHA256(secret, "stratagem.jwt.hs256.v2" 0x00 identity), claims
    # sub/aud/iat/exp, header kid.
    key = hmac.new(secret.reveal(), b"stratagem.jwt.hs256.v2\x00operator", hashlib.sha256).digest()
    now = int(time.time())
    claims = {"sub": "operator", "aud": "stratagem", "iat": now, "exp": now + 60}
    signer = TokenSigner(secret)

    def mint(kid: str = secret.key_id, **changed: object) -> str:
        return jwt.encode({**claims, **changed}, key, algorithm="HS256", headers={"kid": kid})

    assert signer.verify(mint()) == ("operator", now + 60)
    with pytest.raises(UnauthenticatedError, match="InvalidAudienceError"):
        signer.verify(mint(aud="another-service"))
    with pytest.raises(UnauthenticatedError, match="signed with key 'rotated-away'"):
        signer.verify(mint(kid="rotated-away"))
    with pytest.raises(UnauthenticatedError, match="MissingRequiredClaimError"):
        signer.verify(
            jwt.encode({"sub": "operator", "exp": now + 60}, key, headers={"kid": secret.key_id})
        )


def _with_claims(token: str, **claims: object) -> str:
    """``token`` with its claims changed and its signature kept (a forgery)."""
    header, payload, signature = token.split(".")
    decoded = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    changed = base64.urlsafe_b64encode(json.dumps({**decoded, **claims}).encode()).rstrip(b"=")
    return f"{header}.{changed.decode()}.{signature}"


def test_token_credentials_renew_before_expiry(signer: TokenSigner, secret: ClusterSecret) -> None:
    now = [1_000_000.0]
    clocked = TokenSigner(secret, clock=lambda: now[0])
    credentials = TokenCredentials(clocked, "operator", ttl_s=100, clock=lambda: now[0])
    first = dict(credentials.metadata())[AUTHORIZATION_KEY]
    now[0] += 40
    assert dict(credentials.metadata())[AUTHORIZATION_KEY] == first
    now[0] += 20  # past half the lifetime: a fresh token
    assert dict(credentials.metadata())[AUTHORIZATION_KEY] != first
    assert "redacted" in repr(credentials)


# --- refusals over the wire ---------------------------------------------------------------------


async def test_no_credentials_is_unauthenticated_and_audited(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing
) -> None:
    backend = FakeBackend("perception")
    async with serve_secure(backend) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, caller="operator")
        with pytest.raises(UnauthenticatedError, match="no credentials"):
            await client.call("perception", "ExtractEntities", EXTRACT, request_id="nocred-1")
        await client.aclose()
    record = await _refusal(audit, "call.refused")
    assert (record.code, record.actor, record.request_id) == ("UNAUTHENTICATED", "", "nocred-1")
    assert backend.calls == []


async def test_a_token_from_another_secret_is_unauthenticated(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing
) -> None:
    stranger = TokenCredentials(TokenSigner(ClusterSecret(os.urandom(32))), "operator")
    backend = FakeBackend("perception")
    async with serve_secure(backend) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=stranger)
        with pytest.raises(UnauthenticatedError, match="does not verify"):
            await client.call("perception", "ExtractEntities", EXTRACT)
        await client.aclose()
    record = await _refusal(audit, "call.refused")
    assert record.code == "UNAUTHENTICATED"
    assert backend.calls == []


async def test_an_expired_token_is_unauthenticated(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, secret: ClusterSecret
) -> None:
    past = TokenSigner(secret, clock=lambda: time.time() - 7200)
    stale = TokenCredentials(past, "operator", ttl_s=60, clock=lambda: time.time() - 7200)
    async with serve_secure(FakeBackend("perception")) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=stale)
        with pytest.raises(UnauthenticatedError, match="expired token for 'operator'"):
            await client.call("perception", "ExtractEntities", EXTRACT)
        await client.aclose()
    assert (await _refusal(audit, "call.refused")).code == "UNAUTHENTICATED"


async def test_a_token_expiring_further_ahead_than_the_maximum_lifetime_is_unauthenticated(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, secret: ClusterSecret
) -> None:
    # A correctly signed token whose expiry lies in the year 5138: its MAC holds, but no signer
    # of this deployment issues tokens that long-lived, so it is refused and audited.
    lax = TokenSigner(secret, max_ttl_s=1e11)
    forever = TokenCredentials(lax, "operator", ttl_s=100_000_000_000)
    async with serve_secure(FakeBackend("perception")) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=forever)
        with pytest.raises(UnauthenticatedError, match="expiry is further ahead"):
            await client.call("perception", "ExtractEntities", EXTRACT)
        await client.aclose()
    assert (await _refusal(audit, "call.refused")).code == "UNAUTHENTICATED"


def test_the_maximum_token_lifetime_allows_clock_skew(secret: ClusterSecret) -> None:
    now = [1_000_000.0]
    signer = TokenSigner(secret, clock=lambda: now[0], max_ttl_s=3600, clock_skew_s=60)
    ahead = TokenSigner(secret, clock=lambda: now[0] + 30, max_ttl_s=4000)
    assert signer.verify(ahead.issue("operator", 3600))[0] == "operator"
    with pytest.raises(UnauthenticatedError, match="expiry is further ahead"):
        signer.verify(ahead.issue("operator", 3700))
    with pytest.raises(ProtocolUsageError, match="at most"):
        signer.issue("operator", 3601)


async def test_a_valid_token_claiming_another_caller_is_denied_under_the_verified_identity(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    perception = TokenCredentials(signer, "perception")
    backend = FakeBackend("strategic")
    async with serve_secure(backend) as server:  # type: ignore[attr-defined]
        # perception's token, but the call (metadata and envelope) says it is the orchestrator.
        client = _client(server.endpoint, tracing, caller="orchestrator", credentials=perception)
        request = SAMPLES["AnalyzeNarrative"][0]
        with pytest.raises(PermissionDeniedError, match="claims to come from 'orchestrator'"):
            await client.call("strategic", "AnalyzeNarrative", request, request_id="spoof-1")
        await client.aclose()
    record = await _refusal(audit, "call.denied")
    assert (record.actor, record.code, record.request_id) == (
        "perception",
        "PERMISSION_DENIED",
        "spoof-1",
    )
    assert backend.calls == []


async def test_an_envelope_naming_another_caller_than_the_token_is_invalid(
    serve_secure: Serve, audit: InMemoryAuditLog, signer: TokenSigner
) -> None:
    """Metadata and token agree; only the envelope lies: refused before the handler runs."""
    token = signer.issue("operator", 60)
    envelope = RequestEnvelope(
        request_id="lie-1",
        caller="orchestrator",
        target="perception",
        capability="ExtractEntities",
        body=EXTRACT,
    )
    backend = FakeBackend("perception")
    async with (
        serve_secure(backend) as server,  # type: ignore[attr-defined]
        grpc.aio.insecure_channel(server.endpoint) as channel,
    ):
        call = channel.unary_unary(method_path("Call"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(
                encode_request(envelope),
                metadata=(
                    (AUTHORIZATION_KEY, f"Bearer {token}"),
                    (TARGET_KEY, "perception"),
                    (CAPABILITY_KEY, "ExtractEntities"),
                ),
                timeout=5,
            )
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    violations = from_rpc_error(caught.value).violations
    assert [v.field for v in violations] == ["caller"]
    record = await _refusal(audit, "call.refused")
    assert (record.actor, record.code) == ("operator", "INVALID_ARGUMENT")
    assert backend.calls == []


async def test_a_capability_the_policy_does_not_grant_is_denied(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("tactical")
    async with serve_secure(backend) as server:  # type: ignore[attr-defined]
        client = _client(
            server.endpoint, tracing, credentials=TokenCredentials(signer, "perception")
        )
        request = SAMPLES["PlanExecutionSequence"][0]
        with pytest.raises(PermissionDeniedError, match="'perception' may not call"):
            await client.call("tactical", "PlanExecutionSequence", request, request_id="deny-1")
        await client.aclose()
    record = await _refusal(audit, "call.denied")
    assert (record.actor, record.capability, record.code) == (
        "perception",
        "PlanExecutionSequence",
        "PERMISSION_DENIED",
    )
    assert backend.calls == []


async def test_a_plan_naming_another_agents_tool_is_refused_before_it_runs(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    agent = build_agent("strategic", entry_points=False)
    plan = {
        "id": "grab",
        "owner": "strategic",
        "goal": "use perception's tool",
        "steps": [{"id": "s1", "kind": "tool", "tool": "extract_entities", "input": {}}],
    }
    async with serve_secure(agent) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=TokenCredentials(signer, "operator"))
        # A user's plan that does not validate is the caller's bad input.
        with pytest.raises(InvalidArgumentError, match="tool 'extract_entities', which is not"):
            await client.run_plan(json.dumps(plan))
        await client.aclose()
    record = await _refusal(audit, "call.outcome")
    assert (record.actor, record.capability, record.code) == (
        "operator",
        "RunPlan",
        "INVALID_ARGUMENT",
    )
    # Recorded as refused (failed) at revision 1, with nothing run: the tool is not the agent's.
    assert [(p.plan_id, p.status) for p in agent.plans("")] == [("grab", "failed")]
    await agent.aclose()


async def test_a_delegation_cycle_is_denied(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    async with serve_secure(backend) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=TokenCredentials(signer, "operator"))
        # The operator calls perception while serving a request perception made: a cycle.
        token = current_call.set(
            CallContext(caller="perception", target="operator", capability="x", request_id="r")
        )
        try:
            with pytest.raises(
                PermissionDeniedError, match="delegation cycle: perception > operator > perception"
            ):
                await client.call("perception", "ExtractEntities", EXTRACT, request_id="cycle-1")
        finally:
            current_call.reset(token)
        await client.aclose()
    record = await _refusal(audit, "call.denied")
    assert (record.actor, record.request_id, record.code) == (
        "operator",
        "cycle-1",
        "PERMISSION_DENIED",
    )
    assert backend.calls == []


async def test_a_delegation_chain_past_the_limit_is_denied_and_an_allowed_one_is_audited(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    async with serve_secure(backend, max_delegation_hops=3) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=TokenCredentials(signer, "operator"))
        ok = CallContext(
            caller="orchestrator",
            target="x",
            capability="x",
            request_id="r",
            delegation=("strategic",),
        )
        token = current_call.set(ok)
        try:
            await client.call("perception", "ExtractEntities", EXTRACT, request_id="chain-ok")
        finally:
            current_call.reset(token)
        [(_, _, ctx)] = backend.calls
        assert ctx.delegation == ("strategic", "orchestrator")
        accepted = await _refusal(audit, "call.accepted")
        assert "on behalf of strategic > orchestrator" in accepted.detail
        long = CallContext(
            caller="orchestrator",
            target="x",
            capability="x",
            request_id="r",
            delegation=("alice", "bob"),
        )
        token = current_call.set(long)
        try:
            with pytest.raises(PermissionDeniedError, match="4 hops long; the limit is 3"):
                await client.call("perception", "ExtractEntities", EXTRACT, request_id="chain-long")
        finally:
            current_call.reset(token)
        await client.aclose()
    assert (await _refusal(audit, "call.denied")).request_id == "chain-long"
    assert len(backend.calls) == 1


async def test_a_delegation_chain_naming_an_identity_the_deployment_does_not_know_is_denied(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    async with serve_secure(backend) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=TokenCredentials(signer, "operator"))
        invented = CallContext(
            caller="orchestrator",
            target="x",
            capability="x",
            request_id="r",
            delegation=("mallory",),
        )
        token = current_call.set(invented)
        try:
            with pytest.raises(
                PermissionDeniedError,
                match="the delegation chain names 'mallory', an identity this deployment does not",
            ):
                await client.call("perception", "ExtractEntities", EXTRACT, request_id="invented")
        finally:
            current_call.reset(token)
        await client.aclose()
    record = await _refusal(audit, "call.denied")
    assert (record.actor, record.request_id) == ("operator", "invented")
    assert backend.calls == []


async def test_a_token_issued_in_the_year_3000_is_unauthenticated(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, secret: ClusterSecret
) -> None:
    year_3000 = 32_503_680_000
    future = TokenSigner(secret, clock=lambda: float(year_3000), max_ttl_s=1e12)
    later = TokenCredentials(future, "operator", ttl_s=3600, clock=lambda: float(year_3000))
    backend = FakeBackend("perception")
    async with serve_secure(backend) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=later)
        with pytest.raises(UnauthenticatedError, match="issued in the future"):
            await client.call("perception", "ExtractEntities", EXTRACT)
        await client.aclose()
    assert (await _refusal(audit, "call.refused")).code == "UNAUTHENTICATED"
    assert backend.calls == []


async def test_the_operators_key_cannot_speak_as_an_agent(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, secret: ClusterSecret
) -> None:
    # Whoever holds operator.key (the operator's commands, or a thief of it) signs a token that
    # names the orchestrator: it does not verify, since the orchestrator's key is another.
    operator_key = IdentityKey.derive(secret, "operator")
    now = int(time.time())
    claims = {"sub": "orchestrator", "aud": "stratagem", "iat": now, "exp": now + 60}
    forged = jwt.encode(
        claims, operator_key.reveal(), algorithm="HS256", headers={"kid": operator_key.key_id}
    )
    backend = FakeBackend("strategic")
    async with (
        serve_secure(backend) as server,  # type: ignore[attr-defined]
        grpc.aio.insecure_channel(server.endpoint) as channel,
    ):
        envelope = RequestEnvelope(
            request_id="as-orchestrator",
            caller="orchestrator",
            target="strategic",
            capability="AnalyzeNarrative",
            body=SAMPLES["AnalyzeNarrative"][0],
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary(method_path("Call"))(
                encode_request(envelope),
                metadata=((AUTHORIZATION_KEY, f"Bearer {forged}"),),
                timeout=5,
            )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "signature does not verify" in str(refused.value.details())
    assert (await _refusal(audit, "call.refused")).code == "UNAUTHENTICATED"
    assert backend.calls == []
    # The key itself refuses to sign as anyone but the operator.
    with pytest.raises(ProtocolUsageError, match="signs only as 'operator'"):
        TokenSigner(operator_key).issue("orchestrator", 60)


async def test_an_agent_proves_its_key_to_a_client_before_credentials_are_sent(
    serve_secure: Serve, audit: InMemoryAuditLog, secret: ClusterSecret
) -> None:
    from stratagem.protocol import UntrustedEndpointError, prove_endpoint

    operator = TokenCredentials(TokenSigner(IdentityKey.derive(secret, "operator")), "operator")
    stranger = TokenCredentials(TokenSigner(ClusterSecret(os.urandom(32))), "operator")
    async with serve_secure(FakeBackend("perception")) as server:  # type: ignore[attr-defined]
        await prove_endpoint(server.endpoint, "perception", operator, timeout_s=5)
        with pytest.raises(UntrustedEndpointError, match="did not prove"):
            await prove_endpoint(server.endpoint, "tactical", operator, timeout_s=5)
        with pytest.raises(UntrustedEndpointError, match="did not prove"):
            await prove_endpoint(server.endpoint, "perception", stranger, timeout_s=5)
        await prove_endpoint(server.endpoint, "perception", None, timeout_s=5)  # no credentials
    # Proving grants nothing and is not audited (like the health service).
    assert list(audit.records()) == []


async def test_a_reused_request_id_with_another_payload_is_failed_precondition(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    async with serve_secure(backend) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=TokenCredentials(signer, "operator"))
        await client.call("perception", "ExtractEntities", EXTRACT, request_id="reuse-1")
        other = type(EXTRACT)(text="Something else entirely.")
        with pytest.raises(FailedPreconditionError, match="already used for a different request"):
            await client.call("perception", "ExtractEntities", other, request_id="reuse-1")
        await client.aclose()
    record = await _refusal(audit, "call.refused")
    assert (record.request_id, record.code) == ("reuse-1", "FAILED_PRECONDITION")
    assert len(backend.calls) == 1


async def test_an_oversized_message_is_resource_exhausted(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    async with serve_secure(backend, max_message_bytes=1024) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=TokenCredentials(signer, "operator"))
        with pytest.raises(ResourceExhaustedError, match="the request is"):
            await client.call("perception", "ExtractEntities", type(EXTRACT)(text="x" * 4000))
        await client.aclose()
    record = await _refusal(audit, "call.refused")
    assert (record.actor, record.code) == ("operator", "RESOURCE_EXHAUSTED")
    assert backend.calls == []


async def test_another_schema_version_is_a_clear_failed_precondition(
    serve_secure: Serve, audit: InMemoryAuditLog, signer: TokenSigner
) -> None:
    envelope = RequestEnvelope(
        request_id="v-1",
        caller="operator",
        target="perception",
        capability="ExtractEntities",
        body=EXTRACT,
    )
    backend = FakeBackend("perception")
    async with (
        serve_secure(backend) as server,  # type: ignore[attr-defined]
        grpc.aio.insecure_channel(server.endpoint) as channel,
    ):
        call = channel.unary_unary(method_path("Call"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(
                encode_request(envelope),
                metadata=(
                    (AUTHORIZATION_KEY, f"Bearer {signer.issue('operator', 60)}"),
                    (CALLER_KEY, "operator"),
                    (TARGET_KEY, "perception"),
                    (CAPABILITY_KEY, "ExtractEntities"),
                    (VERSION_KEY, "99"),
                ),
                timeout=5,
            )
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "schema version '99'" in str(caught.value.details())
    assert (await _refusal(audit, "call.refused")).code == "FAILED_PRECONDITION"
    assert backend.calls == []


async def test_admission_refuses_at_once_beyond_the_queue(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    release = asyncio.Event()

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        await release.wait()
        return SAMPLES["ExtractEntities"][1]

    backend.behaviour["ExtractEntities"] = slow
    limits = {"max_concurrent_requests": 2, "max_queued_requests": 1}
    async with serve_secure(backend, **limits) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=TokenCredentials(signer, "operator"))
        admitted = [
            asyncio.create_task(client.call("perception", "ExtractEntities", EXTRACT))
            for _ in range(3)
        ]
        await _until(lambda: server.load == (2, 1))
        started = time.monotonic()
        with pytest.raises(ResourceExhaustedError, match="at its limit"):
            await client.call("perception", "ExtractEntities", EXTRACT, request_id="over-1")
        refused_after = time.monotonic() - started
        release.set()
        answers = await asyncio.gather(*admitted)
        assert len(answers) == 3
        assert server.load == (0, 0)
        await client.aclose()
    # Refused at once, not after waiting out the slow calls (they never finish until released).
    assert refused_after < 2.0
    record = [r for r in audit.records() if r.request_id == "over-1"][-1]
    assert (record.action, record.code) == ("call.refused", "RESOURCE_EXHAUSTED")


async def test_a_queued_call_whose_caller_gives_up_leaves_the_queue(
    serve_secure: Serve, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    release = asyncio.Event()

    async def slow(request: WireModel, ctx: CallContext) -> WireModel:
        await release.wait()
        return SAMPLES["ExtractEntities"][1]

    backend.behaviour["ExtractEntities"] = slow
    limits = {"max_concurrent_requests": 1, "max_queued_requests": 1}
    async with serve_secure(backend, **limits) as server:  # type: ignore[attr-defined]
        client = _client(server.endpoint, tracing, credentials=TokenCredentials(signer, "operator"))
        running = asyncio.create_task(client.call("perception", "ExtractEntities", EXTRACT))
        await _until(lambda: server.load == (1, 0))
        with pytest.raises(Exception, match="DEADLINE_EXCEEDED"):
            await client.call("perception", "ExtractEntities", EXTRACT, timeout=0.3)
        await _until(lambda: server.load == (1, 0))
        release.set()
        await running
        assert server.load == (0, 0)
        await client.aclose()


# --- mutual TLS ---------------------------------------------------------------------------------


async def test_mtls_verifies_the_certificate_identity_and_refuses_another_ca(
    tmp_path: Path, serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing
) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    init_certificates(ours, ["perception", "operator", "strategic"])
    init_certificates(theirs, ["operator"])
    backend = FakeBackend("perception")
    authenticator = TlsAuthenticator(TlsFiles.for_identity(ours, "perception"))
    async with serve_secure(backend, authenticator=authenticator) as server:  # type: ignore[attr-defined]
        good = _client(
            server.endpoint,
            tracing,
            credentials=TlsCredentials(TlsFiles.for_identity(ours, "operator")),
        )
        assert await good.call("perception", "ExtractEntities", EXTRACT, request_id="tls-1")
        [(_, _, ctx)] = backend.calls
        assert ctx.caller == "operator"
        # strategic's certificate, claiming to be the operator: denied under strategic.
        spoof = _client(
            server.endpoint,
            tracing,
            caller="operator",
            credentials=TlsCredentials(TlsFiles.for_identity(ours, "strategic")),
        )
        with pytest.raises(PermissionDeniedError, match="claims to come from 'operator'"):
            await spoof.call("perception", "ExtractEntities", EXTRACT)
        # A certificate from another CA never completes the handshake: no call, no record.
        foreign_files = TlsFiles(
            ca=ours / "ca.pem", cert=theirs / "operator.pem", key=theirs / "operator.key"
        )
        before = len(list(audit.records()))
        foreign = _client(server.endpoint, tracing, credentials=_UncheckedTls(foreign_files))
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            await foreign.call("perception", "ExtractEntities", EXTRACT)
        assert time.monotonic() - started < 4.0
        assert len(list(audit.records())) == before
        # The server keeps serving good clients.
        assert await good.call("perception", "ExtractEntities", EXTRACT)
        for client in (good, spoof, foreign):
            await client.aclose()
    assert len(backend.calls) == 2


class _UncheckedTls:
    """TLS client credentials built from raw files, skipping the library's own CA check (which
    would refuse the foreign certificate before any connection is made)."""

    def __init__(self, files: TlsFiles) -> None:
        self._credentials = grpc.ssl_channel_credentials(
            root_certificates=files.ca.read_bytes(),
            private_key=files.key.read_bytes(),
            certificate_chain=files.cert.read_bytes(),
        )

    identity = "operator"

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return self._credentials

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        return (("grpc.ssl_target_name_override", "stratagem"),)


# --- redaction ----------------------------------------------------------------------------------


async def test_tokens_never_reach_logs_spans_errors_or_audit_records(
    serve_secure: Serve,
    audit: InMemoryAuditLog,
    tracing: Tracing,
    signer: TokenSigner,
    secret: ClusterSecret,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    good = TokenCredentials(signer, "operator")
    stranger_signer = TokenSigner(ClusterSecret(os.urandom(32)))
    stranger = TokenCredentials(stranger_signer, "operator")
    secrets = [
        dict(good.metadata())[AUTHORIZATION_KEY].split()[1],
        dict(stranger.metadata())[AUTHORIZATION_KEY].split()[1],
        secret.reveal().hex(),
    ]
    messages: list[str] = []
    async with serve_secure(FakeBackend("perception")) as server:  # type: ignore[attr-defined]
        ok = _client(server.endpoint, tracing, credentials=good)
        await ok.call("perception", "ExtractEntities", EXTRACT)
        bad = _client(server.endpoint, tracing, credentials=stranger)
        with pytest.raises(UnauthenticatedError) as caught:
            await bad.call("perception", "ExtractEntities", EXTRACT)
        messages.append(str(caught.value))
        messages.append(repr(good))
        await ok.aclose()
        await bad.aclose()
    await _refusal(audit, "call.refused")
    recorded = [
        json.dumps(r.__dict__ if hasattr(r, "__dict__") else str(r), default=str)
        for r in audit.records()
    ]
    recorded += [str(r) for r in audit.records()]
    spans = [
        json.dumps({**dict(s.attributes or {}), "status": s.status.description or ""})
        for s in tracing.exporter.get_finished_spans()
    ]
    assert spans, "the calls made spans"
    logs = [record.getMessage() for record in caplog.records]
    for text in [*messages, *recorded, *spans, *logs]:
        for value in secrets:
            assert value not in text


def test_sensitive_fields_stay_out_of_reprs_errors_and_redacted_text(signer: TokenSigner) -> None:
    from pydantic import ValidationError

    from stratagem.protocol import WireModel as Model
    from stratagem.protocol import sensitive, violations_from
    from stratagem.protocol._audit import redact

    class Login(Model):
        user: str
        api_key: str = sensitive("the user's key", min_length=12)

    secret_value = "hunter2-is-not-long"
    login = Login(user="mira", api_key=secret_value)
    assert secret_value not in repr(login)
    assert secret_value not in str(login)
    assert Login.model_json_schema()["properties"]["api_key"]["x-sensitive"] is True
    with pytest.raises(ValidationError) as caught:
        Login(user="mira", api_key="short-key")
    described = " ".join(f"{v.field}: {v.description}" for v in violations_from(caught.value))
    assert "api_key" in described
    assert "short-key" not in described
    token = signer.issue("operator", 60)
    for text in (token, f"refused {token} here", f"authorization: Bearer {token}"):
        assert token not in redact(text)


async def test_a_flood_of_unauthenticated_calls_leaves_a_bounded_audit_and_every_refusal_counted(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing
) -> None:
    flood = 300
    backend = FakeBackend("perception")
    async with serve_secure(  # type: ignore[attr-defined]
        backend, refusal_audit_burst=5, refusal_audit_window_s=60.0
    ) as server:
        client = _client(server.endpoint, tracing, caller="intruder")
        for _ in range(flood):
            with pytest.raises(UnauthenticatedError):
                await client.call("perception", "ExtractEntities", EXTRACT)
        await client.aclose()
        refused = [r for r in audit.records() if r.action == "call.refused"]
        assert len(refused) == 5
        assert all("(peer ipv4:127.0.0.1)" in r.detail for r in refused)
    # Closing the server summarises the window still open.
    (aggregate,) = [r for r in audit.records() if r.action == "call.refused.aggregate"]
    assert aggregate.code == "UNAUTHENTICATED"
    assert f"{flood - 5} more refusals before authentication from ipv4:127.0.0.1" in (
        aggregate.detail
    )
    assert backend.calls == []


async def test_refusals_of_authenticated_callers_are_never_aggregated(
    serve_secure: Serve, audit: InMemoryAuditLog, tracing: Tracing, signer: TokenSigner
) -> None:
    backend = FakeBackend("perception")
    async with serve_secure(backend, refusal_audit_burst=1) as server:  # type: ignore[attr-defined]
        client = _client(
            server.endpoint, tracing, credentials=TokenCredentials(signer, "perception")
        )
        for _ in range(4):  # perception may not call its own ExtractEntities by policy
            with pytest.raises(PermissionDeniedError):
                await client.call("perception", "ExtractEntities", EXTRACT)
        await client.aclose()
    assert [r.action for r in audit.records()].count("call.denied") == 4
    assert not [r for r in audit.records() if r.action == "call.refused.aggregate"]
