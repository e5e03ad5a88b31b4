"""Read-only REST endpoints for nodes, replicas and shards."""

from __future__ import annotations

from rest_framework import viewsets

from fleet.api.serializers import NodeSerializer, ReplicaSerializer, ShardSerializer
from fleet.models import Node, Replica, Shard


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Node.objects.all()
    serializer_class = NodeSerializer


class ReplicaViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Replica.objects.prefetch_related("shards")
    serializer_class = ReplicaSerializer


class ShardViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Shard.objects.all()
    serializer_class = ShardSerializer
