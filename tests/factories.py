"""Small factories for test data; each returns a saved row."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group, User

from audit.actors import SystemActor
from catalog.models import Model, Profile
from catalog.permissions import ENGINE_ADMINS_GROUP, OPERATORS_GROUP
from catalog.tokens.actions import issue_api_token
from fleet.models import Node, Replica, Shard

# Who acts when a test sets the scene (applies a catalog, moves a replica on): as with
# llmgw's own parts, its Events name no one.
SETUP = SystemActor("test setup")


def make_user(
    username: str, *, operator: bool = False, superuser: bool = False, engine_admin: bool = False,
    playground: bool = False,
) -> User:  # fmt: skip
    user = User.objects.create_user(username, password="pw-" + username, is_superuser=superuser)
    groups = ([OPERATORS_GROUP] * operator + [ENGINE_ADMINS_GROUP] * engine_admin
              + [settings.PLAYGROUND_GROUP] * playground)  # fmt: skip
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


def api_token_of(user: User, lifetime: timedelta = timedelta(days=1)) -> str:
    """A REST API token for ``user`` (``Authorization: Token …``), as `llmgw_ctl` issues it."""
    return issue_api_token(user.username, lifetime=lifetime, actor=SETUP)[1]


def make_model(name: str = "gemma", source: str = "/models/gemma.gguf", **fields) -> Model:
    return Model.objects.create(name=name, source=source, **fields)


def make_profile(model: Model | None = None, name: str = "cpu", **fields) -> Profile:
    fields.setdefault("engine", "llama.cpp")
    return Profile.objects.create(model=model or make_model(), name=name, **fields)


def make_node(node_id: str = "node01", **fields) -> Node:
    return Node.objects.create(id=node_id, **fields)


def make_replica(profile: Profile | None = None, **fields) -> Replica:
    profile = profile or make_profile()
    fields.setdefault("fingerprint", profile.fingerprint())
    return Replica.objects.create(
        model_name=profile.model.name, profile_name=profile.name, profile=profile, **fields
    )


def make_shard(replica: Replica | None = None, rank: int = 0, **fields) -> Shard:
    fields.setdefault("id", Shard.new_id())
    return Shard.objects.create(replica=replica or make_replica(), rank=rank, **fields)
