"""Read-only REST endpoints for nodes, replicas, shards and events."""

from __future__ import annotations

from rest_framework import viewsets

from audit.models import Event
from fleet.models import Node, Replica, Shard
from fleet.serializers import EventSerializer, NodeSerializer, ReplicaSerializer, ShardSerializer


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Node.objects.all()
    serializer_class = NodeSerializer


class ReplicaViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Replica.objects.prefetch_related("shards")
    serializer_class = ReplicaSerializer


class ShardViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Shard.objects.all()
    serializer_class = ShardSerializer


class EventViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Event.objects.all()
    serializer_class = EventSerializer
