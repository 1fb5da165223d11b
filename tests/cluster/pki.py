"""A throw-away certificate authority for the local cluster's client TLS, made by the tests.

``ca.pem`` is what clients trust (the Airflow connection's ``ssl_options.ca_certs``,
``CASSANDRA_TLS_CA_FILE``); each node gets ``<address>.pem``: its private key and certificate
(an IP address subject alternative name, so clients can check the host they dialled). The CA's
key stays in ``ca-key.pem`` so ``write_client_cert`` can issue client certificates (mutual TLS:
the nodes trust ``ca.pem`` for clients too); ``client.pem`` is one, key and chain in one file.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "counters-compaction tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_test_pki(folder: Path, addresses: Sequence[str], days: int = 7) -> Path:
    """Write ``ca.pem`` and one ``<address>.pem`` per node into ``folder``; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC) - timedelta(minutes=5)  # clocks of the JVM and Python may differ
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("counters test CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    ca_key_pem = folder / "ca-key.pem"
    ca_key_pem.touch(mode=0o600)
    ca_key_pem.write_bytes(_key_pem(ca_key))
    for address in addresses:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(f"cassandra node {address}"))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + timedelta(days=days))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        node_pem = folder / f"{address}.pem"
        node_pem.touch(mode=0o600)
        node_pem.write_bytes(_key_pem(key) + cert.public_bytes(serialization.Encoding.PEM))
    cert_path, key_path = write_client_cert(folder, "client", days)
    client_pem = folder / "client.pem"  # key and chain in one file, as the launcher takes it
    client_pem.touch(mode=0o600)
    client_pem.write_bytes(key_path.read_bytes() + cert_path.read_bytes())
    return folder


def write_client_cert(folder: Path, name: str, days: int = 7) -> tuple[Path, Path]:
    """A client certificate (CN ``name``, client auth) signed by the CA in ``folder``:
    ``<name>.crt`` and its key ``<name>.key``, as ``ssl_options`` certfile/keyfile take them."""
    ca_cert = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((folder / "ca-key.pem").read_bytes(), None)
    now = datetime.now(UTC) - timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.touch(mode=0o600)
    key_path.write_bytes(_key_pem(key))
    return cert_path, key_path
