"""The node's certificate and key (``tls: {cert, key}`` in the agent file), the proof of
possession a link answers the control plane's challenge with, and the CA (``tls: ca``) a
control plane's own proof is checked against."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from protocol.signing import proof_payload

if TYPE_CHECKING:
    from agent_worker.config import AgentConfig


class NodeIdentity:
    def __init__(self, cert_file: str, key_file: str, ca_file: str = "") -> None:
        self.cert_pem = Path(cert_file).read_bytes()
        # Without it no control plane can prove itself, and the agent takes no command key.
        self.ca_pem = Path(ca_file).read_bytes() if ca_file else b""
        key = serialization.load_pem_private_key(Path(key_file).read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_file} is not the EC key of an llmgw node certificate")
        self._key = key

    @property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        """What secrets sealed to this node's certificate open with (protocol.signing)."""
        return self._key

    def proof(self, nonce: str, node_id: str) -> dict[str, str]:
        signature = self._key.sign(proof_payload(nonce, node_id), ec.ECDSA(hashes.SHA256()))
        return {
            "type": "proof",
            "node": node_id,
            "certificate": self.cert_pem.decode(),
            "signature": base64.b64encode(signature).decode(),
        }


def node_identity(config: AgentConfig) -> NodeIdentity | None:
    """The node certificate, when the agent file names one: the link then proves the
    node by it, answering the control plane's challenge."""
    if not (config.cert_file and config.key_file):
        return None
    return NodeIdentity(config.cert_file, config.key_file, config.ca_file)


def link_ssl_context(config: AgentConfig) -> ssl.SSLContext | None:
    if not any(s.startswith(("wss://", "https://")) for s in config.servers):
        return None
    context = ssl.create_default_context(cafile=config.ca_file or None)
    if config.cert_file:  # for a TLS front that asks for client certificates too
        context.load_cert_chain(config.cert_file, config.key_file or None)
    return context
