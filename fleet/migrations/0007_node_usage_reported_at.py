from django.db import migrations


class Migration(migrations.Migration):
    """Free the name ``usage_at`` for ``Node.usage_at(now)``: the usage if it is fresh."""

    dependencies = [
        ("fleet", "0006_event_moves_to_audit"),
    ]

    operations = [
        migrations.RenameField(
            model_name="node", old_name="usage_at", new_name="usage_reported_at"
        ),
    ]
