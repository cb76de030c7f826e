"""How this deployment's processes prove who they are, from the settings (``STRATAGEM_AUTH``).

``token`` (the default): the cluster secret in ``STATE_DIR/cluster.secret`` (created mode 0600 by
``stratagem up`` or the embedded demo: nothing else makes one; ``stratagem secret rotate`` replaces
it) is the root every identity's token key is derived from; the launcher hands it to the agent
actors it creates, so agents on other nodes need no copy of the file. What deploys also writes the
operator's own key, ``STATE_DIR/operator.key`` (mode 0600, ``protocol.IdentityKey``): the
operator's commands sign with it and nothing else, so they cannot act as an agent. An operator on
another machine copies ``operator.key`` (``STRATAGEM_OPERATOR_KEY_FILE``); a copy of the cluster
secret (``STRATAGEM_SECRET_FILE``) still works where no operator key is found, from which only the
operator's key is derived. A person who decides gates as themselves (``ana``) gets a key of their
own the same way (``stratagem secret issue ana --out ana.key``, ``issue_identity_key``): pointed to
by ``STRATAGEM_OPERATOR_KEY_FILE``, the commands sign with it as ``ana`` (``--as ana``) and as
no one else.

``mtls``: each process presents the certificate of its identity from ``STRATAGEM_TLS_DIR``
(``stratagem certs init``); every node needs the folder (or at least the CA, its own agents'
certificates and keys).

``none``: no credentials; the caller's name is trusted. For tests and benchmarks only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from stratagem.protocol import (
    OPERATOR,
    Authenticator,
    CallerMetadataAuthenticator,
    ClusterSecret,
    Credentials,
    IdentityKey,
    MissingSecretError,
    ProtocolUsageError,
    TlsAuthenticator,
    TlsCredentials,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
)
from stratagem.protocol._models import IDENTITY_PATTERN
from stratagem.runtime.config._settings import Settings

__all__ = [
    "IdentityRefusedError",
    "authenticator_for",
    "check_operator_identity",
    "cluster_secret",
    "credentials_for",
    "issue_identity_key",
    "operator_key",
    "save_operator_key",
]

logger = logging.getLogger(__name__)

_IDENTITY = re.compile(IDENTITY_PATTERN)


class IdentityRefusedError(ProtocolUsageError):
    """An identity the operator may not be (an agent's, one its key does not sign as, or no
    identity at all); the message says which and why in one line."""


def operator_key(settings: Settings) -> IdentityKey:
    """The operator's token key: ``operator.key`` (``STRATAGEM_OPERATOR_KEY_FILE``), else derived
    from a cluster secret at hand (a deployment from before operator keys, or an operator machine
    with a copy of the secret); the secret itself is not kept.

    Raises:
        MissingSecretError: Neither is there (the message says where they come from).
        ProtocolUsageError: A file is readable by others, damaged or unreadable.
    """
    try:
        return IdentityKey.load(settings.operator_key_path)
    except MissingSecretError:
        if not settings.secret_path.exists():
            raise MissingSecretError(
                f"no operator key at {settings.operator_key_path} (nor a cluster secret at "
                f"{settings.secret_path} to derive it from): 'stratagem up' (or 'demo') writes "
                "both in the deployment's state directory; copy its operator.key here with mode "
                "600, or point STRATAGEM_OPERATOR_KEY_FILE at a copy"
            ) from None
    return IdentityKey.derive(ClusterSecret.load(settings.secret_path), OPERATOR)


def save_operator_key(settings: Settings, secret: ClusterSecret) -> None:
    """Write the operator's key derived from ``secret`` (what deploys does, after making or
    rotating the secret), unless the file already holds it."""
    key = IdentityKey.derive(secret, OPERATOR)
    path = settings.operator_key_path
    try:
        current = IdentityKey.load(path)
    except ProtocolUsageError:
        current = None
    if current is None or current.reveal() != key.reveal() or current.identity != OPERATOR:
        key.save(path)


def check_operator_identity(settings: Settings, identity: str, agents: Sequence[str]) -> None:
    """Refuse an identity the operator's commands may not act as: one that is not an identity,
    an agent of the deployment (``agents``), or (token mode) one the key they sign with
    (``operator_key``: ``STRATAGEM_OPERATOR_KEY_FILE``, say ana's own) does not sign as.

    Raises:
        IdentityRefusedError: One line naming the identity and why.
        MissingSecretError: Token mode, and no key to sign with.
    """
    if not _IDENTITY.fullmatch(identity):
        raise IdentityRefusedError(
            f"{identity[:64]!r} is not an identity (lowercase, {IDENTITY_PATTERN})"
        )
    if identity in agents:
        raise IdentityRefusedError(
            f"the operator cannot act as {identity!r}: it is one of the deployment's agents, "
            "which sign with keys the operator does not hold"
        )
    if settings.auth == "token":
        _check_key(settings, operator_key(settings), identity)


def _check_key(settings: Settings, key: IdentityKey, identity: str) -> None:
    """Refuse ``identity`` when ``key`` (the operator's key file, or the key derived from a
    cluster secret) signs as another."""
    if key.identity == identity:
        return
    if key.identity == OPERATOR:
        raise IdentityRefusedError(
            f"the operator's key signs only as {OPERATOR!r}, not as {identity!r}; 'stratagem "
            f"secret issue {identity} --out FILE' writes a key for {identity!r} (then "
            "STRATAGEM_OPERATOR_KEY_FILE=FILE)"
        )
    raise IdentityRefusedError(
        f"the key in {settings.operator_key_path} (STRATAGEM_OPERATOR_KEY_FILE) signs only as "
        f"{key.identity!r}, not as {identity!r}; call with --as {key.identity}, or point "
        f"STRATAGEM_OPERATOR_KEY_FILE at a key for {identity!r}"
    )


def issue_identity_key(settings: Settings, identity: str, agents: Sequence[str]) -> IdentityKey:
    """The token key of ``identity`` (a person, say a gate's decider), derived from the cluster
    secret: what signs as that identity and no other. A copy of the cluster secret is needed
    (``up`` writes it); agents' identities are refused, as is another mode than ``token``.

    Raises:
        IdentityRefusedError: Not an identity, an agent's, or not token mode.
        MissingSecretError: No cluster secret here.
    """
    if settings.auth != "token":
        raise IdentityRefusedError(
            f"identity keys are for STRATAGEM_AUTH=token; this deployment uses {settings.auth} "
            "(mtls: 'stratagem certs init --identity NAME')"
        )
    if not _IDENTITY.fullmatch(identity):
        raise IdentityRefusedError(
            f"{identity[:64]!r} is not an identity (lowercase, {IDENTITY_PATTERN})"
        )
    if identity in agents:
        raise IdentityRefusedError(
            f"no key is issued for {identity!r}: it is one of the deployment's agents"
        )
    return IdentityKey.derive(ClusterSecret.load(settings.secret_path), identity)


def cluster_secret(settings: Settings, *, create: bool = True) -> ClusterSecret | None:
    """The cluster secret token mode needs, or ``None`` in another mode.

    Args:
        settings: The deployment's settings.
        create: Make the secret when there is none: only for what starts a deployment of its own
            (``up``, the embedded demo); everything else must use the deployment's secret.

    Raises:
        MissingSecretError: There is none and ``create`` is false (the message says where the
            secret comes from).
        ProtocolUsageError: When the secret file cannot be read or created, or others may read it.
    """
    if settings.auth != "token":
        return None
    if create:
        return ClusterSecret.load_or_create(settings.secret_path)
    return ClusterSecret.load(settings.secret_path)


def authenticator_for(
    settings: Settings, role: str, secret: ClusterSecret | None = None
) -> Authenticator:
    """How ``role``'s server verifies its callers.

    Args:
        settings: The deployment's settings.
        role: The agent served (its own certificate in mTLS mode).
        secret: The cluster secret (token mode); read from the state directory when ``None``
            (never made: a server with a new secret would refuse every client).
    """
    if settings.auth == "token":
        signer = TokenSigner(
            secret or ClusterSecret.load(settings.secret_path), max_ttl_s=settings.token_ttl_s
        )
        return TokenAuthenticator(signer)
    if settings.auth == "mtls":
        from stratagem.protocol import TlsFiles

        return TlsAuthenticator(TlsFiles.for_identity(settings.tls_path, role))
    return CallerMetadataAuthenticator()


def credentials_for(
    settings: Settings, identity: str, secret: ClusterSecret | None = None
) -> Credentials | None:
    """What a client of ``identity`` sends (``None`` when authentication is off).

    With ``secret`` (the agents, which the launcher hands it): tokens for any identity. Without
    it, the client is the operator: its key (``operator_key``) signs only as the operator, so
    another ``identity`` is refused. A client never makes a secret or a key: their absence is an
    error that says where they come from (a new one would match no agent).

    Raises:
        IdentityRefusedError: The operator's key does not sign as ``identity``.
        MissingSecretError: No operator key and no cluster secret.
    """
    if settings.auth == "token":
        signing: ClusterSecret | IdentityKey = secret or operator_key(settings)
        if isinstance(signing, IdentityKey):
            _check_key(settings, signing, identity)
        signer = TokenSigner(signing, max_ttl_s=settings.token_ttl_s)
        return TokenCredentials(signer, identity, ttl_s=settings.token_ttl_s)
    if settings.auth == "mtls":
        from stratagem.protocol import TlsFiles

        return TlsCredentials(TlsFiles.for_identity(settings.tls_path, identity))
    return None
