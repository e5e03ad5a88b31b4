"""Events of kind team (issue 43)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0003_sign_in_kind"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="kind",
            field=models.CharField(
                choices=[
                    ("node", "Node"),
                    ("replica", "Replica"),
                    ("shard", "Shard"),
                    ("catalog", "Catalog"),
                    ("placement", "Placement"),
                    ("key", "Key"),
                    ("team", "Team"),
                    ("sign-in", "Sign In"),
                ],
                max_length=16,
            ),
        ),
    ]
