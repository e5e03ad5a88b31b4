"""llmgw's own certificate authority: its key and certificate, node certificates (CN and
DNS name = the node id) and the control plane's serving certificate. Issuing and revoking
a node's are verbs (``fleet.actions.certificates``): they record the serials and an Event;
what a link checks of a certificate is ``fleet.pki.verify``.

All of it with ``cryptography``; nothing shells out to openssl.
"""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.conf import settings
from django.utils import timezone

from core.secret_files import write_secret_file

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
CA_NAME = "llmgw CA"
CA_DAYS = 3650
# The certificate and key (one file, 0600) control planes sign their "linked" answers with.
LINK_SIGNER = "link-signer.pem"
LINK_SIGNER_NAME = "llmgw control plane"
_KEY_BEGIN = b"-----BEGIN PRIVATE KEY-----"


class PkiError(Exception):
    """A certificate operation that cannot be done, saying why and what to do."""


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes
    serial: int
    not_after: dt.datetime


def ca_dir() -> Path:
    return Path(settings.LLMGW_CA_DIR)


def init_ca(directory: Path | None = None, force: bool = False) -> Path:
    """Create the CA's key (0600) and certificate; refuse to replace one without ``force``."""
    directory = directory or ca_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() or key_path.exists():
        if not force:
            raise PkiError(
                f"a CA already exists in {directory}; every node certificate it issued would "
                "stop linking if it were replaced. Pass --force to replace it anyway"
            )
        cert_path.unlink(missing_ok=True)
        key_path.unlink(missing_ok=True)
        (directory / LINK_SIGNER).unlink(missing_ok=True)  # the old CA's: agents would refuse it
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    now = timezone.now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    write_secret_file(key_path, _key_pem(key).decode())
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return directory


def load_ca(directory: Path | None = None) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    directory = directory or ca_dir()
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
    except FileNotFoundError:
        raise PkiError(f"no CA in {directory}: run llmgw_ctl ca init first") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{directory / CA_KEY} is not the EC key llmgw's CA uses")
    return cert, key


def load_ca_certificate(directory: Path | None = None) -> x509.Certificate:
    """The CA's certificate alone, which is all that checking a node's needs: read once per
    process (and again when the file changes), so a forged proof costs no file read."""
    path = (directory or ca_dir()) / CA_CERT
    try:
        changed = path.stat().st_mtime_ns
    except FileNotFoundError:
        raise PkiError(f"no CA in {path.parent}: run llmgw_ctl ca init first") from None
    return _read_certificate(path, changed)


@functools.lru_cache(maxsize=8)
def _read_certificate(path: Path, _changed: int) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def link_signer(directory: Path | None = None) -> tuple[bytes, bytes]:
    """The certificate and key (PEM) a control plane signs its "linked" answers with, so an
    agent knows that whoever gave it a command key holds one from its fleet's CA.

    Issued by the CA for that purpose alone (server authentication, which no node
    certificate has, so a node cannot sign for a control plane) on first use, and kept
    0600 beside the CA: every process that shares the CA's directory signs alike.
    """
    directory = directory or ca_dir()
    path = directory / LINK_SIGNER
    if not path.exists():
        issued = _issue([x509.DNSName("llmgw-control-plane")], LINK_SIGNER_NAME,
                        ExtendedKeyUsageOID.SERVER_AUTH, CA_DAYS, directory, None)  # fmt: skip
        # Of two processes making it at once, the first to write wins and both use its.
        write_secret_file(path, (issued.cert_pem + issued.key_pem).decode())
    return _read_signer(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_signer(path: Path, _changed: int) -> tuple[bytes, bytes]:
    data = path.read_bytes()
    split = data.index(_KEY_BEGIN)
    return data[:split], data[split:]


def ca_pem(directory: Path | None = None) -> bytes:
    return load_ca(directory)[0].public_bytes(serialization.Encoding.PEM)


def sign_node_certificate(
    node_id: str, days: int = 365, directory: Path | None = None, now: dt.datetime | None = None
) -> Issued:
    """A client certificate for ``node_id`` (its CN and DNS name), signed but not yet
    recorded: ``fleet.actions.certificates.issue_node_certificate`` records it."""
    if days < 1:
        raise PkiError(f"--days must be at least 1, not {days}")
    return _issue([x509.DNSName(node_id)], node_id, ExtendedKeyUsageOID.CLIENT_AUTH, days,
                  directory, now)  # fmt: skip


def issue_server_certificate(hosts: list[str], days: int = 365) -> Issued:
    """The control plane's serving certificate, for every name and address it answers on."""
    if not hosts:
        raise PkiError("name the hosts the control plane answers on: ca server-cert HOST…")
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return _issue(names, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, days, None, None)


def _issue(
    names: list[x509.GeneralName],
    common_name: str,
    purpose: x509.ObjectIdentifier,
    days: int,
    directory: Path | None,
    now: dt.datetime | None,
) -> Issued:
    ca_cert, ca_key = load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or timezone.now()
    not_after = now + dt.timedelta(days=days)
    serial = x509.random_serial_number()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), serial, not_after)


def _usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=not cert_sign, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
