"""The playground's keys belong to an account (one live key each), and the group that may
use the playground (``LLMGW_PLAYGROUND_GROUP``, ``playground`` by default) is made once, so
an admin finds it in the admin's list and adds people."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# As settings.PLAYGROUND_GROUP defaults at the time of this migration.
GROUP = "playground"


def create_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.get_or_create(name=GROUP)


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("catalog", "0008_hashed_api_tokens"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="playground_keys",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        # Kept when migrating back: people may have been added to it since.
        migrations.RunPython(create_group, migrations.RunPython.noop),
    ]
