"""The groups llmgw's permissions name (catalog/permissions.py), made once so that an
admin finds them in the admin's list and adds people, instead of typing a name."""

from django.db import migrations

# As named in catalog/permissions.py at the time of this migration.
GROUPS = ("operators", "engine-admin")


def create_groups(apps, schema_editor):
    group = apps.get_model("auth", "Group")
    for name in GROUPS:
        group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("catalog", "0006_model_file_shape"),
    ]

    # Kept when migrating back: people may have been added to them since.
    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
