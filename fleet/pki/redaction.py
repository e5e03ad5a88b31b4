"""The replica secrets readers must not see in what engines print.

An engine may print its own secret: vLLM's argument dump before its redaction fix,
SGLang's ``server_args``, llama-server with ``-v``. Every line of engine output that
reaches a page, the API or ``llmgw_ctl`` (a failed shard's last lines, a node's log
lines) passes through here first; the secret never leaves the control plane in them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from fleet.models import Replica, Shard

REDACTED = "[replica secret]"


def without_secrets(lines: Iterable[str], secrets: Iterable[str]) -> list[str]:
    """``lines`` with every occurrence of each of ``secrets`` replaced by REDACTED."""
    found = sorted({secret for secret in secrets if secret}, key=len, reverse=True)
    kept = []
    for line in lines:
        for secret in found:
            line = line.replace(secret, REDACTED)
        kept.append(line)
    return kept


def replica_secrets(*, replica_id: uuid.UUID | str | None = None, node_id: str = "") -> list[str]:
    """The secret of one replica, or those of every replica with a shard on a node."""
    replicas = Replica.objects.all()
    if replica_id is not None:
        replicas = replicas.filter(id=replica_id)
    if node_id:
        replicas = replicas.filter(
            id__in=Shard.objects.filter(node_id=node_id).values("replica_id")
        )
    return [secret for secret in replicas.values_list("secret", flat=True) if secret]
