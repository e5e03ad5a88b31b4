import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Event",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField(auto_now_add=True, db_index=True)),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("node", "Node"),
                            ("replica", "Replica"),
                            ("shard", "Shard"),
                            ("catalog", "Catalog"),
                            ("placement", "Placement"),
                            ("key", "Key"),
                        ],
                        max_length=16,
                    ),
                ),
                ("subject", models.CharField(db_index=True, max_length=253)),
                ("from_state", models.CharField(blank=True, max_length=16)),
                ("to_state", models.CharField(blank=True, max_length=16)),
                ("reason", models.TextField(blank=True)),
                ("actor_name", models.CharField(blank=True, max_length=150)),
                (
                    "actor",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"ordering": ["-at", "-id"]},
        ),
    ]
