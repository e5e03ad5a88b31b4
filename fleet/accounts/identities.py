"""Who signs in through the provider: its accounts, and the llmgw users they are."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ProviderIdentity(models.Model):
    """An account at an OpenID Connect provider, and the llmgw user it signs in as.

    Matched by the provider's issuer and subject only, never by e-mail or user name: both
    can be chosen or reused at many providers, and matching on them would let a person
    there take over a local account here (the admin's included).
    """

    issuer = models.CharField(max_length=400)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="provider_identities"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_identity")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
