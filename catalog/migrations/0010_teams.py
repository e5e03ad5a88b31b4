"""Teams (issue 43): every key belongs to one, and the keys made before teams move to
``default``, which has no budgets, no cap and every model open to it: each key keeps
exactly the limits and models it had."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# As catalog.teams.DEFAULT_TEAM names it at the time of this migration.
DEFAULT_TEAM = "default"


def keys_to_the_default_team(apps, schema_editor):
    team_model = apps.get_model("catalog", "Team")
    team, _made = team_model.objects.get_or_create(name=DEFAULT_TEAM)
    apps.get_model("catalog", "ApiKey").objects.filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0009_playground_keys"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Team",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.SlugField(max_length=64, unique=True)),
                ("description", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("requests_per_minute", models.PositiveIntegerField(blank=True, null=True)),
                ("tokens_per_minute", models.PositiveIntegerField(blank=True, null=True)),
                ("tokens_per_day", models.PositiveBigIntegerField(blank=True, null=True)),
                ("tokens_per_month", models.PositiveBigIntegerField(blank=True, null=True)),
                ("concurrency", models.PositiveIntegerField(blank=True, null=True)),
                ("key_cap", models.JSONField(blank=True, default=dict)),
            ],
            options={
                "ordering": ["name"],
            },
        ),
        migrations.AddField(
            model_name="apikey",
            name="member",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="member_keys",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="apikey",
            name="team",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="api_keys",
                to="catalog.team",
            ),
        ),
        migrations.AddField(
            model_name="model",
            name="teams",
            field=models.ManyToManyField(blank=True, related_name="models", to="catalog.team"),
        ),
        migrations.CreateModel(
            name="Membership",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "role",
                    models.CharField(
                        choices=[("viewer", "Viewer"), ("member", "Member"), ("lead", "Lead")],
                        default="member",
                        max_length=8,
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="team_memberships",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "team",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="memberships",
                        to="catalog.team",
                    ),
                ),
            ],
            options={
                "ordering": ["team__name", "user__username"],
                "constraints": [
                    models.UniqueConstraint(fields=("team", "user"), name="catalog_membership_once")
                ],
            },
        ),
        # Back: the keys lose their team (the column goes), nothing else to undo.
        migrations.RunPython(keys_to_the_default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apikey",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="api_keys",
                to="catalog.team",
            ),
        ),
    ]
