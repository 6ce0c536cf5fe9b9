"""Throwaway TLS material for the mock upstream.

The mock serves HTTPS so that end-to-end tests exercise the same TLS + ALPN
path (h2 / http/1.1) as real providers. Clients and proxies must be able to
*verify* the mock rather than disable verification, so we mint a tiny private
CA and a leaf certificate signed by it; callers trust ``ca.pem``.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# One day is plenty for a test run and keeps leaked files useless quickly.
_VALIDITY = datetime.timedelta(days=1)
# Tolerate small clock differences between processes/containers.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class CertPaths:
    """Locations of the generated PEM files."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _subject_names(names: tuple[str, ...]) -> list[x509.GeneralName]:
    """``localhost``, ``127.0.0.1``, ``::1`` and ``names`` (host names or IP addresses) as SANs."""
    result: list[x509.GeneralName] = []
    for name in ("localhost", "127.0.0.1", "::1", *names):
        try:
            entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            entry = x509.DNSName(name)
        if entry not in result:
            result.append(entry)
    return result


def generate(directory: Path, names: tuple[str, ...] = ()) -> CertPaths:
    """Create ``ca.pem``, ``cert.pem`` and ``key.pem`` in ``directory``.

    The leaf is valid for ``localhost``, ``127.0.0.1`` and ``::1``, and for ``names``:
    a test that routes a provider's real host (``api.openai.com``) to the mock gives it
    here, so that clients with their default base URL verify the mock as that host. EC P-256
    keys are used because they are generated in milliseconds (RSA-2048 would
    noticeably slow down start-up, which must stay under a second).
    ``cert.pem`` holds the leaf followed by the CA so servers send the chain.
    """
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - _BACKDATE, now + _VALIDITY

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("mock-llm test CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(_subject_names(names)),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    paths = CertPaths(ca=directory / "ca.pem", cert=directory / "cert.pem", key=directory / "key.pem")
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    paths.ca.write_bytes(ca_pem)
    paths.cert.write_bytes(leaf_cert.public_bytes(serialization.Encoding.PEM) + ca_pem)
    paths.key.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths.key.chmod(0o600)
    return paths
