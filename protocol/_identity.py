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
identity, so it is created once with mode 0600 and handed only to the processes of the deployment
(the agents and the operator's CLI). Per-identity isolation, where one compromised agent cannot
speak as another, is what mutual TLS with a private key per identity gives.

A token is a standard JWT (RFC 7519) signed with HS256 through PyJWT, so any language's JWT
library mints and checks it: header ``{"alg": "HS256", "typ": "JWT", "kid": <key id>}``, claims
``sub`` (the identity), ``aud`` (``"stratagem"``), ``iat`` and ``exp`` (whole Unix seconds). The
HMAC key is not the cluster secret itself but HMAC-SHA256(secret, ``"stratagem.jwt.hs256.v1"``),
so a key shared with another purpose cannot vouch for a token; ``kid`` is the secret's key id
(``ClusterSecret.key_id``), so a token signed with a rotated-away secret is named as such. The
signature segment must be the canonical encoding (no stray padding bits). Tokens never appear in
logs, spans, errors or audit records: ``redact`` masks them wherever free text is recorded.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
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
_JWT_DOMAIN: Final = b"stratagem.jwt.hs256.v1"
_MAX_TOKEN_CHARS: Final = 4096
_BEARER: Final = "Bearer "
_SECRET_BYTES: Final = 32
_IDENTITY: Final = re.compile(IDENTITY_PATTERN)
# A token's shape, checked before any MAC is computed (and used by ``redact`` to mask tokens).
TOKEN_PATTERN: Final = r"eyJ[A-Za-z0-9_-]{1,1024}\.eyJ[A-Za-z0-9_-]{1,2048}\.[A-Za-z0-9_-]{43}"
_TOKEN: Final = re.compile(TOKEN_PATTERN)
# Verified tokens kept at most; a full cache is cleared (tokens are re-verified, never trusted).
_CACHE_LIMIT: Final = 4096


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


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


MAX_TOKEN_TTL_S = 30 * 24 * 3600.0
"""The longest token lifetime a signer accepts unless told otherwise (the settings' upper bound)."""
TOKEN_CLOCK_SKEW_S = 300.0
"""How far ahead of the verifier's clock an issuer's clock may run."""


class TokenSigner:
    """Issues and verifies tokens made with one cluster secret.

    A token whose expiry lies further ahead than ``max_ttl_s`` plus ``clock_skew_s`` is refused
    even when its MAC holds: no signer of the deployment issues one, so it was made with a leaked
    secret or a misconfigured client, and accepting it would let it outlive a secret rotation.

    Args:
        secret: The cluster secret.
        clock: Seconds since the epoch (tests pass their own).
        max_ttl_s: The longest lifetime a token may have (issued or verified).
        clock_skew_s: How far another host's clock may run ahead of this one's.
    """

    def __init__(
        self,
        secret: ClusterSecret,
        *,
        clock: Callable[[], float] = time.time,
        max_ttl_s: float = MAX_TOKEN_TTL_S,
        clock_skew_s: float = TOKEN_CLOCK_SKEW_S,
    ) -> None:
        self._key = hmac.new(secret.reveal(), _JWT_DOMAIN, hashlib.sha256).digest()
        self._kid = secret.key_id
        self._clock = clock
        self._max_ttl_s = max_ttl_s
        self._clock_skew_s = clock_skew_s

    def issue(self, identity: str, ttl_s: float) -> str:
        """A token for ``identity`` valid for ``ttl_s`` seconds from now.

        Raises:
            ProtocolUsageError: For a malformed identity, or a ``ttl_s`` not positive or past
                ``max_ttl_s``.
        """
        if not _IDENTITY.fullmatch(identity):
            raise ProtocolUsageError(f"{identity!r} is not an identity ({IDENTITY_PATTERN})")
        if ttl_s <= 0:
            raise ProtocolUsageError(f"ttl_s must be positive, not {ttl_s}")
        if ttl_s > self._max_ttl_s:
            raise ProtocolUsageError(f"ttl_s must be at most {self._max_ttl_s:g}, not {ttl_s:g}")
        now = self._clock()
        expiry = int(now + ttl_s)
        claims = {"sub": identity, "aud": AUDIENCE, "iat": int(now), "exp": expiry}
        return jwt.encode(claims, self._key, algorithm="HS256", headers={"kid": self._kid})

    def verify(self, token: str) -> tuple[str, int]:
        """The identity a token names and its expiry, when its MAC holds and it has not expired.

        Raises:
            UnauthenticatedError: A malformed, forged or expired token; the message never repeats
                the token.
        """
        if len(token) > _MAX_TOKEN_CHARS or _TOKEN.fullmatch(token) is None:
            raise UnauthenticatedError("malformed token")
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.InvalidTokenError:
            raise UnauthenticatedError("malformed token") from None
        if kid != self._kid:
            raise UnauthenticatedError(
                "invalid token: its signature does not verify (signed with key "
                f"{str(kid)[:16]!r}; this deployment's is {self._kid!r})"
            )
        signature = token.rsplit(".", 1)[1]
        if _b64(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))) != signature:
            raise UnauthenticatedError("invalid token: its signature does not verify")
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=["HS256"],
                audience=AUDIENCE,
                # exp and iat are judged below on this signer's clock, with its skew.
                options={
                    "require": ["sub", "aud", "exp"],
                    "verify_exp": False,
                    "verify_iat": False,
                },
            )
        except jwt.InvalidSignatureError:
            raise UnauthenticatedError("invalid token: its signature does not verify") from None
        except jwt.InvalidTokenError as exc:
            raise UnauthenticatedError(f"invalid token: {type(exc).__name__}") from None
        identity, expiry = claims["sub"], claims["exp"]
        if not isinstance(identity, str) or not _IDENTITY.fullmatch(identity):
            raise UnauthenticatedError("invalid token: its sub is not an identity")
        if type(expiry) is not int:
            raise UnauthenticatedError("invalid token: its exp is not whole seconds")
        now = self._clock()
        if expiry <= now:
            raise UnauthenticatedError(f"expired token for {identity!r}")
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


class TokenCredentials:
    """A client's token for one identity, renewed when half of its lifetime has passed.

    Args:
        signer: Made with the cluster secret.
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
