"""Make the test provider's database: its tables, its users and groups, and llmgw as its
client. Run before the server, with the same environment: ``python -m
tests.oidc_provider.prepare SPEC.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import django


def main(spec_path: str) -> None:
    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    spec = json.loads(Path(spec_path).read_text())
    call_command("migrate", verbosity=0)
    for person in spec["users"]:
        user = User.objects.create_user(
            person["username"], email=person["email"], password=person["password"]
        )
        for name in person["groups"]:
            user.groups.add(Group.objects.get_or_create(name=name)[0])
    client = spec["client"]
    Application.objects.create(
        name="llmgw",
        client_id=client["id"],
        client_secret=client["secret"],  # hashed on save
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(client["redirect_uris"]),
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )


if __name__ == "__main__":
    main(sys.argv[1])
