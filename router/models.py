"""What the router writes: usage per key, model and hour (in batches, see usage/accounting.py)."""

from __future__ import annotations

from django.db import models


class Usage(models.Model):
    """Requests and tokens one API key spent on one model in one hour."""

    hour = models.DateTimeField(help_text="start of the hour, UTC")
    # The key's prefix identifies it even after the key row is deleted; "" without auth.
    key_prefix = models.CharField(max_length=16, blank=True)
    key_name = models.CharField(max_length=128, blank=True)
    model = models.CharField(max_length=128)
    requests = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    # Of prompt_tokens (the whole prompt is charged), what the engine read from its cache.
    cached_prompt_tokens = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        db_table = "router_usage"
        ordering = ["-hour", "key_name", "model"]
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "key_prefix", "model"], name="router_usage_unique_slot"
            )
        ]

    def __str__(self) -> str:
        return f"{self.key_name or self.key_prefix or 'anonymous'} {self.model} {self.hour}"
