"""The audit log: every transition and decision, with its reason and who asked for it."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class EventKind(models.TextChoices):
    NODE = "node"
    REPLICA = "replica"
    SHARD = "shard"
    CATALOG = "catalog"
    PLACEMENT = "placement"
    KEY = "key"
    TEAM = "team"  # a team made, changed or removed; a member's role; models opened to it
    # A sign-in (by password or through a provider), a refused one, a username and address
    # locked out, an account made at its first sign-in, a provider's roles at a sign-in.
    SIGN_IN = "sign-in"
    ROLE = "role"  # an account's fleet-wide roles: each group joined or left, the superuser flag


class Event(models.Model):
    """A transition or decision, with the reason a person can read."""

    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    subject = models.CharField(max_length=253, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    reason = models.TextField(blank=True)
    # The operator who asked; empty for what the system did by itself. The name is kept
    # beside the key so the log still says who after the account is deleted.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    actor_name = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        # The audit page and its exports read newest first, a page at a time, after an
        # (at, id) they were given (``audit.filters``): each filter of theirs that picks a
        # few rows of many has an index that hands them over in that order, so a page
        # costs its own rows, however long the log. The subject's own index (and its
        # pattern index) serves the prefix an object filter asks for.
        indexes = [
            models.Index(fields=["at", "id"], name="audit_event_at_id"),
            models.Index(fields=["kind", "at", "id"], name="audit_event_kind_at_id"),
            models.Index(fields=["actor_name", "at", "id"], name="audit_event_actor_at_id"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}: {self.from_state} -> {self.to_state}"

    @property
    def description(self) -> str:
        """The reason as a person reads it, naming who asked: "drained by olga"."""
        return f"{self.reason} by {self.actor_name}" if self.actor_name else self.reason
