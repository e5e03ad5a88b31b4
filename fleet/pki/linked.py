"""The control plane's proof on its "linked" answer, so the agent knows whom it linked to
before it takes a command key from the answer (``agent_worker.control_plane_proof`` checks
it). Over the agent's own nonce for the link: an answer recorded on one link proves nothing
on another."""

from __future__ import annotations

import base64
import functools

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fleet.pki.authority import PkiError, link_signer
from protocol.signing import linked_hmac, linked_payload


def prove_linked(
    nonce: str, node_id: str, command_key: str, epoch: int, *, token: str = ""
) -> dict[str, str]:
    """To a node linked by ``token``, an HMAC with it; to one linked by certificate, a
    signature by the CA's control-plane certificate (``authority.link_signer``)."""
    payload = linked_payload(nonce, node_id, command_key, epoch)
    if token:
        return {"hmac": linked_hmac(token, payload)}
    cert_pem, key_pem = link_signer()
    signature = _key(key_pem).sign(payload, ec.ECDSA(hashes.SHA256()))
    return {"certificate": cert_pem.decode(), "signature": base64.b64encode(signature).decode()}


@functools.lru_cache(maxsize=4)
def _key(key_pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(key_pem, None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError("the control plane's link signer does not hold an EC key")
    return key
