"""REST endpoints for the catalog under /api/v1/."""

from __future__ import annotations

from rest_framework import viewsets

from catalog.models import Engine, Fabric, Model, Pool, Profile
from catalog.serializers import (
    EngineSerializer,
    FabricSerializer,
    ModelSerializer,
    PoolSerializer,
    ProfileSerializer,
)


class EngineViewSet(viewsets.ModelViewSet):
    queryset = Engine.objects.all()
    serializer_class = EngineSerializer


class PoolViewSet(viewsets.ModelViewSet):
    queryset = Pool.objects.all()
    serializer_class = PoolSerializer


class FabricViewSet(viewsets.ModelViewSet):
    queryset = Fabric.objects.all()
    serializer_class = FabricSerializer


class ModelViewSet(viewsets.ModelViewSet):
    queryset = Model.objects.prefetch_related("profiles")
    serializer_class = ModelSerializer


class ProfileViewSet(viewsets.ModelViewSet):
    queryset = Profile.objects.select_related("model")
    serializer_class = ProfileSerializer
