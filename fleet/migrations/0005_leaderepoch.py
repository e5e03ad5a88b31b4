from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0004_replica_draining_since"),
    ]

    operations = [
        migrations.CreateModel(
            name="LeaderEpoch",
            fields=[
                ("lease_key", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("highest", models.BigIntegerField(default=0)),
            ],
        ),
    ]
