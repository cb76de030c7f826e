"""Mutual TLS: the certificates ``init_certificates`` writes (handshakes: tests/integration)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stratagem.protocol import OPERATOR, ProtocolUsageError
from stratagem.protocol._tls import (
    TLS_SERVER_NAME,
    TlsFiles,
    certificate_identity,
    channel_credentials,
    identity_from_auth_context,
    init_certificates,
    server_credentials,
)
from tests.unit.protocol.conftest import IDENTITIES


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


# --- init_certificates ----------------------------------------------------------------------------


def test_init_writes_the_layout_with_private_modes(tmp_path: Path) -> None:
    directory = tmp_path / "state" / "tls"

    written = init_certificates(directory, ["perception", OPERATOR])

    names = ["ca.pem", "ca.key", "perception.pem", "perception.key", "operator.pem", "operator.key"]
    assert written == [directory / name for name in names]
    assert sorted(p.name for p in directory.iterdir()) == sorted(names)  # no temporary files left
    assert _mode(directory) == 0o700
    for path in written:
        assert _mode(path) == (0o600 if path.suffix == ".key" else 0o644), path
    files = TlsFiles.for_identity(directory, "perception")
    assert files == TlsFiles(
        ca=directory / "ca.pem", cert=directory / "perception.pem", key=directory / "perception.key"
    )


def test_init_tightens_an_existing_directory(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)

    init_certificates(directory, ["tactical"])

    assert _mode(directory) == 0o700


def test_identity_certificates_carry_identity_name_and_both_usages(tls_dir: Path) -> None:
    ca = _cert(tls_dir / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for identity in IDENTITIES:
        files = TlsFiles.for_identity(tls_dir, identity)
        cert = _cert(files.cert)
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == identity
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [TLS_SERVER_NAME]
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
            f"spiffe://stratagem/{identity}"
        ]
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert isinstance(key.curve, ec.SECP256R1)
        assert certificate_identity(files.cert) == identity


def test_certificates_expire_after_days_and_never_after_their_ca(tmp_path: Path) -> None:
    init_certificates(tmp_path, ["strategic"], days=30)
    ca, cert = _cert(tmp_path / "ca.pem"), _cert(tmp_path / "strategic.pem")
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 30 <= lifetime.days <= 31

    init_certificates(tmp_path, ["tactical"], days=3650)  # asks for longer than the CA lives

    assert _cert(tmp_path / "tactical.pem").not_valid_after_utc == ca.not_valid_after_utc


def test_rerun_with_existing_ca_adds_an_identity_signed_by_it(tmp_path: Path) -> None:
    init_certificates(tmp_path, ["perception"])
    ca_pem, ca_key = (tmp_path / "ca.pem").read_bytes(), (tmp_path / "ca.key").read_bytes()
    perception_pem = (tmp_path / "perception.pem").read_bytes()

    written = init_certificates(tmp_path, ["tactical"])

    assert written == [tmp_path / "tactical.pem", tmp_path / "tactical.key"]
    assert (tmp_path / "ca.pem").read_bytes() == ca_pem
    assert (tmp_path / "ca.key").read_bytes() == ca_key
    assert (tmp_path / "perception.pem").read_bytes() == perception_pem
    _cert(tmp_path / "tactical.pem").verify_directly_issued_by(_cert(tmp_path / "ca.pem"))


def test_existing_identity_files_are_refused_by_name_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    init_certificates(tmp_path, ["perception"])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    with pytest.raises(ProtocolUsageError, match=r"perception\.pem already exists"):
        init_certificates(tmp_path, ["tactical", "perception"])

    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # not even tactical


def test_overwrite_replaces_the_ca_and_the_named_identities(tmp_path: Path) -> None:
    init_certificates(tmp_path, ["perception"])
    old_ca = (tmp_path / "ca.pem").read_bytes()
    old_key = (tmp_path / "perception.key").read_bytes()

    written = init_certificates(tmp_path, ["perception"], overwrite=True)

    assert [p.name for p in written] == ["ca.pem", "ca.key", "perception.pem", "perception.key"]
    assert (tmp_path / "ca.pem").read_bytes() != old_ca
    assert (tmp_path / "perception.key").read_bytes() != old_key
    assert _mode(tmp_path / "perception.key") == 0o600
    _cert(tmp_path / "perception.pem").verify_directly_issued_by(_cert(tmp_path / "ca.pem"))


@pytest.mark.parametrize(
    "identity", ["", "Perception", "1st", "a" * 65, "ca", "../evil", "x/y", "per ception"]
)
def test_bad_identity_is_refused_before_anything_is_written(tmp_path: Path, identity: str) -> None:
    directory = tmp_path / "tls"
    with pytest.raises(ProtocolUsageError, match=r"^invalid identity "):
        init_certificates(directory, ["perception", identity])
    assert not directory.exists()


def test_an_unwritable_directory_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ProtocolUsageError, match=r"^cannot use .*file/tls for TLS files"):
        init_certificates(blocker / "tls", ["perception"])


def test_an_incomplete_ca_is_refused(tmp_path: Path) -> None:
    init_certificates(tmp_path, ["perception"])
    (tmp_path / "ca.key").unlink()
    with pytest.raises(ProtocolUsageError, match=r"ca\.pem exists but ca\.key does not"):
        init_certificates(tmp_path, ["tactical"])


def test_days_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ProtocolUsageError, match="at least 1 day"):
        init_certificates(tmp_path, ["perception"], days=0)


def test_identity_for_files_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ProtocolUsageError, match="invalid identity"):
        TlsFiles.for_identity(tmp_path, "../ca")


# --- credentials and certificate files ------------------------------------------------------------


def test_credentials_refuse_a_missing_file_by_name(tmp_path: Path) -> None:
    files = TlsFiles.for_identity(tmp_path, "perception")
    with pytest.raises(ProtocolUsageError, match=r"cannot read .*ca\.pem"):
        server_credentials(files)


def test_credentials_refuse_a_key_of_another_certificate(tls_dir: Path) -> None:
    files = TlsFiles.for_identity(tls_dir, "perception")
    mixed = TlsFiles(ca=files.ca, cert=files.cert, key=tls_dir / "tactical.key")
    with pytest.raises(ProtocolUsageError, match=r"tactical\.key is not the key of"):
        channel_credentials(mixed)


def test_credentials_refuse_a_certificate_of_another_ca(tls_dir: Path, foreign_dir: Path) -> None:
    foreign = TlsFiles.for_identity(foreign_dir, "perception")
    mixed = TlsFiles(ca=tls_dir / "ca.pem", cert=foreign.cert, key=foreign.key)
    with pytest.raises(ProtocolUsageError, match="was not issued by the CA"):
        server_credentials(mixed)


def test_certificate_identity_refuses_a_non_certificate(tls_dir: Path) -> None:
    with pytest.raises(ProtocolUsageError, match="is not a PEM certificate"):
        certificate_identity(tls_dir / "perception.key")
    with pytest.raises(ProtocolUsageError, match="names no Stratagem identity"):
        certificate_identity(tls_dir / "ca.pem")  # CN "Stratagem CA"


# --- identity_from_auth_context -------------------------------------------------------------------

PEM = [b"-----BEGIN CERTIFICATE-----..."]


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({}, None),
        (
            {"transport_security_type": [b"insecure"], "security_level": [b"TSI_SECURITY_NONE"]},
            None,
        ),
        # TLS without a client certificate: nothing verified.
        ({"transport_security_type": [b"ssl"], "x509_common_name": [b"operator"]}, None),
        (
            {
                "transport_security_type": [b"ssl"],
                "x509_pem_cert": PEM,
                "x509_common_name": [b"operator"],
                "x509_subject_alternative_name": [b"stratagem", b"spiffe://stratagem/tactical"],
            },
            "tactical",
        ),
        (
            {
                "transport_security_type": [b"ssl"],
                "x509_pem_cert": PEM,
                "x509_common_name": [b"operator"],
            },
            "operator",
        ),
        (
            {
                "transport_security_type": [b"ssl"],
                "x509_pem_cert": PEM,
                "x509_subject_alternative_name": [
                    b"spiffe://stratagem/tactical",
                    b"spiffe://stratagem/operator",
                ],
            },
            None,
        ),
        (
            {
                "transport_security_type": [b"ssl"],
                "x509_pem_cert": PEM,
                "x509_common_name": [b"operator"],
                "x509_subject_alternative_name": [b"spiffe://other/tactical"],
            },
            "operator",
        ),
        (
            {
                "transport_security_type": [b"ssl"],
                "x509_pem_cert": PEM,
                "x509_common_name": [b"Stratagem CA"],
            },
            None,
        ),
        (
            {
                "transport_security_type": [b"ssl"],
                "x509_pem_cert": PEM,
                "peer_spiffe_id": [b"spiffe://stratagem/../admin"],
            },
            None,
        ),
    ],
)
def test_identity_from_auth_context(context: dict[str, list[bytes]], expected: str | None) -> None:
    assert identity_from_auth_context(context) == expected
