"""The catalog: which models to run, and how. Placement decides where."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from catalog.fit.estimate import MemoryEstimate, ModelShape, Needs, estimate, needs
from catalog.fit.model_files import adapter_bytes
from core.humanize import format_bytes
from protocol.engine_serves import effective_serves
from protocol.engines import DEFAULT_ENGINES, WantedEngine, newest_version
from protocol.serving import DEFAULT_SERVES
from protocol.shard import AdapterSpec, adapter_id, served_adapters, start_specs

KNOWN_ENGINES = ("llama.cpp", "vllm", "sglang")
LAUNCH_MODES = ("native", "ray", "mp")
STRATEGIES = ("pack", "spread")


class Engine(models.Model):
    """An engine version every node should have, with one archive per build."""

    name = models.CharField(max_length=64)
    version = models.CharField(max_length=64)
    # [{"name": "cpu-x64", "url": "...", "sha256": "...", "packages": ["libgomp1"]}]
    builds = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="engine_unique")]
        ordering = ["name", "version"]

    def __str__(self) -> str:
        return f"{self.name} {self.version}"

    def wanted(self) -> WantedEngine:
        """This version as a node is told to have it (the ``converge_engines`` command)."""
        return WantedEngine(name=self.name, version=self.version, builds=self.builds)


class Pool(models.Model):
    """A named group of nodes a profile can be confined to."""

    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Fabric(models.Model):
    """A high-speed network (InfiniBand, RoCE); agents declare which adapters are on it."""

    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Team(models.Model):
    """A group of people and their keys: which models they may use (``Model.teams``) and
    what they may spend together. The limits hold every key of the team together; the
    ``key_cap`` holds each key of it alone, on top of the key's own limits (the smaller
    of the two applies). Every key belongs to one; keys from before teams are ``default``'s."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The team's budgets, for all its keys together (Redis counters, as a key's); empty: none.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_per_month = models.PositiveBigIntegerField(null=True, blank=True)
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    # Each key's limits at most ({"tokens_per_day": 100000, …}, catalog.keys.LIMIT_FIELDS).
    key_cap = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A person's role in a team: a ``viewer`` sees its models, usage and keys' names; a
    ``member`` also makes keys for themselves within its limits; a ``lead`` manages its
    keys, members and limits per key. Fleet-wide roles are groups (catalog.permissions)."""

    class Role(models.TextChoices):
        VIEWER = "viewer"
        MEMBER = "member"
        LEAD = "lead"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    role = models.CharField(max_length=8, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="catalog_membership_once")
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.role} of {self.team})"


class Model(models.Model):
    """A model clients ask for by ``name`` (or an alias), and where its weights come from."""

    name = models.CharField(max_length=128, unique=True)
    aliases = ArrayField(models.CharField(max_length=128), default=list, blank=True)
    # An absolute local path, an https:// URL of one file, or a hub id like org/repo.
    source = models.CharField(max_length=1024)
    sha256 = models.CharField(max_length=64, blank=True)
    description = models.TextField(blank=True)
    # An operator's hold on replacing stale replicas (llmgw_ctl rollout pause); never in
    # the catalog file, so applying the file cannot lift it.
    rollout_paused = models.BooleanField(default=False)
    # What its file says about the memory it needs, for the source it was read from:
    # {"source", "shape"} once read, {"source", "reading"} while a task downloads a URL's
    # header, {"source", "unreadable"} with the reason. A changed source is read again.
    file_shape = models.JSONField(default=dict, blank=True, editable=False)
    # LoRA adapters on its replicas, as the catalog file lists them ({"name", "source", …}).
    # In no profile's fingerprint: adding one restarts no replica.
    adapters = models.JSONField(default=list, blank=True)
    # The teams whose keys may use it; none named: every team's.
    teams = models.ManyToManyField(Team, blank=True, related_name="models")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def adapter_ids(self) -> list[str]:
        """Each adapter's model id, ``<model>:<adapter>``, in catalog order."""
        return [adapter_id(self.name, adapter["name"]) for adapter in self.adapters]

    def adapters_for(self, profile: Profile) -> list[dict]:
        """The adapters ``profile`` serves (protocol.shard.served_adapters)."""
        return served_adapters(self.adapters, profile.name, profile.engine)

    def adapter_specs(self, profile: Profile) -> list[AdapterSpec]:
        """What a replica of ``profile`` loads at start, in the catalog's order."""
        return start_specs(self.adapters_for(profile), profile.engine)

    def shape(self) -> ModelShape | None:
        """What the file of its current source says (catalog/fit/); None until read."""
        if self.file_shape.get("source") != self.source:
            return None
        return ModelShape.from_dict(self.file_shape.get("shape"))

    def shape_note(self, key: str) -> str:
        """Why its current source has no shape yet: ``reading`` (it is coming) or
        ``unreadable`` (it will not); "" when the other holds, or nothing was tried."""
        if self.file_shape.get("source") != self.source:
            return ""
        return str(self.file_shape.get(key, ""))

    @property
    def served_kinds(self) -> list[str]:
        """Every kind one of its profiles serves, sorted; a model without profiles serves
        what every engine does by default. Reads ``profiles``: prefetch them in loops."""
        kinds = {kind for profile in self.profiles.all() for kind in profile.served_kinds}
        return sorted(kinds) if kinds else list(DEFAULT_SERVES)


class Profile(models.Model):
    """How a model runs: engine, resources and replica count."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=64)
    engine = models.CharField(max_length=32)
    engine_version = models.CharField(max_length=64, blank=True)
    replicas = models.PositiveIntegerField(default=1)
    gpus_per_rank = models.PositiveIntegerField(default=0)
    tensor_parallel = models.PositiveIntegerField(default=1)
    nodes = models.PositiveIntegerField(default=1, help_text="nodes (ranks) per replica")
    memory = models.BigIntegerField(default=0, help_text="host RAM per rank, bytes")
    gpu_memory = models.BigIntegerField(default=0, help_text="free memory needed on each GPU")
    disk = models.BigIntegerField(default=0, help_text="disk for the weights, bytes")
    context = models.PositiveIntegerField(default=0)
    pool = models.CharField(max_length=64, blank=True)
    launch_mode = models.CharField(max_length=16, default="native")
    strategy = models.CharField(max_length=16, default="pack")
    # How routers spread this profile's requests: least outstanding, or by prompt prefix
    # so that an engine's prefix cache hits.
    routing = models.CharField(max_length=24, default="least_outstanding")
    # Requests one replica serves at once (its engine's parallel slots); more wait in the
    # routers, high priority first. 0: no limit, the engine queues them itself.
    concurrency = models.PositiveIntegerField(default=0)
    # {"min", "max", "target_inflight", "scale_down_after"}: replicas follow demand between
    # min and max, and `replicas` is the reconciler's to set. None: a fixed count.
    autoscale = models.JSONField(null=True, blank=True)
    # Since when demand has stayed below what the current count needs (scale-down waits).
    autoscale_low_since = models.DateTimeField(null=True, blank=True)
    # What its replicas serve (protocol.serving kinds: chat, embeddings, rerank, …), in
    # that order; empty: the engine's default, chat. Each engine turns it into its flags.
    serves = models.JSONField(default=list, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    startup_timeout = models.PositiveIntegerField(default=600, help_text="seconds")
    # A rolling restart runs at most replicas + surge and keeps replicas - unavailable ready.
    rollout_surge = models.PositiveIntegerField(default=1)
    rollout_unavailable = models.PositiveIntegerField(default=0)
    drain_timeout = models.PositiveIntegerField(
        default=30, help_text="seconds a replica being replaced may finish its requests"
    )
    # vLLM's --max-loras and --max-lora-rank (0: LoRA off, and vLLM's own rank).
    max_loras = models.PositiveIntegerField(default=0)
    max_lora_rank = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="profile_unique_per_model")
        ]
        ordering = ["model__name", "name"]

    def __str__(self) -> str:
        return f"{self.model.name}/{self.name}"

    @property
    def rollout(self) -> dict[str, int]:
        """The ``rollout:`` block as the catalog file writes it."""
        return {"surge": self.rollout_surge, "unavailable": self.rollout_unavailable}

    @property
    def served_kinds(self) -> list[str]:
        """What its replicas serve: its ``serves:``, else its engine's default (chat)."""
        return effective_serves(self.engine, self.serves)

    def fit(self) -> MemoryEstimate | None:
        """Each device of a rank's memory, from the model's file; None until it is read."""
        shape = self.model.shape()
        if shape is None:
            return None
        return estimate(
            shape,
            engine=self.engine,
            context=self.context,
            concurrency=self.concurrency,
            gpus_per_rank=self.gpus_per_rank,
            nodes=self.nodes,
            serves=self.served_kinds,
            adapters=adapter_bytes(self.model.adapters_for(self), self.max_loras),
        )

    def needs(self, fit: MemoryEstimate | None = None) -> Needs:
        """What a rank asks of a node: the declared sizes, else the estimate."""
        return needs(
            fit or self.fit(),
            memory=self.memory,
            gpu_memory=self.gpu_memory,
            gpus_per_rank=self.gpus_per_rank,
            pending=self.model.shape_note("reading"),
        )

    @property
    def fit_line(self) -> str:
        """The estimate and whether it is used, in one line for pages and ``llmgw_ctl``."""
        fit = self.fit()
        key = "gpu_memory" if self.gpus_per_rank else "memory"
        declared = self.gpu_memory if self.gpus_per_rank else self.memory
        if fit is None and not declared:
            # Said only where it matters: nothing declared stands in for the estimate.
            reading, unreadable = (
                self.model.shape_note("reading"),
                self.model.shape_note("unreadable"),
            )
            if reading:
                return f"no estimate yet ({reading}); placement waits for it, or set {key}:"
            if unreadable:
                return f"no estimate ({unreadable}); {key}: not set, so placement checks none"
            return ""
        if fit is None:
            return ""
        if not declared:
            return f"{fit.describe()} (the estimate: {key}: not set)"
        if declared < fit.total:
            return f"{fit.describe()}; {key}: {format_bytes(declared)} declared is less"
        return f"{fit.describe()} ({key}: {format_bytes(declared)} declared)"

    def resolved_engine_version(self, newest: Mapping[str, str] | None = None) -> str:
        """The engine version this profile's replicas run: the pinned one, else the
        catalog's newest for its engine; "" when neither names one (placement then takes
        the newest on the node it chooses). ``newest`` saves a query per profile in loops.
        """
        if self.engine_version:
            return self.engine_version
        newest = newest_engine_versions() if newest is None else newest
        return newest.get(self.engine, "")

    def fingerprint(self, newest: Mapping[str, str] | None = None) -> str:
        """Hash what changes the running engine, the resolved engine version included;
        replicas, pool, timeouts or rollout do not."""
        return profile_fingerprint(self.model, self, self.resolved_engine_version(newest))


def newest_engine_versions() -> dict[str, str]:
    """Engine name -> the newest version the catalog names (b10991 over b9000), or the
    default build's for an engine it names none of (rule R103)."""
    return newest_by_engine(Engine.objects.values_list("name", "version"))


# Where an engine version comes from, in the words pages and llmgw_ctl show.
FROM_DEFAULT = "default"
FROM_CATALOG = "catalog"
FROM_NODE = "found on the node"


def default_engines(named: Iterable[str]) -> list[WantedEngine]:
    """llmgw's default builds (rule R103, protocol.engines.DEFAULT_ENGINES) of the engines
    not in ``named``, the names the catalog gives versions of: ``engines:`` with a llama.cpp
    build replaces llama.cpp's default. None when LLMGW_DEFAULT_ENGINES is off."""
    if not settings.DEFAULT_ENGINES:
        return []
    names = set(named)
    return [engine for engine in DEFAULT_ENGINES if engine.name not in names]


def engine_origins() -> dict[tuple[str, str], str]:
    """(engine, version) -> where each version nodes are told to have comes from: the
    catalog's ``engines:``, or llmgw's default for an engine it names none of."""
    named = set(Engine.objects.values_list("name", "version"))
    origins = dict.fromkeys(named, FROM_CATALOG)
    origins.update({d.key: FROM_DEFAULT for d in default_engines(name for name, _ in named)})
    return origins


def newest_by_engine(versions: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Engine name -> the newest of ``versions`` (name, version), defaults filling in."""
    by_engine: dict[str, list[str]] = {}
    for name, version in versions:
        by_engine.setdefault(name, []).append(version)
    newest = {name: newest_version(names) for name, names in by_engine.items()}
    newest.update({engine.name: engine.version for engine in default_engines(newest)})
    return newest


def profile_fingerprint(model: Model, profile: Profile, engine_version: str) -> str:
    facts = {
        "model": model.name,
        "source": model.source,
        "sha256": model.sha256,
        "engine": profile.engine,
        "engine_version": engine_version,
        "gpus_per_rank": profile.gpus_per_rank,
        "tensor_parallel": profile.tensor_parallel,
        "nodes": profile.nodes,
        "context": profile.context,
        "launch_mode": profile.launch_mode,
        "args": list(profile.args),
        "env": dict(sorted(profile.env.items())),
    }
    if profile.serves:
        # Only when named, so the fingerprints of profiles that serve the default stay as
        # they were before serves: existed (no rolling restart for nothing).
        facts["serves"] = list(profile.serves)
    for name in ("max_loras", "max_lora_rank"):
        if getattr(profile, name):  # only when set, as serves:; adapters are never here
            facts[name] = getattr(profile, name)
    encoded = json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


class ApiKey(models.Model):
    """A key clients send to ``/v1``; only its hash is stored."""

    name = models.CharField(max_length=128)
    prefix = models.CharField(max_length=16, unique=True, help_text="shown to identify the key")
    hashed_key = models.CharField(max_length=128)
    # Empty means every model.
    allowed_models = ArrayField(models.CharField(max_length=128), default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="refused from then on")
    # Limits the routers enforce together (Redis counters); empty means no limit.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="prompt and completion tokens together"
    )
    tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_per_month = models.PositiveBigIntegerField(null=True, blank=True)
    concurrency = models.PositiveIntegerField(
        null=True, blank=True, help_text="requests in flight at once"
    )
    priority = models.CharField(
        max_length=8,
        choices=[("high", "high"), ("normal", "normal"), ("low", "low")],
        default="normal",
        help_text="who is served first when a model's replicas are all busy",
    )
    # The account a key was issued to: the playground's keys (one live key per account);
    # what such a key makes (kept responses) is the account's, through every renewal.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
        related_name="playground_keys",
    )  # fmt: skip
    # The team it spends for (its models, budgets and cap); keys from before teams are
    # ``default``'s. PROTECT: a team with keys is emptied before it goes.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="api_keys")
    # The member it was made for (a member's own key); empty: the team's.
    member = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="member_keys",
    )  # fmt: skip

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ApiToken(models.Model):
    """A token for the REST API (``Authorization: Token …``), issued to one account; only
    its hash is stored, and it expires (``catalog.tokens``)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    prefix = models.CharField(max_length=16, unique=True, help_text="shown to identify it")
    hashed_token = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(help_text="refused from then on")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
