from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0004_profile_concurrency_and_autoscale"),
    ]

    operations = [
        migrations.AddField(
            model_name="profile",
            name="serves",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
