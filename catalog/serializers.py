"""API shapes for the catalog; values are checked by the same rules as catalog files."""

from __future__ import annotations

from rest_framework import serializers

from catalog.models import Engine, Fabric, Model, Pool, Profile
from catalog.schema import EngineEntry, ModelEntry, ProfileEntry, validate_fields


def _validate_with(entry_class, data: dict, exclude: tuple[str, ...] = ()) -> dict:
    """Run the catalog file's validation on API input, naming each field that fails."""
    entry, errors = validate_fields(entry_class, data)
    if entry is None:
        raise serializers.ValidationError(errors)
    return entry.model_dump(exclude=set(exclude))


class EngineSerializer(serializers.ModelSerializer):
    class Meta:
        model = Engine
        fields = ["id", "name", "version", "builds"]

    def validate(self, attrs):
        merged = {"name": "", "version": "", "builds": []}
        if self.instance:
            merged.update(name=self.instance.name, version=self.instance.version,
                          builds=self.instance.builds)  # fmt: skip
        merged.update(attrs)
        return _validate_with(EngineEntry, merged)


class PoolSerializer(serializers.ModelSerializer):
    class Meta:
        model = Pool
        fields = ["id", "name", "description"]


class FabricSerializer(serializers.ModelSerializer):
    class Meta:
        model = Fabric
        fields = ["id", "name", "description"]


class ProfileSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", queryset=Model.objects.all())
    fingerprint = serializers.CharField(read_only=True)
    serves = serializers.JSONField(
        required=False,
        help_text='what its replicas serve, like ["embeddings"]; empty: chat',
    )
    args = serializers.JSONField(required=False)
    env = serializers.JSONField(required=False)
    memory = serializers.JSONField(required=False, help_text="bytes, or a size like 1GiB")
    gpu_memory = serializers.JSONField(required=False, help_text="bytes, or a size like 40GiB")
    disk = serializers.JSONField(required=False, help_text="bytes, or a size like 20GiB")
    startup_timeout = serializers.JSONField(required=False, help_text="seconds, or like 10m")
    rollout = serializers.JSONField(required=False, help_text='{"surge": 1, "unavailable": 0}')
    drain_timeout = serializers.JSONField(required=False, help_text="seconds, or like 30s")
    autoscale = serializers.JSONField(
        required=False, allow_null=True,
        help_text='{"min": 0, "max": 4, "target_inflight": 4, "scale_down_after": "5m"}',
    )  # fmt: skip
    routing = serializers.CharField(
        required=False,
        help_text="least_outstanding, or prefix: requests that share a prompt prefix go to "
        "the same replica, so its prefix cache serves them",
    )

    class Meta:
        model = Profile
        fields = [
            "id", "model", "name", "engine", "engine_version", "replicas", "gpus_per_rank",
            "tensor_parallel", "nodes", "memory", "gpu_memory", "disk", "context", "pool",
            "launch_mode", "strategy", "serves", "args", "env", "startup_timeout", "rollout",
            "drain_timeout", "routing", "concurrency", "autoscale", "fingerprint",
        ]  # fmt: skip

    def validate(self, attrs):
        model = attrs.pop("model", None) or (self.instance.model if self.instance else None)
        current = {}
        if self.instance:
            current = {
                name: getattr(self.instance, name)
                for name in ProfileEntry.model_fields
                if hasattr(self.instance, name)
            }
        current.update(attrs)
        validated = _validate_with(ProfileEntry, current)
        rollout = validated.pop("rollout")
        validated.update(rollout_surge=rollout["surge"], rollout_unavailable=rollout["unavailable"])
        validated["model"] = model
        return validated


class ModelSerializer(serializers.ModelSerializer):
    profiles: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )

    class Meta:
        model = Model
        fields = ["id", "name", "aliases", "source", "sha256", "description", "profiles",
                  "adapters"]  # fmt: skip
        # Checked against the model's profiles, as the catalog file and its apply do.
        read_only_fields = ["adapters"]

    def validate(self, attrs):
        current = {}
        if self.instance:
            current = {name: getattr(self.instance, name) for name in
                       ("name", "aliases", "source", "sha256", "description")}  # fmt: skip
        current.update(attrs)
        return _validate_with(ModelEntry, current, exclude=("profiles", "adapters"))
