"""Mutual TLS: a private CA, one certificate per identity, and gRPC credentials built from them.

``init_certificates`` (behind ``stratagem certs init``) writes one directory::

    <dir>/               mode 0700
    ├── ca.pem           the CA certificate every agent and client trusts
    ├── ca.key           the CA's private key (0600); only needed to issue more certificates
    ├── <identity>.pem   one certificate per identity, signed by the CA
    └── <identity>.key   its private key (0600)

Every certificate names its identity twice: as the subject common name and as the URI SAN
``spiffe://stratagem/<identity>``. Every certificate also carries the DNS SAN ``TLS_SERVER_NAME``
and both the serverAuth and clientAuth extended key usages, so one certificate serves an agent as a
server and as a client of other agents; clients check the server against ``TLS_SERVER_NAME``
(``CHANNEL_OPTIONS``), so certificates need not name the addresses agents run on.

The server requires a client certificate signed by the same CA (``server_credentials``); the
identity it verified is read from the call's auth context by ``identity_from_auth_context``. A
client with no certificate, or one from another CA, fails the TLS handshake, so no handler runs
and the client sees ``UNAVAILABLE``.

Keys are EC P-256 and are written unencrypted: file modes protect them, as they protect the token
secret of the default authentication.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stratagem.protocol._errors import ProtocolUsageError
from stratagem.protocol._models import IDENTITY_PATTERN

__all__ = [
    "CHANNEL_OPTIONS",
    "TLS_SERVER_NAME",
    "TlsFiles",
    "certificate_identity",
    "channel_credentials",
    "identity_from_auth_context",
    "init_certificates",
    "server_credentials",
]

logger = logging.getLogger(__name__)

TLS_SERVER_NAME: Final = "stratagem"
"""The DNS name every agent certificate carries; clients verify servers against it."""

CHANNEL_OPTIONS: Final = (("grpc.ssl_target_name_override", TLS_SERVER_NAME),)
"""Channel options for a client using ``channel_credentials``: check the server's name as
``TLS_SERVER_NAME`` whatever address the channel dials."""

SPIFFE_PREFIX: Final = f"spiffe://{TLS_SERVER_NAME}/"
"""The URI SAN prefix; the identity follows it."""

_CA_NAME: Final = "ca"
_CA_COMMON_NAME: Final = "Stratagem CA"
_ORGANIZATION: Final = "Stratagem"
_IDENTITY_RE: Final = re.compile(IDENTITY_PATTERN)
# Certificates start a little in the past so a peer whose clock is slightly behind accepts them.
_CLOCK_SKEW: Final = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The files of one identity: the CA certificate, its own certificate and its private key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def for_identity(cls, directory: Path, identity: str) -> TlsFiles:
        """The files ``init_certificates`` writes for ``identity`` in ``directory``.

        Args:
            directory: The TLS directory (``STRATAGEM_TLS_DIR``).
            identity: A role or ``OPERATOR``.

        Returns:
            ``directory/ca.pem``, ``directory/<identity>.pem`` and ``directory/<identity>.key``.

        Raises:
            ProtocolUsageError: ``identity`` is not a valid identity.
        """
        _check_identity(identity)
        return cls(
            ca=directory / f"{_CA_NAME}.pem",
            cert=directory / f"{identity}.pem",
            key=directory / f"{identity}.key",
        )


def init_certificates(
    directory: Path, identities: Iterable[str], *, days: int = 365, overwrite: bool = False
) -> list[Path]:
    """Create the CA (unless it exists) and one certificate and key per identity, signed by it.

    An existing CA (``ca.pem`` + ``ca.key``) is reused, so a later call adds identities to the same
    trust domain; with ``overwrite`` a new CA replaces it, and certificates issued by the old CA
    (including ones not named in ``identities``) stop being trusted. Nothing is written when any
    check fails. Each file is written to a temporary name and renamed, so a reader never sees half
    a key. The directory is created if needed and its mode set to 0700.

    Args:
        directory: Where to write the files.
        identities: The identities to issue certificates for (roles and ``OPERATOR``).
        days: How long new certificates are valid; a certificate never outlives its CA.
        overwrite: Replace the CA and existing identity files instead of refusing.

    Returns:
        The files written, CA files first.

    Raises:
        ProtocolUsageError: An identity is invalid, ``days`` is not positive, a file exists and
            ``overwrite`` is false, the existing CA is unusable, or the directory is not writable.
    """
    names = list(dict.fromkeys(identities))
    for identity in names:
        _check_identity(identity)
    if days < 1:
        raise ProtocolUsageError(f"certificate validity must be at least 1 day, got {days}")

    ca_files = TlsFiles(
        ca=directory / f"{_CA_NAME}.pem",
        cert=directory / f"{_CA_NAME}.pem",
        key=directory / f"{_CA_NAME}.key",
    )
    ca_exists = [p for p in (ca_files.cert, ca_files.key) if p.exists()]
    create_ca = overwrite or not ca_exists
    if not overwrite:
        if len(ca_exists) == 1:
            missing = ca_files.key if ca_exists[0] == ca_files.cert else ca_files.cert
            raise ProtocolUsageError(
                f"incomplete CA in {directory}: {ca_exists[0].name} exists but {missing.name} "
                "does not; restore it or re-create everything with --force"
            )
        for identity in names:
            for path in (directory / f"{identity}.pem", directory / f"{identity}.key"):
                if path.exists():
                    raise ProtocolUsageError(
                        f"{path} already exists; use --force to replace it "
                        "(and the CA, which invalidates every certificate it signed)"
                    )

    now = datetime.datetime.now(datetime.UTC)
    if create_ca:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _ca_certificate(ca_key, now, days)
    else:
        ca_cert, ca_key = _load_ca(ca_files, now)

    _prepare_directory(directory)
    written: list[Path] = []
    try:
        if create_ca:
            _write(ca_files.key, _key_pem(ca_key), private=True)
            _write(ca_files.cert, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
            written += [ca_files.cert, ca_files.key]
        for identity in names:
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _identity_certificate(identity, key, ca_cert, ca_key, now, days)
            files = TlsFiles.for_identity(directory, identity)
            _write(files.key, _key_pem(key), private=True)
            _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
            written += [files.cert, files.key]
    except OSError as exc:
        raise ProtocolUsageError(
            f"cannot write TLS files in {directory}: {exc.strerror or exc}"
        ) from exc
    logger.info("wrote %d TLS files in %s", len(written), directory)
    return written


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server credentials that present ``files.cert`` and require a client certificate.

    Clients must present a certificate signed by the CA in ``files.ca``; a client without one, or
    with one from another CA, fails the handshake before any handler runs.

    Args:
        files: This agent's TLS files.

    Returns:
        Credentials for ``grpc.aio.Server.add_secure_port``.

    Raises:
        ProtocolUsageError: A file is missing or unreadable, the key does not match the
            certificate, or the certificate was not signed by the CA.
    """
    ca, cert, key = _read_checked(files)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client credentials that present ``files.cert`` and trust only servers signed by the CA.

    Use with ``CHANNEL_OPTIONS``: ``grpc.aio.secure_channel(target, creds, options=...)``.

    Args:
        files: This side's TLS files.

    Returns:
        Credentials for ``grpc.aio.secure_channel``.

    Raises:
        ProtocolUsageError: As ``server_credentials``.
    """
    ca, cert, key = _read_checked(files)
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def identity_from_auth_context(auth_context: Mapping[str, Sequence[bytes]]) -> str | None:
    """The peer identity gRPC verified, from ``ServicerContext.auth_context()``.

    The identity is the ``spiffe://stratagem/<identity>`` URI SAN when there is exactly one, else
    the subject common name. Nothing is taken from a call that did not arrive over TLS with a peer
    certificate. gRPC puts a certificate in the auth context only after verifying it against the
    server's roots (``server_credentials`` requires one), so what is found here is verified.

    What gRPC (1.85) puts there for a TLS peer: ``transport_security_type`` (``b"ssl"``),
    ``x509_pem_cert``, ``x509_common_name``, ``x509_subject``, ``x509_subject_alternative_name``
    (every DNS and URI SAN), ``peer_dns``, ``peer_uri``, ``peer_spiffe_id``, ``security_level``
    and ``ssl_*`` session details. An insecure call has only ``transport_security_type``
    (``b"insecure"``) and ``security_level``.

    Args:
        auth_context: The call's auth context: property name to values.

    Returns:
        The identity, or ``None`` when there is no verified peer certificate or it names no valid
        identity (or names more than one).
    """
    if list(auth_context.get("transport_security_type", ())) != [b"ssl"]:
        return None
    if not auth_context.get("x509_pem_cert"):
        return None
    uris = {
        value.decode("utf-8", "replace")
        for key in ("peer_spiffe_id", "peer_uri", "x509_subject_alternative_name")
        for value in auth_context.get(key, ())
    }
    spiffe = {uri.removeprefix(SPIFFE_PREFIX) for uri in uris if uri.startswith(SPIFFE_PREFIX)}
    if spiffe:
        return _valid_or_none(spiffe)
    common_names = {v.decode("utf-8", "replace") for v in auth_context.get("x509_common_name", ())}
    return _valid_or_none(common_names)


def certificate_identity(path: Path) -> str:
    """The identity a certificate file names (its spiffe URI SAN, else its common name).

    Args:
        path: A PEM certificate, such as ``<dir>/<identity>.pem``.

    Returns:
        The identity.

    Raises:
        ProtocolUsageError: The file is unreadable, not a PEM certificate, or names no valid
            identity.
    """
    cert = _load_certificate(path)
    identity = _identity_of(cert)
    if identity is None:
        raise ProtocolUsageError(f"{path} names no Stratagem identity")
    return identity


def _check_identity(identity: str) -> None:
    if not isinstance(identity, str) or not _IDENTITY_RE.fullmatch(identity):
        raise ProtocolUsageError(
            f"invalid identity {identity!r}: expected lowercase letters, digits, '_' or '-', "
            "starting with a letter, at most 64 characters"
        )
    if identity == _CA_NAME:
        raise ProtocolUsageError(f"invalid identity {identity!r}: reserved for the CA's files")


def _valid_or_none(candidates: set[str]) -> str | None:
    if len(candidates) != 1:
        return None
    (identity,) = candidates
    if not _IDENTITY_RE.fullmatch(identity) or identity == _CA_NAME:
        return None
    return identity


def _identity_of(cert: x509.Certificate) -> str | None:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        uris: list[str] = []
    else:
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    spiffe = {uri.removeprefix(SPIFFE_PREFIX) for uri in uris if uri.startswith(SPIFFE_PREFIX)}
    if spiffe:
        return _valid_or_none(spiffe)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return _valid_or_none({str(name.value) for name in names})


def _ca_certificate(
    key: ec.EllipticCurvePrivateKey, now: datetime.datetime, days: int
) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, _CA_COMMON_NAME),
        ]
    )
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(_serial())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _identity_certificate(
    identity: str,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    days: int,
) -> x509.Certificate:
    public = key.public_key()
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    return (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
                    x509.NameAttribute(NameOID.COMMON_NAME, identity),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(_serial())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(TLS_SERVER_NAME),
                    x509.UniformResourceIdentifier(f"{SPIFFE_PREFIX}{identity}"),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _serial() -> int:
    # RFC 5280: positive, at most 20 octets; 159 random bits keeps the top bit clear.
    return secrets.randbits(159) | 1


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_ca(
    files: TlsFiles, now: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = _load_certificate(files.cert)
    key = _load_key(files.key)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not _matches(cert, key):
        raise ProtocolUsageError(f"{files.key} is not the key of {files.cert}")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise ProtocolUsageError(f"{files.cert} is not a CA certificate")
    try:
        cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound as exc:
        raise ProtocolUsageError(f"{files.cert} has no subject key identifier") from exc
    if cert.not_valid_after_utc <= now:
        raise ProtocolUsageError(
            f"the CA {files.cert} expired on {cert.not_valid_after_utc:%Y-%m-%d}; "
            "re-create everything with --force"
        )
    return cert, key


def _load_certificate(path: Path) -> x509.Certificate:
    data = _read(path)
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise ProtocolUsageError(f"{path} is not a PEM certificate") from exc


def _load_key(path: Path) -> PrivateKeyTypes:
    data = _read(path)
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ProtocolUsageError(f"{path} is not an unencrypted PEM private key") from exc


def _matches(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    der = serialization.Encoding.DER
    info = serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(der, info) == key.public_key().public_bytes(der, info)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ProtocolUsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _read_checked(files: TlsFiles) -> tuple[bytes, bytes, bytes]:
    # gRPC reports a bad file only at the first handshake, and vaguely; check them here instead.
    ca_pem, cert_pem, key_pem = _read(files.ca), _read(files.cert), _read(files.key)
    ca = _load_certificate(files.ca)
    cert = _load_certificate(files.cert)
    if not _matches(cert, _load_key(files.key)):
        raise ProtocolUsageError(f"{files.key} is not the key of {files.cert}")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise ProtocolUsageError(f"{files.cert} was not issued by the CA in {files.ca}") from exc
    return ca_pem, cert_pem, key_pem


def _prepare_directory(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mkdir's mode is filtered by the umask, and an existing directory keeps its own mode.
        directory.chmod(0o700)
    except OSError as exc:
        raise ProtocolUsageError(
            f"cannot use {directory} for TLS files: {exc.strerror or exc}"
        ) from exc


def _write(path: Path, data: bytes, *, private: bool) -> None:
    mode = 0o600 if private else 0o644
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)  # the umask may have narrowed the mode at creation
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
