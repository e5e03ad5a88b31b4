"""Whom the agent linked to: the proof on the control plane's "linked" answer.

The answer tells the agent its command key, the key it checks every command with before
obeying it as root; so it is taken only from a control plane that proves itself, over
the nonce the agent chose for this link:

- linked by token: an HMAC with the node's token, which only the control plane that
  issued it (and the node) can make;
- linked by certificate: a signature by a certificate the node's own CA (its bundle's
  ``ca.pem``) issued for server authentication, which no node certificate carries, so a
  node of the same fleet cannot pose as the control plane to the others.
"""

from __future__ import annotations

import base64
import datetime as dt
import hmac

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from protocol.signing import linked_hmac, linked_payload


class LinkedAnswerRefused(Exception):
    """A "linked" answer whose sender did not prove itself; ``str()`` says why."""


def check_linked_answer(
    answer: dict,
    nonce: str,
    node_id: str,
    *,
    token: str = "",
    ca_pem: bytes | None = None,
    now: dt.datetime | None = None,
) -> str:
    """The command key ``answer`` carries, once its proof holds; else LinkedAnswerRefused."""
    key = str(answer.get("command_key") or "")
    epoch = answer.get("epoch") or 0
    payload = linked_payload(nonce, node_id, key, epoch if isinstance(epoch, int) else 0)
    proof = answer.get("proof")
    if not isinstance(proof, dict) or not proof:
        raise LinkedAnswerRefused("its answer carries no proof of who sent it")
    if "certificate" in proof:
        _check_signature(proof, payload, ca_pem, now or dt.datetime.now(dt.UTC))
    elif "hmac" in proof:
        if not token:
            raise LinkedAnswerRefused(
                "it proved itself with a token, and this node links by certificate"
            )
        if not hmac.compare_digest(str(proof["hmac"]), linked_hmac(token, payload)):
            raise LinkedAnswerRefused("its signature does not match this node's token")
    else:
        raise LinkedAnswerRefused(f"its proof is of no kind this agent knows ({sorted(proof)})")
    return key


def _check_signature(proof: dict, payload: bytes, ca_pem: bytes | None, now: dt.datetime) -> None:
    if not ca_pem:
        raise LinkedAnswerRefused(
            "this agent has no CA certificate to check it against (tls: ca: in the agent file)"
        )
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
        signer = x509.load_pem_x509_certificate(str(proof["certificate"]).encode())
        signature = base64.b64decode(str(proof.get("signature", "")), validate=True)
    except (ValueError, TypeError):
        raise LinkedAnswerRefused("its proof holds no readable certificate and signature") from None
    try:
        signer.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise LinkedAnswerRefused(
            f"its certificate ({signer.subject.rfc4514_string()}) is not signed by this node's "
            "llmgw CA"
        ) from None
    if not signer.not_valid_before_utc <= now <= signer.not_valid_after_utc:
        raise LinkedAnswerRefused(
            f"its certificate is valid from {signer.not_valid_before_utc:%Y-%m-%d} to "
            f"{signer.not_valid_after_utc:%Y-%m-%d} only"
        )
    if not _for_servers(signer):
        raise LinkedAnswerRefused(
            f"its certificate ({signer.subject.rfc4514_string()}) is not a control plane's: "
            "it is not issued for server authentication"
        )
    key = signer.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise LinkedAnswerRefused("its certificate does not hold an EC key")
    try:
        key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise LinkedAnswerRefused(
            "its signature does not match its certificate and this link's nonce"
        ) from None


def _for_servers(cert: x509.Certificate) -> bool:
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return ExtendedKeyUsageOID.SERVER_AUTH in usage and ExtendedKeyUsageOID.CLIENT_AUTH not in usage
