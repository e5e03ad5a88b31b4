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
    SIGN_IN = "sign-in"  # lockouts; sign-ins through a provider, refused or not, and their roles


class Event(models.Model):
    """A transition or decision, with the reason a person can read."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
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

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}: {self.from_state} -> {self.to_state}"

    @property
    def description(self) -> str:
        """The reason as a person reads it, naming who asked: "drained by olga"."""
        return f"{self.reason} by {self.actor_name}" if self.actor_name else self.reason
