"""Throw-away CAs and the certificates they sign, made at test time with ``cryptography`` (a
dependency already): a server certificate for 127.0.0.1/localhost (tests of TLS listeners) and
client certificates (a listener with ``require_certificate``)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = ("127.0.0.1", "localhost")


@dataclass(frozen=True, slots=True)
class CertFiles:
    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


@dataclass(frozen=True, slots=True)
class TestCa:
    """A CA key and certificate; its PEM certificate is at ``path``."""

    __test__ = False  # not a pytest test class

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path

    def issue(
        self,
        directory: Path,
        stem: str,
        *,
        names: tuple[str, ...] = LOOPBACK_NAMES,
        client: bool = False,
        valid_days: float = 1.0,
        passphrase: bytes | None = None,
    ) -> CertFiles:
        """``<stem>.crt`` and ``<stem>.key`` (PEM, 0600) under ``directory``: a server
        certificate for ``names``, or a client certificate (``client``); ``valid_days`` below
        0 gives one that has expired; ``passphrase`` encrypts the key."""
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        end = now + datetime.timedelta(days=valid_days)
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0] if names else stem))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(min(now, end) - datetime.timedelta(days=2))
            .not_valid_after(end)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if names:
            names_ext = x509.SubjectAlternativeName([_san(n) for n in names])
            builder = builder.add_extension(names_ext, critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        files = CertFiles(self.path, directory / f"{stem}.crt", directory / f"{stem}.key")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        encryption: serialization.KeySerializationEncryption = (
            serialization.NoEncryption()
            if passphrase is None
            else serialization.BestAvailableEncryption(passphrase)
        )
        files.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
            )
        )
        files.key.chmod(0o600)
        return files


def make_ca(path: Path, common_name: str = "snlp test CA") -> TestCa:
    """A self-signed CA valid for a day, its certificate written to ``path`` (PEM)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=3))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return TestCa(key, cert, path)


def make_server_certs(directory: Path) -> CertFiles:
    """A fresh CA (``ca.crt``) and the server certificate it signed for 127.0.0.1 and
    localhost (``server.crt``, ``server.key``)."""
    return make_ca(directory / "ca.crt").issue(directory, "server")
