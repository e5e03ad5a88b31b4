from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0005_leaderepoch"),
        ("audit", "0002_events_from_fleet"),
    ]

    operations = [migrations.DeleteModel(name="Event")]
