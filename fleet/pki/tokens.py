"""How a node proves who it is on the link by token (its command key is ``keys``').

The token is ``<node id>.<signature>``, signed with a key derived from SECRET_KEY,
so the control plane checks it without a database lookup and a node cannot claim
another's id. ``llmgw_ctl node-token NODE`` prints one for an agent's configuration.
"""

from __future__ import annotations

import hmac

from django.utils.crypto import salted_hmac

SALT = "llmgw.node-token"


def node_token(node_id: str) -> str:
    return f"{node_id}.{_signature(node_id)}"


def _signature(node_id: str) -> str:
    return salted_hmac(SALT, node_id, algorithm="sha256").hexdigest()


def verify_node_token(token: str) -> str | None:
    """The node id a token was issued to, or None if it is not one of ours."""
    node_id, _, signature = token.rpartition(".")
    if not node_id or not hmac.compare_digest(signature, _signature(node_id)):
        return None
    return node_id
