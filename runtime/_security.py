"""How this deployment's processes prove who they are, from the settings (``STRATAGEM_AUTH``).

``token`` (the default): the cluster secret in ``STATE_DIR/cluster.secret`` (created mode 0600 by
``stratagem up`` or the embedded demo: nothing else makes one; ``stratagem secret rotate`` replaces
it) signs each identity's tokens; the launcher hands it
to the agent actors it creates, so agents on other nodes need no copy of the file. An operator on
another machine copies the file (it is the deployment's root of trust: guard it like a password).

``mtls``: each process presents the certificate of its identity from ``STRATAGEM_TLS_DIR``
(``stratagem certs init``); every node needs the folder (or at least the CA, its own agents'
certificates and keys).

``none``: no credentials; the caller's name is trusted. For tests and benchmarks only.
"""

from __future__ import annotations

from stratagem.protocol import (
    Authenticator,
    CallerMetadataAuthenticator,
    ClusterSecret,
    Credentials,
    TlsAuthenticator,
    TlsCredentials,
    TokenAuthenticator,
    TokenCredentials,
    TokenSigner,
)
from stratagem.runtime._settings import Settings

__all__ = ["authenticator_for", "cluster_secret", "credentials_for"]


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

    A client never makes a cluster secret: without ``secret`` it reads the deployment's file, and
    its absence is an error that says where the secret comes from (a new one would match no agent).
    """
    if settings.auth == "token":
        signer = TokenSigner(
            secret or ClusterSecret.load(settings.secret_path), max_ttl_s=settings.token_ttl_s
        )
        return TokenCredentials(signer, identity, ttl_s=settings.token_ttl_s)
    if settings.auth == "mtls":
        from stratagem.protocol import TlsFiles

        return TlsCredentials(TlsFiles.for_identity(settings.tls_path, identity))
    return None
