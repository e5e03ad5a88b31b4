"""Bring the fleet's Event rows into the audit log, keeping their ids and times.

"by NAME" at the end of an operator's reason becomes the actor's name (the account, if
it still exists, becomes the actor)."""

import re

from django.db import migrations

BY_NAME = re.compile(r"^(?P<reason>.*) by (?P<name>[\w.@+-]+)$", re.S)


def copy_events(apps, schema_editor):
    old = apps.get_model("fleet", "Event")
    new = apps.get_model("audit", "Event")
    users = {u.username: u for u in apps.get_model("auth", "User").objects.all()}
    rows = []
    for event in old.objects.order_by("id").iterator():
        reason, actor_name = event.reason, ""
        match = BY_NAME.match(reason)
        if match and match.group("name") in users:
            reason, actor_name = match.group("reason"), match.group("name")
        rows.append(
            new(
                id=event.id, kind=event.kind, subject=event.subject,
                from_state=event.from_state, to_state=event.to_state, reason=reason,
                actor=users.get(actor_name), actor_name=actor_name,
            )
        )  # fmt: skip
    new.objects.bulk_create(rows, batch_size=1000)
    # auto_now_add would stamp every row with now; keep when each happened.
    for event in old.objects.only("id", "at").iterator():
        new.objects.filter(id=event.id).update(at=event.at)
    if rows:
        # Rows came with their ids: move the sequence past them.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence('audit_event', 'id'), "
                "(SELECT MAX(id) FROM audit_event))"
            )


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0001_initial"),
        ("fleet", "0005_leaderepoch"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(copy_events, migrations.RunPython.noop)]
