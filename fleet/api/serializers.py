"""API shapes for the fleet (read-only: the fleet changes through agents and verbs)."""

from __future__ import annotations

from rest_framework import serializers

from fleet.models import Node, Replica, Shard


class NodeSerializer(serializers.ModelSerializer):
    # The API's name for it from before the column was renamed (Node.usage_at is a method).
    usage_at = serializers.DateTimeField(source="usage_reported_at", read_only=True)

    class Meta:
        model = Node
        fields = [
            "id", "address", "state", "draining", "registered_at", "last_heartbeat",
            "state_changed_at", "agent_version", "inventory", "engines", "weights", "usage",
            "usage_at",
        ]  # fmt: skip


class ShardSerializer(serializers.ModelSerializer):
    class Meta:
        model = Shard
        fields = [
            "id", "replica", "rank", "node", "gpus", "port", "state", "reason", "output_tail",
            "progress", "pid", "state_changed_at",
        ]  # fmt: skip


class ReplicaSerializer(serializers.ModelSerializer):
    shards = ShardSerializer(many=True, read_only=True)

    class Meta:
        model = Replica
        fields = [
            "id", "model_name", "profile_name", "fingerprint", "engine", "engine_version",
            "state", "reasons", "reasons_at", "created_at", "state_changed_at", "shards",
        ]  # fmt: skip
