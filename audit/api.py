"""The Event log over the REST API: read-only, like the log itself."""

from __future__ import annotations

from rest_framework import serializers, viewsets

from audit.models import Event


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = Event
        fields = [
            "id", "at", "kind", "subject", "from_state", "to_state", "reason", "actor_name",
        ]  # fmt: skip


class EventViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Event.objects.all()
    serializer_class = EventSerializer
