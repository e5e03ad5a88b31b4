"""Who is revoked, as the link must know it: at link time, and for links already open.

The database is the truth (``NodeCertificate.revoked_at``). A certificate link stands
while its serial is not revoked. A node id is revoked for token links while its newest
certificate is: ``ca revoke NODE`` shuts its token out too, and onboarding it again (a new
certificate) lets it back in. ``ca revoke`` also publishes the node's id on
``REVOKED_CHANNEL``, so the process holding its link closes it at once; a notice is only a
hint to look (anything that can publish on Redis could send one), never a revocation.
"""

from __future__ import annotations

import logging

from audit.redis import redis_client
from core.redis_clients import channel_on
from fleet.models import NodeCertificate
from fleet.pki.keys import TOKEN_GENERATION

log = logging.getLogger("llmgw.fleet.pki")

REVOKED_CHANNEL = "llmgw:links:revoked"


def announce_revoked(node_id: str) -> None:
    """Tell every link process that ``node_id`` was revoked; never raises (each process also
    looks again on its own, so a notice lost while Redis is away costs seconds, not safety)."""
    try:
        client = redis_client()
        client.publish(channel_on(client, REVOKED_CHANNEL), node_id)
    except Exception as exc:
        log.warning("could not tell the link processes that %s was revoked: %s", node_id, exc)


def token_generation(node_id: str) -> str | None:
    """The generation a token link of ``node_id`` gets (what its command key derives from),
    or None while the node is revoked. It changes with each revocation, so a node let back
    in after one gets a key its revoked self never held."""
    newest = NodeCertificate.objects.filter(node_id=node_id).order_by("-issued_at").first()
    if newest is not None and newest.revoked_at is not None:
        return None
    last = (
        NodeCertificate.objects.filter(node_id=node_id, revoked_at__isnull=False)
        .order_by("-revoked_at")
        .values_list("revoked_at", flat=True)
        .first()
    )
    return TOKEN_GENERATION if last is None else f"{TOKEN_GENERATION}@{last:%Y%m%dT%H%M%S.%f}"


def is_token_generation(generation: str) -> bool:
    return generation.startswith(TOKEN_GENERATION)


def revoked_links(links: dict[str, set[str]]) -> dict[str, set[str]]:
    """Of open links (node id -> the generations its links are on), those revoked since they
    linked, the same way. Two queries, whatever the number of links."""
    serials = {
        g for generations in links.values() for g in generations if not is_token_generation(g)
    }
    revoked_serials = set(
        NodeCertificate.objects.filter(serial__in=serials, revoked_at__isnull=False)
        .values_list("serial", flat=True)
    )  # fmt: skip
    by_token = [node for node, generations in links.items()
                if any(is_token_generation(g) for g in generations)]  # fmt: skip
    newest = (
        NodeCertificate.objects.filter(node_id__in=by_token)
        .order_by("node_id", "-issued_at")
        .distinct("node_id")
    )
    revoked_nodes = {cert.node_id for cert in newest if cert.revoked_at is not None}
    revoked: dict[str, set[str]] = {}
    for node, generations in links.items():
        gone = {g for g in generations if g in revoked_serials
                or (is_token_generation(g) and node in revoked_nodes)}  # fmt: skip
        if gone:
            revoked[node] = gone
    return revoked
