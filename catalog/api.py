"""REST endpoints for the catalog under /api/v1/."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
from catalog.models import ApiKey, Engine, Fabric, Model, Pool, Profile
from catalog.permissions import is_operator
from catalog.serializers import (
    EngineSerializer,
    FabricSerializer,
    ModelSerializer,
    PoolSerializer,
    ProfileSerializer,
)


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


class ProfileViewSet(CatalogEntryViewSet):
    queryset = Profile.objects.select_related("model")
    serializer_class = ProfileSerializer


class ApiKeySerializer(drf_serializers.ModelSerializer):
    models = drf_serializers.ListField(
        source="allowed_models", child=drf_serializers.CharField(), required=False,
        help_text="models (names or aliases) the key may use; empty means every model",
    )  # fmt: skip

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "models", *LIMIT_FIELDS, "priority", "expires_at",
                  "created_at", "revoked_at"]  # fmt: skip
        read_only_fields = ["prefix", "created_at", "revoked_at"]


def refused_on_field(exc: ApiKeyRefused) -> drf_serializers.ValidationError:
    """The verb's refusal, filed under the field it names ("tokens_per_day: …")."""
    message = str(exc)
    field, sep, _rest = message.partition(":")
    known = {*LIMIT_FIELDS, "priority", "expires"}
    key = ("expires_at" if field == "expires" else field) if sep and field in known else "models"
    return drf_serializers.ValidationError({key: [message]})


class OperatorsOnly(BasePermission):
    message = "API keys are for operators; ask an admin to add you to 'operators'."

    def has_permission(self, request, view) -> bool:
        return is_operator(request.user)


class ApiKeyViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Keys for /v1: create (the key is in the answer, once), list, change limits, revoke.
    Operators only."""

    queryset = ApiKey.objects.all()
    serializer_class = ApiKeySerializer
    permission_classes = [OperatorsOnly]

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            row, key = create_key(
                data["name"],
                data.get("allowed_models", []),
                limits={name: data[name] for name in LIMIT_FIELDS if name in data},
                expires_at=data.get("expires_at"),
                priority=data.get("priority", "normal"),
                actor=request.user,
            )
        except ApiKeyRefused as exc:
            raise refused_on_field(exc) from None
        return Response({**self.get_serializer(row).data, "key": key}, status=201)

    def perform_update(self, serializer) -> None:
        data = serializer.validated_data
        try:
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
        row = revoke_key(self.get_object().prefix, actor=request.user)
        return Response(self.get_serializer(row).data)
