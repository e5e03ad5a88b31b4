"""REST endpoints for the catalog under /api/v1/."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.contrib.auth.models import User
from rest_framework import mixins, viewsets
from rest_framework import serializers as drf_serializers
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.response import Response

from catalog.actions.api_keys import UNCHANGED, create_key, revoke_key, update_key
from catalog.actions.entries import delete_row, save_entry, update_entry
from catalog.engine_admin import EngineAdminRequired
from catalog.keys import LIMIT_FIELDS, ApiKeyRefused
from catalog.models import ApiKey, Engine, Fabric, Membership, Model, Pool, Profile, Team
from catalog.permissions import is_operator
from catalog.serializers import (
    EngineSerializer,
    FabricSerializer,
    ModelSerializer,
    PoolSerializer,
    ProfileSerializer,
)
from catalog.teams.api import open_model_to_teams
from catalog.teams.roles import (
    RoleRequired,
    default_team,
    has_role,
    keys_visible_to,
    may_manage_key,
    member_for_new_key,
    teams_of,
    within_cap,
)  # fmt: skip


class CatalogEntryViewSet(viewsets.ModelViewSet):
    """Every write goes through the catalog's verbs, so it records an Event naming the
    operator and routers hear of it at once, as an apply would."""

    def perform_create(self, serializer) -> None:
        row = serializer.Meta.model(**serializer.validated_data)
        with engine_admins_only():
            serializer.instance = save_entry(row, actor=self.request.user)

    def perform_update(self, serializer) -> None:
        with engine_admins_only():
            update_entry(serializer.instance, serializer.validated_data, actor=self.request.user)

    def perform_destroy(self, instance) -> None:
        delete_row(instance, actor=self.request.user)


@contextmanager
def engine_admins_only() -> Iterator[None]:
    """A change only an engine admin may make: 403, each problem naming field, value, group."""
    try:
        yield
    except EngineAdminRequired as exc:
        raise PermissionDenied({"detail": exc.problems}) from None


class EngineViewSet(CatalogEntryViewSet):
    queryset = Engine.objects.all()
    serializer_class = EngineSerializer


class PoolViewSet(CatalogEntryViewSet):
    queryset = Pool.objects.all()
    serializer_class = PoolSerializer


class FabricViewSet(CatalogEntryViewSet):
    queryset = Fabric.objects.all()
    serializer_class = FabricSerializer


class ModelViewSet(CatalogEntryViewSet):
    queryset = Model.objects.prefetch_related("profiles")
    serializer_class = ModelSerializer

    @action(detail=True, methods=["post"])
    def teams(self, request, pk=None):
        """Open the model to these teams (``{"teams": [...]}``; empty: every team)."""
        return open_model_to_teams(request, self.get_object())


class ProfileViewSet(CatalogEntryViewSet):
    queryset = Profile.objects.select_related("model")
    serializer_class = ProfileSerializer


class ApiKeySerializer(drf_serializers.ModelSerializer):
    models = drf_serializers.ListField(
        source="allowed_models", child=drf_serializers.CharField(), required=False,
        help_text="models (names or aliases) the key may use; empty means every model",
    )  # fmt: skip
    team = drf_serializers.SlugRelatedField(
        slug_field="name", queryset=Team.objects.all(), required=False,
        help_text="the team it spends for (default: default)",
    )  # fmt: skip
    member = drf_serializers.SlugRelatedField(
        slug_field="username", queryset=User.objects.all(), required=False, allow_null=True,
        help_text="the member it is for (a member's own keys are theirs, whatever is asked)",
    )  # fmt: skip

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "team", "member", "models", *LIMIT_FIELDS,
                  "priority", "expires_at", "created_at", "revoked_at"]  # fmt: skip
        read_only_fields = ["prefix", "created_at", "revoked_at"]


def refused_on_field(exc: ApiKeyRefused) -> drf_serializers.ValidationError:
    """The verb's refusal, filed under the field it names ("tokens_per_day: …")."""
    message = str(exc)
    field, sep, _rest = message.partition(":")
    known = {*LIMIT_FIELDS, "priority", "expires", "member"}
    key = ("expires_at" if field == "expires" else field) if sep and field in known else "models"
    return drf_serializers.ValidationError({key: [message]})


class OperatorsAndTeams(BasePermission):
    message = (
        "API keys are for operators and teams' members; ask a team's lead to add you, "
        "or an admin to add you to 'operators'."
    )

    def has_permission(self, request, view) -> bool:
        return is_operator(request.user) or teams_of(request.user).exists()


class ApiKeyViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Keys for /v1: create (the key is in the answer, once), list, change limits, revoke.
    Operators: every key. A team's lead: its keys; a member: makes and manages their own
    within its cap per key; a viewer: lists its keys (names, never the keys)."""

    queryset = ApiKey.objects.all()
    serializer_class = ApiKeySerializer
    permission_classes = [OperatorsAndTeams]

    def get_queryset(self):
        return keys_visible_to(self.request.user)

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        limits = {name: data[name] for name in LIMIT_FIELDS if name in data}
        team = data.get("team") or default_team()
        member = data.get("member")
        try:
            if team is None and not is_operator(request.user):
                raise RoleRequired("name the team to make the key in")
            if team is not None:
                member = member_for_new_key(request.user, team, member, limits)
            row, key = create_key(
                data["name"],
                data.get("allowed_models", []),
                limits=limits,
                expires_at=data.get("expires_at"),
                priority=data.get("priority", "normal"),
                team=team,
                member=member,
                actor=request.user,
            )
        except RoleRequired as exc:
            raise PermissionDenied(str(exc)) from None
        except ApiKeyRefused as exc:
            raise refused_on_field(exc) from None
        return Response({**self.get_serializer(row).data, "key": key}, status=201)

    def perform_update(self, serializer) -> None:
        data = serializer.validated_data
        key = serializer.instance
        self._may_manage(key)
        if ("team" in data and data["team"] != key.team) or "member" in data:
            raise drf_serializers.ValidationError(
                {"team": ["a key's team and member stay; make a new key in the other team"]}
            )
        try:
            if not has_role(self.request.user, key.team, Membership.Role.LEAD):
                within_cap(key.team, {n: data[n] for n in LIMIT_FIELDS if n in data},
                           self.request.user.get_username())  # fmt: skip
            serializer.instance = update_key(
                serializer.instance.prefix,
                allowed_models=data.get("allowed_models"),
                limits={name: data[name] for name in LIMIT_FIELDS if name in data},
                expires_at=data.get("expires_at", UNCHANGED),
                priority=data.get("priority"),
                actor=self.request.user,
            )
        except ApiKeyRefused as exc:
            raise refused_on_field(exc) from None

    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the key; routers refuse it within a second."""
        key = self.get_object()
        self._may_manage(key)
        row = revoke_key(key.prefix, actor=request.user)
        return Response(self.get_serializer(row).data)

    def _may_manage(self, key: ApiKey) -> None:
        if not may_manage_key(self.request.user, key):
            raise PermissionDenied(
                f"key {key.prefix}… is team {key.team.name}'s: its lead manages it, or the "
                "member it was made for"
            )
