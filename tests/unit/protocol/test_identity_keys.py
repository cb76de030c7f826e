"""Per-identity token keys, the checks on a token's times, and the endpoint proof (no sockets)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
import time
from pathlib import Path

import jwt
import pytest

from stratagem.protocol import (
    ClusterSecret,
    IdentityKey,
    MissingSecretError,
    ProtocolUsageError,
    TokenCredentials,
    TokenSigner,
    UnauthenticatedError,
)
from stratagem.protocol._identity import endpoint_proof

SECRET = ClusterSecret(bytes(range(32)))
YEAR_3000 = 32_503_680_000  # 3000-01-01T00:00:00Z


def _recipe_key(secret: bytes, identity: str) -> bytes:
    """The documented recipe (README, docs/security-tls.md): an identity's token key."""
    return hmac.new(
        secret, b"stratagem.jwt.hs256.v2\0" + identity.encode(), hashlib.sha256
    ).digest()


def _mint(key: bytes, **claims: object) -> str:
    now = int(time.time())
    base = {"sub": "operator", "aud": "stratagem", "iat": now, "exp": now + 60}
    return jwt.encode({**base, **claims}, key, algorithm="HS256", headers={"kid": SECRET.key_id})


def test_each_identity_signs_with_a_key_of_its_own_derived_as_documented() -> None:
    signer = TokenSigner(SECRET)
    operator = _recipe_key(SECRET.reveal(), "operator")
    assert IdentityKey.derive(SECRET, "operator").reveal() == operator
    assert operator != _recipe_key(SECRET.reveal(), "orchestrator")
    assert signer.verify(_mint(operator))[0] == "operator"
    # The operator's key does not vouch for an agent: the token names orchestrator, the
    # signature is the operator key's.
    with pytest.raises(UnauthenticatedError, match="signature does not verify"):
        signer.verify(_mint(operator, sub="orchestrator"))
    orchestrator = _recipe_key(SECRET.reveal(), "orchestrator")
    assert signer.verify(_mint(orchestrator, sub="orchestrator"))[0] == "orchestrator"


def test_the_operator_key_signs_only_as_the_operator() -> None:
    key = IdentityKey.derive(SECRET, "operator")
    signer = TokenSigner(key)
    assert signer.identity == "operator"
    token = signer.issue("operator", 60)
    assert TokenSigner(SECRET).verify(token)[0] == "operator"
    with pytest.raises(ProtocolUsageError, match="signs only as 'operator', not as 'orchestrator'"):
        signer.issue("orchestrator", 60)
    with pytest.raises(ProtocolUsageError, match="signs only as 'operator'"):
        TokenCredentials(signer, "orchestrator")
    # Nor does it verify another identity's tokens (it cannot derive their keys).
    with pytest.raises(UnauthenticatedError):
        signer.verify(TokenSigner(SECRET).issue("orchestrator", 60))
    assert "redacted" in repr(key)
    assert key.reveal().hex() not in repr(key)


def test_a_token_issued_or_valid_from_the_future_is_refused_within_a_stated_skew() -> None:
    signer = TokenSigner(SECRET, max_ttl_s=1e12)
    key = _recipe_key(SECRET.reveal(), "operator")
    now = int(time.time())
    with pytest.raises(UnauthenticatedError, match="issued in the future"):
        signer.verify(_mint(key, iat=YEAR_3000, exp=YEAR_3000 + 60))
    with pytest.raises(UnauthenticatedError, match="issued in the future"):
        signer.verify(_mint(key, iat=now + 360))  # past the skew, even on a slow machine
    assert signer.verify(_mint(key, iat=now + 290))[0] == "operator"  # within the 300 s skew
    with pytest.raises(UnauthenticatedError, match="not valid yet"):
        signer.verify(_mint(key, nbf=now + 3600))
    assert signer.verify(_mint(key, nbf=now - 10))[0] == "operator"
    with pytest.raises(UnauthenticatedError, match="MissingRequiredClaimError"):
        signer.verify(
            jwt.encode(
                {"sub": "operator", "aud": "stratagem", "exp": now + 60},
                key,
                algorithm="HS256",
                headers={"kid": SECRET.key_id},
            )
        )
    with pytest.raises(UnauthenticatedError, match="iat is not whole seconds"):
        signer.verify(_mint(key, iat=now + 0.5))


def test_an_identity_key_file_is_private_and_refused_when_others_may_read_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "operator.key"
    IdentityKey.derive(SECRET, "operator").save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = json.loads(path.read_text())
    assert (raw["identity"], raw["key_id"]) == ("operator", SECRET.key_id)
    assert base64.b64decode(raw["key"]) == _recipe_key(SECRET.reveal(), "operator")
    assert IdentityKey.load(path).reveal() == _recipe_key(SECRET.reveal(), "operator")
    path.chmod(0o644)
    with pytest.raises(ProtocolUsageError, match="readable by others"):
        IdentityKey.load(path)
    with pytest.raises(MissingSecretError, match=r"operator\.key"):
        IdentityKey.load(tmp_path / "missing.key")
    path.chmod(0o600)
    path.write_text("{not json")
    with pytest.raises(ProtocolUsageError, match="damaged"):
        IdentityKey.load(path)


def test_the_endpoint_proof_binds_the_key_the_nonce_the_role_and_the_endpoint() -> None:
    nonce = os.urandom(32)
    agent = TokenSigner(SECRET)  # an agent holds the cluster secret
    client = TokenCredentials(TokenSigner(IdentityKey.derive(SECRET, "operator")), "operator")
    made = agent.prove("operator", nonce=nonce, role="perception", endpoint="127.0.0.1:5000")
    assert made is not None
    assert client.expected_proof(nonce=nonce, role="perception", endpoint="127.0.0.1:5000") == made
    # The documented recipe.
    proof_key = hmac.new(
        _recipe_key(SECRET.reveal(), "operator"), b"stratagem.endpoint.proof.v1", hashlib.sha256
    ).digest()
    assert (
        made
        == hmac.new(proof_key, nonce + b"\x00perception\x00127.0.0.1:5000", hashlib.sha256).digest()
    )
    for changed in (
        {"nonce": os.urandom(32), "role": "perception", "endpoint": "127.0.0.1:5000"},
        {"nonce": nonce, "role": "tactical", "endpoint": "127.0.0.1:5000"},
        {"nonce": nonce, "role": "perception", "endpoint": "127.0.0.1:5001"},
    ):
        assert endpoint_proof(_recipe_key(SECRET.reveal(), "operator"), **changed) != made
    # Another secret's agent cannot make it; a proof is not a token key.
    stranger = TokenSigner(ClusterSecret(os.urandom(32)))
    other = stranger.prove("operator", nonce=nonce, role="perception", endpoint="127.0.0.1:5000")
    assert other != made
    assert made != _recipe_key(SECRET.reveal(), "operator")
    assert agent.prove("Bad Name", nonce=nonce, role="perception", endpoint="x") is None
