"""What the control plane derives from its fleet key: node command keys, replica secrets.

The fleet key (``LLMGW_FLEET_KEY``, else ``fleet_key`` under the home) is the control
plane's alone; SECRET_KEY, which every Django process loads, derives none of them, and the
router, which reads replica secrets from its routing snapshot, holds neither.

A node's command key follows the generation of its link: the serial of the certificate it
linked with, so the next certificate (after a revocation) brings a key the old one's holder
cannot derive. The node learns it from the link's signed "linked" answer.
"""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

# The generation of a link proven by token: ``token``, then ``token@<when>`` once the node
# has had a certificate revoked (fleet.pki.revocation), so a revocation rotates it too.
TOKEN_GENERATION = "token"  # noqa: S105 (a label, not a secret)
REPLICA_SECRET_LENGTH = 48


def fleet_hmac(purpose: str, *parts: str) -> str:
    """An HMAC of ``parts`` under the fleet key, kept apart by ``purpose``."""
    message = "\n".join((purpose, *parts)).encode()
    return hmac.new(settings.LLMGW_FLEET_KEY.encode(), message, hashlib.sha256).hexdigest()


def command_key(node_id: str, generation: str) -> str:
    """The key commands to ``node_id`` are signed with, on a link of ``generation``."""
    return fleet_hmac("llmgw.command-key", node_id, generation)


def replica_secret(replica_id: object) -> str:
    """The engine secret of a replica: unguessable without the fleet key, and derived from
    its id so that a node reporting a replica the database does not know cannot have chosen
    a secret the control plane would take for its own."""
    return fleet_hmac("llmgw.replica-secret", str(replica_id))[:REPLICA_SECRET_LENGTH]
