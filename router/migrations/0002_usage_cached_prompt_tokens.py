"""The part of a usage row's prompt tokens the engine read from its prompt cache: the
whole prompt is charged (prompt_tokens), and the cached part is kept beside it. A default
in the database too, so a router not yet upgraded still adds its rows."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("router", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="usage",
            name="cached_prompt_tokens",
            field=models.BigIntegerField(default=0, db_default=0),
        ),
    ]
