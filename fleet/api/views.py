"""Read-only REST endpoints for nodes, replicas, shards and the Event log."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import viewsets
from rest_framework.exceptions import ValidationError

from audit.api import EventViewSet
from audit.filters import EventFilter
from fleet.api.serializers import NodeSerializer, ReplicaSerializer, ShardSerializer
from fleet.audit_log.reading import EventFilterRefused, asked_events, readable_events
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


class EventLogViewSet(EventViewSet):
    """The Event log as the audit page reads it: what the caller may read
    (``fleet.audit_log.reading``), narrowed by the page's filters as query parameters
    (``?actor=olga&kind=key&object=node07&since=1d``)."""

    def get_queryset(self):
        asked = EventFilter.from_query(self.request.query_params, timezone.now())
        if asked.notes:
            raise ValidationError({"filter": list(asked.notes)})
        try:
            return asked_events(readable_events(self.request.user), asked)
        except EventFilterRefused as exc:
            raise ValidationError({"team": [str(exc)]}) from None
