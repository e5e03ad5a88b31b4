# The engine version a replica runs, resolved by the control plane, and when a node's
# installed engines last changed (a crash loop's backoff starts afresh then).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0010_node_certificate"),
    ]

    operations = [
        migrations.AddField(
            model_name="replica",
            name="engine",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="replica",
            name="engine_version",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="node",
            name="engines_changed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
