"""The checks a link makes of a node's certificate: issued by llmgw's CA to that very node,
within its dates, not revoked (revoked serials live in the database, so every control
plane sees a revocation at once), and held by whoever signs the link's nonce."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.utils import timezone

from fleet.models import NodeCertificate
from fleet.pki.authority import PkiError, load_ca_certificate
from protocol.signing import proof_payload


class CertificateRefused(PkiError):
    """A node certificate the link must refuse; ``str()`` is the reason both sides log."""


def check_node_certificate(
    cert_pem: bytes, claimed_id: str, now: dt.datetime | None = None, directory: Path | None = None
) -> x509.Certificate:
    """Accept the certificate of ``claimed_id`` only if llmgw's CA issued it to that very
    node, it is within its dates and not revoked; else say exactly which it is not."""
    ca_cert = load_ca_certificate(directory)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise CertificateRefused("the node sent something that is not a PEM certificate") from None
    issuer = cert.issuer.rfc4514_string()
    if cert.issuer != ca_cert.subject:
        raise CertificateRefused(f"certificate issued by {issuer}, not by llmgw's CA")
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateRefused(
            f"certificate claims {issuer} as issuer but is not signed by this llmgw CA"
        ) from None
    now = now or timezone.now()
    if now > cert.not_valid_after_utc:
        raise CertificateRefused(
            f"certificate expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
            f"issue a new one with llmgw_ctl onboard {claimed_id}"
        )
    if now < cert.not_valid_before_utc:
        raise CertificateRefused(
            f"certificate is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    owner = str(names[0].value) if names else ""
    if owner != claimed_id:
        raise CertificateRefused(
            f"the agent claims node {claimed_id!r} with the certificate of node {owner!r}"
        )
    serial = cert.serial_number
    record = NodeCertificate.objects.filter(serial=str(serial)).first()
    if record is None:
        raise CertificateRefused(
            f"the certificate of node {claimed_id} (serial {serial}) is not one this llmgw issued"
        )
    if record.revoked_at is not None:
        raise CertificateRefused(
            f"the certificate of node {claimed_id} (serial {serial}) was revoked on "
            f"{record.revoked_at:%Y-%m-%d %H:%M} UTC"
        )
    return cert


def still_good(cert_path: Path, node_id: str, margin: dt.timedelta = dt.timedelta(days=30)) -> bool:
    """Whether a node's certificate file would still link, and for ``margin`` more."""
    try:
        check_node_certificate(cert_path.read_bytes(), node_id, timezone.now() + margin)
    except (OSError, PkiError):
        return False
    return True


def check_link_proof(cert_pem: bytes, claimed_id: str, nonce: str, signature: bytes) -> int:
    """Accept a link only from the holder of the node's own, valid certificate's key;
    return that certificate's serial."""
    cert = check_node_certificate(cert_pem, claimed_id)
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise CertificateRefused("the node's certificate does not hold an EC key")
    try:
        key.verify(signature, proof_payload(nonce, claimed_id), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise CertificateRefused(
            f"the agent claiming {claimed_id!r} holds that node's certificate but not its key"
        ) from None
    return cert.serial_number
