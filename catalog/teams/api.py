"""REST endpoints for teams under /api/v1/teams/: everyone signed in lists the teams they
are in (operators: every team); operators make, change and remove teams; a team's lead
gives and takes roles in it. Every write is a verb (``catalog.teams.actions``), which
checks the role again: the API only turns its refusals into 400s and 403s."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from catalog.keys import LIMIT_FIELDS, open_model_names
from catalog.models import Model, Team
from catalog.teams.actions import (
    create_team,
    delete_team,
    open_model,
    remove_member,
    set_role,
    update_team,
)  # fmt: skip
from catalog.teams.roles import ROLES, RoleRequired, TeamRefused, teams_of


class TeamSerializer(serializers.ModelSerializer):
    key_cap = serializers.DictField(
        child=serializers.IntegerField(min_value=1, allow_null=True), required=False,
        help_text="each key's limits at most, by limit name",
    )  # fmt: skip
    models = serializers.SerializerMethodField(help_text="the models its keys may use")
    members = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "name", "description", *LIMIT_FIELDS, "key_cap", "models", "members",
                  "created_at"]  # fmt: skip
        read_only_fields = ["created_at"]

    def get_models(self, team: Team) -> list[str] | str:
        usable = open_model_names().get(team.name)
        if usable is None:
            return "all"
        return sorted(Model.objects.filter(name__in=usable).values_list("name", flat=True))

    def get_members(self, team: Team) -> list[dict[str, str]]:
        return [
            {"username": m.user.get_username(), "role": m.role}
            for m in team.memberships.select_related("user")
        ]


class RoleSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=ROLES)


@contextmanager
def refusals() -> Iterator[None]:
    """A verb's refusal: 403 when the role does not allow it, else 400 naming the fix."""
    try:
        yield
    except RoleRequired as exc:
        raise PermissionDenied(str(exc)) from None
    except TeamRefused as exc:
        raise ValidationError({"detail": [str(exc)]}) from None


class TeamViewSet(viewsets.ModelViewSet):
    """Teams: their budgets, cap per key, models and members."""

    queryset = Team.objects.all()
    serializer_class = TeamSerializer
    permission_classes = [IsAuthenticated]
    lookup_field = "name"

    def get_queryset(self):
        return teams_of(self.request.user).prefetch_related("memberships__user")

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        with refusals():
            team = create_team(
                data["name"], description=data.get("description", ""),
                limits={name: data[name] for name in LIMIT_FIELDS if name in data},
                key_cap=data.get("key_cap"), actor=request.user,
            )  # fmt: skip
        return Response(self.get_serializer(team).data, status=201)

    def perform_update(self, serializer) -> None:
        data = serializer.validated_data
        if data.get("name", serializer.instance.name) != serializer.instance.name:
            raise ValidationError(
                {"name": ["a team's name stays: its counters and usage go by it"]}
            )
        with refusals():
            serializer.instance = update_team(
                serializer.instance.name, description=data.get("description"),
                limits={name: data[name] for name in LIMIT_FIELDS if name in data},
                key_cap=data.get("key_cap"), actor=self.request.user,
            )  # fmt: skip

    def perform_destroy(self, instance) -> None:
        with refusals():
            delete_team(instance.name, actor=self.request.user)

    @action(detail=True, methods=["post"])
    def members(self, request, name=None):
        """Give a person a role in the team (``{"username": …, "role": "member"}``)."""
        serializer = RoleSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        team = self.get_object()
        with refusals():
            set_role(team.name, serializer.validated_data["username"],
                     serializer.validated_data["role"], actor=request.user)  # fmt: skip
        return Response(self.get_serializer(team).data)

    @action(detail=True, methods=["delete"], url_path="members/(?P<username>[^/]+)")
    def remove_member(self, request, name=None, username=None):
        """Take a person out of the team."""
        team = self.get_object()
        with refusals():
            remove_member(team.name, username or "", actor=request.user)
        return Response(self.get_serializer(team).data)


class OpenToSerializer(serializers.Serializer):
    teams = serializers.ListField(
        child=serializers.CharField(), allow_empty=True,
        help_text="the teams whose keys may use the model; empty: every team",
    )  # fmt: skip


def open_model_to_teams(request, model: Model) -> Response:
    """``POST /api/v1/models/{id}/teams/``: open the model to exactly these teams."""
    serializer = OpenToSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    with refusals():
        teams = open_model(model.name, serializer.validated_data["teams"], actor=request.user)
    return Response({"model": model.name, "teams": teams or "all"})
