"""REST API tokens stored hashed, with an expiry (catalog/tokens/), and DRF's
plaintext tokens (``authtoken_token``) moved into them: each keeps working, sent as before,
until it expires a quarter from this migration, and the plaintext rows are deleted."""

import hashlib
from datetime import timedelta

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

# As in catalog/tokens/stored.py and settings.API_TOKEN_LIFETIME_DAYS at the time of this
# migration: a migration does not follow later changes to either.
PREFIX_LENGTH = 15
MOVED_TOKENS_LAST = timedelta(days=90)


def hash_drf_tokens(apps, schema_editor):
    """Move DRF's tokens, if its table is there (it was while ``rest_framework.authtoken``
    was installed), into the hashed table; then delete the plaintext."""
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    api_token = apps.get_model("catalog", "ApiToken")
    expires_at = timezone.now() + MOVED_TOKENS_LAST
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id FROM authtoken_token")
        for key, user_id in cursor.fetchall():
            api_token.objects.get_or_create(
                hashed_token=hashlib.sha256(key.encode()).hexdigest(),
                defaults={"user_id": user_id, "prefix": key[:PREFIX_LENGTH],
                          "expires_at": expires_at},
            )  # fmt: skip
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("catalog", "0007_permission_groups"),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "prefix",
                    models.CharField(help_text="shown to identify it", max_length=16, unique=True),
                ),
                ("hashed_token", models.CharField(max_length=64, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("expires_at", models.DateTimeField(help_text="refused from then on")),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="api_tokens",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name": "API token",
                "ordering": ["-created_at"],
            },
        ),
        # Not undone: the plaintext is gone, and a hashed token cannot be turned back.
        migrations.RunPython(hash_drf_tokens, migrations.RunPython.noop),
    ]
