"""``TokenAuthenticator`` verifies a caller's token once and remembers it (issue 37: per-connection
work done once): what it remembers never outlives the token, stays bounded, and never crosses a
secret rotation. No sockets: ``authenticate`` takes the call's metadata."""

from __future__ import annotations

import os

import pytest

from stratagem.protocol import (
    ClusterSecret,
    TokenAuthenticator,
    TokenSigner,
    UnauthenticatedError,
)
from stratagem.protocol._identity import _CACHE_LIMIT

START = 1_000_000.0


class _Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class _CountingSigner(TokenSigner):
    """A signer that counts the tokens it verifies (each is a full JWT check)."""

    verified = 0

    def verify(self, token: str) -> tuple[str, int]:
        self.verified += 1
        return super().verify(token)


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_a_remembered_token_is_verified_once_and_refused_once_it_expires() -> None:
    clock = _Clock()
    signer = _CountingSigner(ClusterSecret(os.urandom(32)), clock=clock)
    authenticator = TokenAuthenticator(signer, clock=clock)
    token = signer.issue("orchestrator", ttl_s=60)
    for _ in range(5):
        assert authenticator.authenticate(_bearer(token), None) == "orchestrator"
    assert signer.verified == 1  # the four calls after the first cost a lookup, not a JWT check
    clock.now = START + 59
    assert authenticator.authenticate(_bearer(token), None) == "orchestrator"
    clock.now = START + 60  # its exp: expired, remembered or not
    with pytest.raises(UnauthenticatedError, match="expired token for 'orchestrator'"):
        authenticator.authenticate(_bearer(token), None)
    with pytest.raises(UnauthenticatedError, match="expired"):
        authenticator.authenticate(_bearer(token), None)
    # A fresh token of the same caller is checked in full, then remembered in its turn.
    renewed = signer.issue("orchestrator", ttl_s=60)
    assert authenticator.authenticate(_bearer(renewed), None) == "orchestrator"
    assert authenticator.authenticate(_bearer(renewed), None) == "orchestrator"
    assert signer.verified == 4


def test_a_forged_token_is_never_remembered() -> None:
    clock = _Clock()
    signer = _CountingSigner(ClusterSecret(os.urandom(32)), clock=clock)
    authenticator = TokenAuthenticator(signer, clock=clock)
    token = signer.issue("perception", ttl_s=60)
    body, signature = token.rsplit(".", 1)
    forged = f"{body}.{signature[::-1]}"
    for _ in range(3):
        with pytest.raises(UnauthenticatedError, match=r"signature|malformed"):
            authenticator.authenticate(_bearer(forged), None)
    assert signer.verified == 3  # checked in full every time: a refusal is not remembered


def test_a_token_of_a_rotated_away_secret_is_refused_by_the_agents_holding_the_new_one() -> None:
    # ``stratagem secret rotate`` redeploys every agent with the new secret: a new authenticator
    # that remembers nothing the old one verified.
    clock = _Clock()
    old = TokenSigner(ClusterSecret(os.urandom(32)), clock=clock)
    before = TokenAuthenticator(old, clock=clock)
    token = old.issue("tactical", ttl_s=600)
    assert before.authenticate(_bearer(token), None) == "tactical"
    after = TokenAuthenticator(TokenSigner(ClusterSecret(os.urandom(32)), clock=clock), clock=clock)
    with pytest.raises(UnauthenticatedError, match="signature does not verify"):
        after.authenticate(_bearer(token), None)


def test_what_it_remembers_stays_bounded_and_still_answers_rightly() -> None:
    clock = _Clock()
    signer = TokenSigner(ClusterSecret(os.urandom(32)), clock=clock)
    authenticator = TokenAuthenticator(signer, clock=clock)
    # Distinct tokens (one a second of lifetime more each), many more than it keeps.
    tokens = [signer.issue("strategic", ttl_s=60 + n) for n in range(_CACHE_LIMIT + 50)]
    for token in tokens:
        assert authenticator.authenticate(_bearer(token), None) == "strategic"
    assert len(authenticator._verified) <= _CACHE_LIMIT
    # Forgotten or remembered, every token still verifies, and expiry still holds.
    assert authenticator.authenticate(_bearer(tokens[0]), None) == "strategic"
    assert authenticator.authenticate(_bearer(tokens[-1]), None) == "strategic"
    clock.now = START + 60 + _CACHE_LIMIT + 50
    with pytest.raises(UnauthenticatedError, match="expired"):
        authenticator.authenticate(_bearer(tokens[-1]), None)
