"""A throwaway TLS identity for tests: a self-signed certificate for ``127.0.0.1`` and ``localhost``.

Generated at test time with ``cryptography`` (never checked in). The certificate is its own CA, so a client
that trusts the certificate file (Airflow's ``[api] ssl_cert``, which the Task SDK's client loads as a CA)
verifies a server presenting it.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path


def self_signed_cert(directory: Path, *, days: int = 1) -> tuple[Path, Path]:
    """Write ``cert.pem`` and ``key.pem`` (PEM, unencrypted EC P-256 key) under ``directory``; return their paths.

    The certificate is valid from five minutes ago for ``days`` days, for ``localhost`` and ``127.0.0.1``,
    and marked as a CA (so OpenSSL accepts it as a trust anchor). Raises ``OSError`` when the files cannot be
    written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leoflow-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path
