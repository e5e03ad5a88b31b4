"""``manage.py llmgw_admin``: create the user ``admin``, or give it a new password.

``llmgw up`` runs it once per home with the password in LLMGW_ADMIN_PASSWORD: never on a
command line, where every user of the machine could read it in the process list.
"""

from __future__ import annotations

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

ADMIN_USERNAME = "admin"
PASSWORD_VARIABLE = "LLMGW_ADMIN_PASSWORD"  # noqa: S105 (the variable's name, not a password)


class Command(BaseCommand):
    help = f"Create the superuser {ADMIN_USERNAME!r}, or set its password from ${PASSWORD_VARIABLE}"

    def handle(self, *args, **options) -> None:
        password = os.environ.get(PASSWORD_VARIABLE, "")
        if not password:
            raise CommandError(
                f"set {PASSWORD_VARIABLE} to the password for {ADMIN_USERNAME!r}; "
                "it is never taken from the command line"
            )
        user, _created = get_user_model()._default_manager.get_or_create(
            username=ADMIN_USERNAME, defaults={"is_staff": True, "is_superuser": True}
        )
        user.set_password(password)
        user.save()
