"""Command keys and replica secrets move from SECRET_KEY to the fleet key.

Nodes learn their new command key when they next link (every agent relinks when the
upgraded control plane restarts). Replicas not yet placed get a secret from the fleet key
now; those already started keep theirs, which their engines were started with, until
they are replaced (docs/nodes.md, "Upgrading to the fleet key").
"""

import hashlib
import hmac

from django.conf import settings
from django.db import migrations, models


def _fleet_secret(replica_id) -> str:
    # fleet.pki.keys.replica_secret as it is at this migration.
    message = f"llmgw.replica-secret\n{replica_id}".encode()
    return hmac.new(settings.LLMGW_FLEET_KEY.encode(), message, hashlib.sha256).hexdigest()[:48]


def secrets_from_the_fleet_key(apps, schema_editor):
    Replica = apps.get_model("fleet", "Replica")
    for replica in Replica.objects.filter(state__in=["placing", "unplaceable"]).only("id"):
        Replica.objects.filter(id=replica.id).update(secret=_fleet_secret(replica.id))


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0011_replica_engine_version"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="key_generation",
            field=models.CharField(blank=True, max_length=80),
        ),
        migrations.RunPython(secrets_from_the_fleet_key, migrations.RunPython.noop),
    ]
