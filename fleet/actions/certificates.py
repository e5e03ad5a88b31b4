"""Verbs on node certificates: issue one (recorded, so it can be revoked) and revoke every
certificate of a node. Each records an Event naming who did it: who may link is as much
the fleet's history as who drained what."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from fleet.models import Node, NodeCertificate
from fleet.pki.authority import Issued, sign_node_certificate
from fleet.pki.broker_users import delete_node_user
from fleet.pki.revocation import announce_revoked
from fleet.pki.verify import check_link_proof


def issue_node_certificate(
    node_id: str,
    days: int = 365,
    *,
    actor: Actor,
    directory: Path | None = None,
    now: dt.datetime | None = None,
    broker_password_sha256: str = "",
) -> Issued:
    """A client certificate for ``node_id`` from llmgw's CA, recorded for revocation, with
    the SHA-256 of the node's broker password its broker user is made with."""
    issued = sign_node_certificate(node_id, days, directory, now)
    with transaction.atomic():
        NodeCertificate.objects.create(
            serial=str(issued.serial),
            node_id=node_id,
            not_after=issued.not_after,
            broker_password_sha256=broker_password_sha256,
            certificate_pem=issued.cert_pem.decode(),
        )
        record_event(
            EventKind.NODE,
            node_id,
            f"certificate {issued.serial} issued, valid until {issued.not_after:%Y-%m-%d}",
            actor=actor,
        )
    return issued


def revoke_node_certificates(node_id: str, *, actor: Actor) -> int:
    """Revoke every certificate issued to ``node_id``, and with them its token; how many
    certificates were still valid.

    Every control plane refuses them from the next link on, and the one holding the node's
    link closes it once this commits; its broker user is deleted then too. Commands signed
    from now on use a key the revoked certificate never derived, and its next certificate
    brings another.
    """
    with transaction.atomic():
        revoked = NodeCertificate.objects.filter(node_id=node_id, revoked_at=None).update(
            revoked_at=timezone.now()
        )
        if revoked:
            Node.objects.filter(id=node_id).update(key_generation="")
            record_event(EventKind.NODE, node_id, f"revoked {revoked} certificate(s)", actor=actor)
            transaction.on_commit(lambda: announce_revoked(node_id))
            transaction.on_commit(lambda: delete_node_user(node_id))
    return revoked


def renew_broker_password(node_id: str, sha256: str, *, actor: Actor) -> bool:
    """Give the newest unrevoked certificate of ``node_id`` a new broker password's SHA-256
    (``onboard --reuse`` keeps the certificate and renews the password); False if none."""
    with transaction.atomic():
        newest = (
            NodeCertificate.objects.select_for_update()
            .filter(node_id=node_id, revoked_at=None)
            .order_by("-issued_at")
            .first()
        )
        if newest is None:
            return False
        newest.broker_password_sha256 = sha256
        newest.save(update_fields=["broker_password_sha256"])
        record_event(EventKind.NODE, node_id, "broker password renewed", actor=actor)
    return True


def link_proven(
    cert_pem: bytes, claimed_id: str, nonce: str, signature: bytes, *, actor: Actor
) -> int:
    """Check a link's proof (``check_link_proof``) and keep the certificate it proved, if
    its row has none yet (issued before certificates were kept): secrets are sealed to it.
    The serial of that certificate."""
    serial = check_link_proof(cert_pem, claimed_id, nonce, signature)
    with transaction.atomic():
        kept = NodeCertificate.objects.filter(serial=str(serial), certificate_pem="").update(
            certificate_pem=cert_pem.decode()
        )
        if kept:
            record_event(EventKind.NODE, claimed_id,
                         f"certificate {serial} kept from its first link", actor=actor)  # fmt: skip
    return serial
