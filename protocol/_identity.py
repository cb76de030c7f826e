"""Who is calling: verified identities for every agent and operator client.

A server never takes the caller's word for who it is. An ``Authenticator`` turns what arrived with
a call (its metadata, its TLS peer) into a verified identity, or refuses it with
``UNAUTHENTICATED``; the caller named in the metadata and the envelope must then be that identity.
Three authenticators:

- ``TokenAuthenticator`` (the default): the caller sends ``authorization: Bearer <token>``, a
  token that names its identity and an expiry and carries an HMAC-SHA256 over both, made with the
  cluster secret. The MAC is checked in constant time (``hmac.compare_digest``); verified tokens are
  remembered until they expire, so a long-lived client pays for one check, not one per call.
- ``TlsAuthenticator`` (``STRATAGEM_AUTH=mtls``): the transport verified the peer's certificate
  against the cluster's CA; the identity is the one in the certificate (see ``protocol._tls``).
- ``CallerMetadataAuthenticator``: the ``x-stratagem-caller`` metadata, trusted as sent. For tests
  and for measuring what authentication costs, never for a deployment.

The cluster secret is the trust root of token mode: whoever can read it can mint a token for any
identity, so it is created once with mode 0600 and handed only to what deploys the agents and to
the agents themselves. The operator's commands hold only the operator's own key, derived from it
(``IdentityKey``): they cannot sign as an agent. Isolation between agents, where one compromised
agent cannot speak as another, is what mutual TLS with a private key per identity gives.

A token is a standard JWT (RFC 7519) signed with HS256 through PyJWT, so any language's JWT
library mints and checks it: header ``{"alg": "HS256", "typ": "JWT", "kid": <key id>}``, claims
``sub`` (the identity), ``aud`` (``"stratagem"``), ``iat`` and ``exp`` (whole Unix seconds),
optionally ``nbf``. Each identity signs with a key of its own, derived from the cluster secret:
HMAC-SHA256(secret, ``"stratagem.jwt.hs256.v2"`` + a zero byte + the identity)
(``IdentityKey.derive``). A verifier holding the secret derives the key of the token's ``sub``; a
process holding only one identity's key (the operator's ``operator.key``) signs only as that
identity, so the operator's credential never acts as an agent. ``kid`` is the secret's key id
(``ClusterSecret.key_id``), so a token signed with a rotated-away secret is named as such. The
signature segment must be the canonical encoding (no stray padding bits). ``iat`` and ``nbf`` may
lie at most ``clock_skew_s`` (300 s) ahead of the verifier's clock, ``exp`` at most the maximum
lifetime plus that skew. Tokens never appear in logs, spans, errors or audit records: ``redact``
masks them wherever free text is recorded.

Before a client sends a token to an endpoint it read from a file, the agent there proves that it
holds the deployment's secret (``EndpointService.Prove``, ``protocol._proof``): it answers a nonce
with HMAC-SHA256(HMAC-SHA256(K(identity), ``"stratagem.endpoint.proof.v1"``), nonce + 0 + role +
0 + endpoint), which only a holder of the client's own key or of the secret can make, and which
names the endpoint the agent serves on, so a relay at another address cannot pass it on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import jwt

from stratagem.protocol._errors import ProtocolUsageError, UnauthenticatedError
from stratagem.protocol._models import IDENTITY_PATTERN
from stratagem.protocol._rpc import CALLER_KEY

if TYPE_CHECKING:
    from stratagem.protocol._tls import TlsFiles

__all__ = [
    "AUTHORIZATION_KEY",
    "Authenticator",
    "CallerMetadataAuthenticator",
    "ClusterSecret",
    "Credentials",
    "IdentityKey",
    "MissingSecretError",
    "TlsAuthenticator",
    "TlsCredentials",
    "TokenAuthenticator",
    "TokenCredentials",
    "TokenSigner",
]

AUTHORIZATION_KEY: Final = "authorization"
"""The metadata key of a token (``Bearer <token>``)."""

AUDIENCE: Final = "stratagem"
"""The ``aud`` claim of every token."""
_JWT_DOMAIN: Final = b"stratagem.jwt.hs256.v2\0"
_PROOF_DOMAIN: Final = b"stratagem.endpoint.proof.v1"
_MAX_TOKEN_CHARS: Final = 4096
_BEARER: Final = "Bearer "
_SECRET_BYTES: Final = 32
_IDENTITY: Final = re.compile(IDENTITY_PATTERN)
# A token's shape, checked before any MAC is computed (and used by ``redact`` to mask tokens).
TOKEN_PATTERN: Final = r"eyJ[A-Za-z0-9_-]{1,1024}\.eyJ[A-Za-z0-9_-]{1,2048}\.[A-Za-z0-9_-]{43}"
_TOKEN: Final = re.compile(TOKEN_PATTERN)
# Verified tokens kept at most; a full cache is cleared (tokens are re-verified, never trusted).
_CACHE_LIMIT: Final = 4096
# Derived identity keys kept at most by a signer holding the cluster secret.
_KEY_CACHE_LIMIT: Final = 256


class MissingSecretError(ProtocolUsageError):
    """There is no cluster secret where one is needed, and this process must not make one (a new
    secret would match no agent); the message says where the secret comes from."""


class ClusterSecret:
    """The secret that signs tokens, kept in a file only its owner may read.

    The value never appears in ``repr`` or ``str``; use ``reveal()`` where the bytes are needed.
    ``key_id`` names it without revealing it: agents publish it, so that ``stratagem up`` notices
    agents that hold another secret than the operator's (and, in a later token format, it is the
    ``kid`` that lets two secrets overlap).
    """

    __slots__ = ("_value",)

    def __init__(self, value: bytes) -> None:
        if len(value) < 16:
            raise ProtocolUsageError("a cluster secret needs at least 16 bytes")
        self._value = value

    def __repr__(self) -> str:
        return "ClusterSecret(<redacted>)"

    __str__ = __repr__

    def reveal(self) -> bytes:
        """The secret's bytes."""
        return self._value

    @property
    def key_id(self) -> str:
        """16 hex characters naming this secret: a domain-separated SHA-256 of it, which tells
        nothing about the secret itself."""
        return hashlib.sha256(b"stratagem cluster secret id\0" + self._value).hexdigest()[:16]

    @classmethod
    def generate(cls) -> ClusterSecret:
        """A new random secret (32 bytes)."""
        return cls(os.urandom(_SECRET_BYTES))

    def save(self, path: Path) -> None:
        """Write the secret to ``path`` (mode 0600), replacing what was there in one step: a
        reader sees the old secret or the new one, never a partial file.

        Raises:
            ProtocolUsageError: When the file cannot be written.
        """
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary.unlink(missing_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(base64.b64encode(self._value) + b"\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise ProtocolUsageError(f"cannot write the cluster secret {path}: {exc}") from exc

    def __reduce__(self) -> tuple[Callable[[bytes], ClusterSecret], tuple[bytes]]:
        # Handed to agent actors as a constructor argument; pickles as its bytes.
        return (ClusterSecret, (self._value,))

    @classmethod
    def load_or_create(cls, path: Path) -> ClusterSecret:
        """Read the secret at ``path``, creating it (mode 0600, 32 random bytes) on first use.

        Only what deploys agents creates a secret; a client of running agents uses :meth:`load`.

        Raises:
            ProtocolUsageError: When the file is readable by others than its owner, is too short,
                or cannot be read or created.
        """
        return cls._read(path, create=True)

    @classmethod
    def load(cls, path: Path) -> ClusterSecret:
        """Read the secret at ``path``; never make one (a new secret would match no agent).

        Raises:
            MissingSecretError: When there is no file at ``path`` (the message says where the
                secret comes from and how to copy it).
            ProtocolUsageError: When it is readable by others, too short or unreadable.
        """
        return cls._read(path, create=False)

    @classmethod
    def _read(cls, path: Path, *, create: bool) -> ClusterSecret:
        try:
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    pass
                else:
                    # Written once, by whoever created it; a concurrent reader retries below.
                    with os.fdopen(fd, "wb") as out:
                        out.write(base64.b64encode(os.urandom(_SECRET_BYTES)) + b"\n")
            elif not path.exists():
                raise MissingSecretError(
                    f"no cluster secret at {path}: the agents' secret is made by 'stratagem up' "
                    "(or 'demo') in the deployment's state directory; copy that cluster.secret "
                    "here with mode 600, or point STRATAGEM_SECRET_FILE at a copy"
                )
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                raise ProtocolUsageError(
                    f"the cluster secret {path} is readable by others (mode {mode:o}); "
                    "chmod 600 it or delete it to make a new one"
                )
            for _ in range(50):
                text = path.read_bytes().strip()
                if text:
                    break
                time.sleep(0.01)
        except OSError as exc:
            raise ProtocolUsageError(
                f"cannot read or create the cluster secret {path}: {exc}"
            ) from exc
        try:
            value = base64.b64decode(text, validate=True)
        except ValueError:
            value = b""
        if len(value) < 16:
            raise ProtocolUsageError(f"the cluster secret {path} is damaged; delete it to make one")
        return cls(value)


def _derive(secret: bytes, identity: str) -> bytes:
    """The token key of ``identity``: HMAC-SHA256(secret, domain + identity)."""
    return hmac.new(secret, _JWT_DOMAIN + identity.encode("ascii"), hashlib.sha256).digest()


class IdentityKey:
    """One identity's token key, derived from the cluster secret: it signs as that identity and
    no other (``TokenSigner(key)``), and proves nothing about the secret it came from.

    ``stratagem up`` writes the operator's as ``STATE_DIR/operator.key`` (mode 0600): a JSON
    object ``{"identity": ..., "key_id": ..., "key": <base64 of the 32 key bytes>}``. The operator's
    commands sign with it; another language's client signs HS256 with the decoded ``key`` and
    ``kid`` = ``key_id``.
    """

    __slots__ = ("_key", "identity", "key_id")

    def __init__(self, identity: str, key_id: str, key: bytes) -> None:
        if not _IDENTITY.fullmatch(identity):
            raise ProtocolUsageError(f"{identity!r} is not an identity ({IDENTITY_PATTERN})")
        if len(key) != 32 or not re.fullmatch(r"[0-9a-f]{16}", key_id):
            raise ProtocolUsageError("an identity key has 32 bytes and a 16-hex-digit key id")
        self.identity = identity
        self.key_id = key_id
        self._key = key

    def __repr__(self) -> str:
        return f"IdentityKey({self.identity!r}, key_id={self.key_id!r}, <redacted>)"

    __str__ = __repr__

    @classmethod
    def derive(cls, secret: ClusterSecret, identity: str) -> IdentityKey:
        """``identity``'s key under ``secret``."""
        return cls(identity, secret.key_id, _derive(secret.reveal(), identity))

    def reveal(self) -> bytes:
        """The key's bytes."""
        return self._key

    def save(self, path: Path) -> None:
        """Write the key to ``path`` (mode 0600), replacing what was there in one step.

        Raises:
            ProtocolUsageError: When the file cannot be written.
        """
        text = json.dumps(
            {"identity": self.identity, "key_id": self.key_id, "key": _b64_std(self._key)}
        )
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary.unlink(missing_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(text + "\n")
            os.replace(temporary, path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise ProtocolUsageError(f"cannot write the identity key {path}: {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> IdentityKey:
        """Read a key written by ``save``.

        Raises:
            MissingSecretError: There is no file at ``path``.
            ProtocolUsageError: It is readable by others, damaged or unreadable.
        """
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                raise ProtocolUsageError(
                    f"the identity key {path} is readable by others (mode {mode:o}); chmod 600 it"
                )
            raw = json.loads(path.read_bytes()[:4096])
            return cls(
                str(raw["identity"]),
                str(raw["key_id"]),
                base64.b64decode(raw["key"], validate=True),
            )
        except FileNotFoundError:
            raise MissingSecretError(
                f"no operator key at {path}: 'stratagem up' (or 'demo') writes it in the "
                "deployment's state directory; copy that operator.key here with mode 600, or "
                "point STRATAGEM_OPERATOR_KEY_FILE at a copy"
            ) from None
        except OSError as exc:
            raise ProtocolUsageError(f"cannot read the identity key {path}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolUsageError(
                f"the identity key {path} is damaged; 'stratagem up' writes it again"
            ) from exc


def _b64_std(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def endpoint_proof(key: bytes, *, nonce: bytes, role: str, endpoint: str) -> bytes:
    """What an agent answers a client's nonce with (see the module docstring): made with the
    client identity's token ``key``, over the nonce, the agent's role and its endpoint."""
    proof_key = hmac.new(key, _PROOF_DOMAIN, hashlib.sha256).digest()
    message = nonce + b"\0" + role.encode() + b"\0" + endpoint.encode()
    return hmac.new(proof_key, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


MAX_TOKEN_TTL_S = 30 * 24 * 3600.0
"""The longest token lifetime a signer accepts unless told otherwise (the settings' upper bound)."""
TOKEN_CLOCK_SKEW_S = 300.0
"""How far ahead of the verifier's clock an issuer's clock may run."""


class TokenSigner:
    """Issues and verifies tokens: with the cluster secret for any identity (each with its own
    derived key), with an ``IdentityKey`` for that one identity only.

    A token whose expiry lies further ahead than ``max_ttl_s`` plus ``clock_skew_s`` is refused
    even when its MAC holds: no signer of the deployment issues one, so it was made with a leaked
    secret or a misconfigured client, and accepting it would let it outlive a secret rotation. So
    is one issued (``iat``) or valid from (``nbf``) further ahead than ``clock_skew_s``.

    Args:
        secret: The cluster secret, or one identity's key.
        clock: Seconds since the epoch (tests pass their own).
        max_ttl_s: The longest lifetime a token may have (issued or verified).
        clock_skew_s: How far another host's clock may run ahead of this one's.
    """

    def __init__(
        self,
        secret: ClusterSecret | IdentityKey,
        *,
        clock: Callable[[], float] = time.time,
        max_ttl_s: float = MAX_TOKEN_TTL_S,
        clock_skew_s: float = TOKEN_CLOCK_SKEW_S,
    ) -> None:
        self._root = secret.reveal() if isinstance(secret, ClusterSecret) else None
        self._own = secret if isinstance(secret, IdentityKey) else None
        self._keys: dict[str, bytes] = {}
        if self._own is not None:
            self._keys[self._own.identity] = self._own.reveal()
        self._kid = secret.key_id
        self._clock = clock
        self._max_ttl_s = max_ttl_s
        self._clock_skew_s = clock_skew_s

    @property
    def identity(self) -> str | None:
        """The one identity this signer signs as (``None``: any, it holds the cluster secret)."""
        return None if self._own is None else self._own.identity

    def _key(self, identity: str) -> bytes | None:
        """``identity``'s token key, when this signer may sign or verify as it."""
        key = self._keys.get(identity)
        if key is None and self._root is not None:
            key = _derive(self._root, identity)
            if len(self._keys) >= _KEY_CACHE_LIMIT:
                self._keys.clear()
            self._keys[identity] = key
        return key

    def issue(self, identity: str, ttl_s: float) -> str:
        """A token for ``identity`` valid for ``ttl_s`` seconds from now.

        Raises:
            ProtocolUsageError: For a malformed identity, one this signer may not sign as, or a
                ``ttl_s`` not positive or past ``max_ttl_s``.
        """
        if not _IDENTITY.fullmatch(identity):
            raise ProtocolUsageError(f"{identity!r} is not an identity ({IDENTITY_PATTERN})")
        if ttl_s <= 0:
            raise ProtocolUsageError(f"ttl_s must be positive, not {ttl_s}")
        if ttl_s > self._max_ttl_s:
            raise ProtocolUsageError(f"ttl_s must be at most {self._max_ttl_s:g}, not {ttl_s:g}")
        key = self._key(identity)
        if key is None:
            raise ProtocolUsageError(
                f"this key signs only as {self.identity!r}, not as {identity!r}"
            )
        now = self._clock()
        expiry = int(now + ttl_s)
        claims = {"sub": identity, "aud": AUDIENCE, "iat": int(now), "exp": expiry}
        return jwt.encode(claims, key, algorithm="HS256", headers={"kid": self._kid})

    def prove(self, identity: str, *, nonce: bytes, role: str, endpoint: str) -> bytes | None:
        """The proof an agent at ``endpoint`` serving ``role`` gives ``identity``'s client for
        ``nonce`` (``None`` when this signer does not hold that identity's key)."""
        if not _IDENTITY.fullmatch(identity):
            return None
        key = self._key(identity)
        if key is None:
            return None
        return endpoint_proof(key, nonce=nonce, role=role, endpoint=endpoint)

    def verify(self, token: str) -> tuple[str, int]:
        """The identity a token names and its expiry, when its MAC holds under that identity's
        key and its times are acceptable.

        Raises:
            UnauthenticatedError: A malformed, forged, expired or not yet valid token; the message
                never repeats the token.
        """
        if len(token) > _MAX_TOKEN_CHARS or _TOKEN.fullmatch(token) is None:
            raise UnauthenticatedError("malformed token")
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            claimed = jwt.decode(token, options={"verify_signature": False}).get("sub")
        except jwt.InvalidTokenError:
            raise UnauthenticatedError("malformed token") from None
        if kid != self._kid:
            raise UnauthenticatedError(
                "invalid token: its signature does not verify (signed with key "
                f"{str(kid)[:16]!r}; this deployment's is {self._kid!r})"
            )
        if not isinstance(claimed, str) or not _IDENTITY.fullmatch(claimed):
            raise UnauthenticatedError("invalid token: its sub is not an identity")
        key = self._key(claimed)
        if key is None:
            raise UnauthenticatedError("invalid token: its signature does not verify")
        signature = token.rsplit(".", 1)[1]
        if _b64(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))) != signature:
            raise UnauthenticatedError("invalid token: its signature does not verify")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["HS256"],
                audience=AUDIENCE,
                # exp, iat and nbf are judged below on this signer's clock, with its skew.
                options={
                    "require": ["sub", "aud", "exp", "iat"],
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except jwt.InvalidSignatureError:
            raise UnauthenticatedError("invalid token: its signature does not verify") from None
        except jwt.InvalidTokenError as exc:
            raise UnauthenticatedError(f"invalid token: {type(exc).__name__}") from None
        identity, expiry, issued = claims["sub"], claims["exp"], claims["iat"]
        if identity != claimed:
            raise UnauthenticatedError("invalid token: its signature does not verify")
        if type(expiry) is not int:
            raise UnauthenticatedError("invalid token: its exp is not whole seconds")
        if type(issued) is not int:
            raise UnauthenticatedError("invalid token: its iat is not whole seconds")
        now = self._clock()
        if expiry <= now:
            raise UnauthenticatedError(f"expired token for {identity!r}")
        if issued > now + self._clock_skew_s:
            raise UnauthenticatedError(
                f"token for {identity!r} refused: issued in the future (iat more than "
                f"{self._clock_skew_s:g} s ahead of this agent's clock)"
            )
        not_before = claims.get("nbf")
        if not_before is not None:
            if type(not_before) is not int:
                raise UnauthenticatedError("invalid token: its nbf is not whole seconds")
            if not_before > now + self._clock_skew_s:
                raise UnauthenticatedError(
                    f"token for {identity!r} refused: not valid yet (nbf more than "
                    f"{self._clock_skew_s:g} s ahead of this agent's clock)"
                )
        if expiry > now + self._max_ttl_s + self._clock_skew_s:
            raise UnauthenticatedError(
                f"token for {identity!r} refused: its expiry is further ahead than the maximum "
                f"token lifetime ({self._max_ttl_s:g} s)"
            )
        return identity, expiry


class Authenticator(Protocol):
    """Turns what arrived with a call into the caller's verified identity."""

    @property
    def mode(self) -> str:
        """``token``, ``mtls`` or ``none``: what audit records and ``status`` show."""
        ...

    def authenticate(self, metadata: Mapping[str, str], context: Any) -> str:
        """The verified identity of the call's caller.

        Args:
            metadata: The call's text metadata.
            context: grpc's servicer context (its ``auth_context()`` for TLS).

        Raises:
            UnauthenticatedError: No credentials, or credentials that do not verify.
        """
        ...

    def server_credentials(self) -> Any:
        """``grpc.ServerCredentials`` to listen with, or ``None`` for a plaintext port."""
        ...

    def prove(self, identity: str, *, nonce: bytes, role: str, endpoint: str) -> bytes | None:
        """This agent's proof, for ``identity``'s client, that it holds the deployment's key
        (``None`` when this mode has none: TLS proves the server itself)."""
        ...


@dataclass(frozen=True, slots=True)
class CallerMetadataAuthenticator:
    """Trusts the ``x-stratagem-caller`` metadata as sent: authentication off (tests only)."""

    @property
    def mode(self) -> str:
        return "none"

    def authenticate(self, metadata: Mapping[str, str], context: Any) -> str:
        caller = metadata.get(CALLER_KEY, "")
        if not caller:
            raise UnauthenticatedError(f"no caller identity: the {CALLER_KEY} metadata is missing")
        if not _IDENTITY.fullmatch(caller):
            raise UnauthenticatedError(f"malformed caller identity in {CALLER_KEY}")
        return caller

    def server_credentials(self) -> Any:
        return None

    def prove(self, identity: str, *, nonce: bytes, role: str, endpoint: str) -> bytes | None:
        return None


class TokenAuthenticator:
    """Verifies ``authorization: Bearer <token>`` with the cluster secret.

    Verified tokens are remembered until they expire (at most a few thousand), so a client
    reusing its token costs a dictionary lookup and one clock read per call. A forged token is
    never remembered.
    """

    def __init__(self, signer: TokenSigner, *, clock: Callable[[], float] = time.time) -> None:
        self._signer = signer
        self._clock = clock
        self._verified: dict[str, tuple[str, int]] = {}

    @property
    def mode(self) -> str:
        return "token"

    def authenticate(self, metadata: Mapping[str, str], context: Any) -> str:
        value = metadata.get(AUTHORIZATION_KEY, "")
        if not value:
            raise UnauthenticatedError(
                f"no credentials: send '{AUTHORIZATION_KEY}: Bearer <token>' metadata"
            )
        if not value.startswith(_BEARER):
            raise UnauthenticatedError(f"the {AUTHORIZATION_KEY} metadata is not a bearer token")
        token = value[len(_BEARER) :]
        known = self._verified.get(token)
        if known is not None:
            identity, expiry = known
            if expiry > self._clock():
                return identity
            del self._verified[token]
        identity, expiry = self._signer.verify(token)
        if len(self._verified) >= _CACHE_LIMIT:
            self._verified.clear()
        self._verified[token] = (identity, expiry)
        return identity

    def server_credentials(self) -> Any:
        return None

    def prove(self, identity: str, *, nonce: bytes, role: str, endpoint: str) -> bytes | None:
        return self._signer.prove(identity, nonce=nonce, role=role, endpoint=endpoint)


class Credentials(Protocol):
    """What a client proves itself with: call metadata and/or a TLS channel."""

    @property
    def identity(self) -> str:
        """Who the client is (the caller it names)."""
        ...

    def metadata(self) -> Sequence[tuple[str, str]]:
        """Metadata sent with every call (a token), or nothing."""
        ...

    def channel_credentials(self) -> Any:
        """``grpc.ChannelCredentials`` for a TLS channel, or ``None`` for plaintext."""
        ...

    def channel_options(self) -> Sequence[tuple[str, Any]]:
        """Extra channel options (a TLS server name override)."""
        ...

    def expected_proof(self, *, nonce: bytes, role: str, endpoint: str) -> bytes | None:
        """The proof an agent holding the deployment's key answers ``nonce`` with at
        ``endpoint`` (``None``: nothing to check, the TLS channel proves the server)."""
        ...


class TokenCredentials:
    """A client's token for one identity, renewed when half of its lifetime has passed.

    Args:
        signer: Made with the cluster secret, or with this identity's ``IdentityKey``.
        identity: Who this client is.
        ttl_s: Each token's lifetime.
    """

    def __init__(
        self,
        signer: TokenSigner,
        identity: str,
        *,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._signer = signer
        self._identity = identity
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._renew_at = 0.0
        self.metadata()  # fail now on a bad identity or ttl

    def __repr__(self) -> str:
        return f"TokenCredentials({self._identity!r}, <token redacted>)"

    @property
    def identity(self) -> str:
        """The identity the tokens name."""
        return self._identity

    def metadata(self) -> Sequence[tuple[str, str]]:
        """The call metadata carrying a valid token."""
        now = self._clock()
        if now >= self._renew_at:
            with self._lock:
                if now >= self._renew_at:
                    token = self._signer.issue(self._identity, self._ttl_s)
                    self._metadata = ((AUTHORIZATION_KEY, _BEARER + token),)
                    self._renew_at = now + self._ttl_s / 2
        return self._metadata

    def channel_credentials(self) -> Any:
        return None

    def channel_options(self) -> Sequence[tuple[str, Any]]:
        return ()

    def expected_proof(self, *, nonce: bytes, role: str, endpoint: str) -> bytes | None:
        return self._signer.prove(self._identity, nonce=nonce, role=role, endpoint=endpoint)


class TlsAuthenticator:
    """Mutual TLS: the transport verified the peer's certificate against the cluster's CA; the
    identity is the one the certificate names (see ``protocol._tls``).

    A peer with no certificate, or one from another CA, never gets past the TLS handshake: its
    client sees ``UNAVAILABLE`` and no call reaches the pipeline (nor the audit log).
    """

    def __init__(self, files: TlsFiles) -> None:
        # mTLS needs `cryptography`'s X.509 code: loaded by who uses it, not by every importer.
        from stratagem.protocol._tls import identity_from_auth_context, server_credentials

        self._files = files
        self._credentials = server_credentials(files)  # fails now on missing or damaged files
        self._identity_of = identity_from_auth_context

    @property
    def mode(self) -> str:
        return "mtls"

    def authenticate(self, metadata: Mapping[str, str], context: Any) -> str:
        identity = self._identity_of(context.auth_context())
        if identity is None:
            raise UnauthenticatedError("no verified client certificate")
        return identity

    def server_credentials(self) -> Any:
        return self._credentials

    def prove(self, identity: str, *, nonce: bytes, role: str, endpoint: str) -> bytes | None:
        return None


class TlsCredentials:
    """A client's certificate and key for one identity, with the CA that signs the servers'."""

    def __init__(self, files: TlsFiles) -> None:
        from stratagem.protocol._tls import (
            CHANNEL_OPTIONS,
            certificate_identity,
            channel_credentials,
        )

        self._identity = certificate_identity(files.cert)
        self._credentials = channel_credentials(files)
        self._options: Sequence[tuple[str, Any]] = CHANNEL_OPTIONS

    def __repr__(self) -> str:
        return f"TlsCredentials({self._identity!r}, <key redacted>)"

    @property
    def identity(self) -> str:
        return self._identity

    def metadata(self) -> Sequence[tuple[str, str]]:
        return ()

    def channel_credentials(self) -> Any:
        return self._credentials

    def channel_options(self) -> Sequence[tuple[str, Any]]:
        return self._options

    def expected_proof(self, *, nonce: bytes, role: str, endpoint: str) -> bytes | None:
        return None
