"""The fleet as the control plane knows it: nodes, replicas and their shards."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from enum import nonmember
from typing import Any, TypeVar

from django.conf import settings
from django.db import models
from pydantic import BaseModel, ValidationError

from core.humanize import format_bytes
from fleet.accounts.identities import ProviderIdentity  # noqa: F401 (here, Django finds it)
from protocol.engines import EngineInstall
from protocol.inventory import Inventory, NodeUsage
from protocol.messages import WeightFile

log = logging.getLogger("llmgw.fleet")

# A heartbeat older than this is not the node's current use: pages grey it out, /metrics
# leaves it out and placement trusts the inventory's totals instead. Twelve heartbeats
# missed, so a node is long called unreachable before its numbers stop counting.
USAGE_FRESH_FOR = timedelta(seconds=60)
# Engine lists are sent again this often, so a lost command costs this much at most.
ENGINES_RETOLD_AFTER = timedelta(minutes=10)
# What a node reports of itself, kept as JSON: kilobytes a row, decoded on every load.
# A read that wants a node only for its id, address or state (a shard's node) defers them.
NODE_REPORTS = ("inventory", "engines", "weights", "unexpected_gpu_users", "usage")


class NodeState(models.TextChoices):
    CONNECTED = "connected"
    UNREACHABLE = "unreachable"
    LOST = "lost"


class ReplicaState(models.TextChoices):
    PLACING = "placing"
    UNPLACEABLE = "unplaceable"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"

    # Not stopped: pages show it, the routing table knows it.
    LIVE = nonmember(frozenset({PLACING, UNPLACEABLE, STARTING, READY, FAILED, STOPPING}))
    # On its way out or gone: nothing of it may start again.
    ENDING = nonmember(frozenset({STOPPING, STOPPED}))
    # Counts toward its profile's wanted replicas: a failed one holds its place until its
    # replacement backoff is over.
    COUNTED = nonmember(frozenset({PLACING, UNPLACEABLE, STARTING, READY, FAILED}))
    # Waiting for placement: holds no node yet.
    UNPLACED = nonmember(frozenset({PLACING, UNPLACEABLE}))


class ShardState(models.TextChoices):
    PENDING = "pending"
    FETCHING = "fetching"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"

    # Holds its node's GPUs and port: running, or on its way to running.
    LIVE = nonmember(frozenset({PENDING, FETCHING, STARTING, READY}))
    # On its way to ready: its memory not yet taken (progress is kept only while fetching).
    LOADING = nonmember(frozenset({PENDING, FETCHING, STARTING}))
    # Over: no process of it runs, and no transition leaves it.
    FINAL = nonmember(frozenset({FAILED, STOPPED}))


class Node(models.Model):
    """A machine running an agent. Its id is its hostname, also its certificate's name."""

    id = models.CharField(max_length=253, primary_key=True)
    address = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.CONNECTED)
    draining = models.BooleanField(default=False)
    # Set by an operator (llmgw_ctl pool, or the admin's action); a profile with a pool
    # places only on its nodes.
    pool = models.CharField(max_length=64, blank=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    agent_version = models.CharField(max_length=64, blank=True)
    # The whole register message's inventory (protocol.inventory.Inventory as JSON).
    inventory = models.JSONField(default=dict, blank=True)
    # One protocol EngineInstall per engine version, as JSON; null means the agent never
    # sent a list (an agent older than engine probing), [] that it has none.
    engines = models.JSONField(null=True, blank=True)
    weights = models.JSONField(default=list, blank=True)
    # When the engine versions installed here last changed: a crash loop's failures on
    # the node before then no longer count toward its backoff.
    engines_changed_at = models.DateTimeField(null=True, blank=True)
    # What the node was last told to have (a digest of the engine list), and when.
    engines_told = models.CharField(max_length=64, blank=True)
    engines_told_at = models.DateTimeField(null=True, blank=True)
    # The addresses its walls admit on engines' HTTP ports (a digest), and when told.
    callers_told = models.CharField(max_length=64, blank=True)
    callers_told_at = models.DateTimeField(null=True, blank=True)
    # GPU holders llmgw did not start and left alone (protocol UnexpectedGpuUser as JSON).
    unexpected_gpu_users = models.JSONField(default=list, blank=True)
    # The latest heartbeat's measurements (protocol NodeUsage as JSON), with its time.
    usage = models.JSONField(default=dict, blank=True)
    usage_reported_at = models.DateTimeField(null=True, blank=True)
    # What its command key derives from (fleet.pki.keys): the serial of the certificate its
    # latest link proved, or token… for a token link. Not secret: the key needs the fleet key.
    key_generation = models.CharField(max_length=80, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.id

    def inventory_facts(self) -> Inventory | None:
        """Return what the node said of itself in its last register; None before one."""
        if not self.inventory:
            return None
        return self._read_back("inventory", lambda: _stored(Inventory, self.inventory, self.id))

    def latest_usage(self) -> NodeUsage | None:
        """Return the latest heartbeat's usage however old it is; None before the first."""
        if not self.usage:
            return None
        return self._read_back("usage", lambda: _stored(NodeUsage, self.usage, self.id))

    def engine_installs(self) -> list[EngineInstall] | None:
        """Every engine version the node reported, with its status; None if it never said."""
        if self.engines is None:
            return None
        return list(self._read_back("engines", self._read_engines))

    def _read_engines(self) -> list[EngineInstall]:
        installs = [
            install
            for stored in self.engines or []
            if (install := _stored(EngineInstall, stored, self.id)) is not None
        ]
        return sorted(installs, key=lambda install: (install.engine, install.version))

    def _read_back(self, field: str, read: Callable[[], Any]) -> Any:
        """``read()`` of a report field, once for the JSON the field holds now: a pass or a
        page asks a node for the same facts several times (its snapshot, its fabrics, its
        warnings), each a validation. Held while the field holds the same object."""
        stored = getattr(self, field)
        held = self.__dict__.setdefault("_read_back_held", {})
        if field not in held or held[field][0] is not stored:
            held[field] = (stored, read())
        return held[field][1]

    def weight_files(self) -> list[WeightFile]:
        """The weights the node said it holds, in its latest list (one that no longer
        reads is left out, as with every stored report)."""
        return [
            weight
            for stored in self.weights or []
            if (weight := _stored(WeightFile, stored, self.id)) is not None
        ]

    def installed_engines(self) -> dict[str, set[str]]:
        """Engine name -> the versions installed and seen to run; only these take shards."""
        installed: dict[str, set[str]] = {}
        for install in self.engine_installs() or []:
            if install.installed:
                installed.setdefault(install.engine, set()).add(install.version)
        return installed

    def take_engines(self, engines: list[dict] | None, now: datetime) -> None:
        """Hold the node's engine list (unsaved); note the time if what is installed changed."""
        before = self.installed_engines()
        self.engines = engines
        if self.installed_engines() != before:
            self.engines_changed_at = now

    def engines_due(self, digest: str, now: datetime) -> bool:
        """Whether the node must be told its engines: never told since it linked, the
        catalog's list changed since, or ENGINES_RETOLD_AFTER has passed."""
        told = self.engines_told_at
        if told is None or self.engines_told != digest:
            return True
        if self.registered_at is not None and self.registered_at >= told:
            return True
        return now - told >= ENGINES_RETOLD_AFTER

    def usage_fresh_at(self, now: datetime) -> bool:
        """Say whether the latest heartbeat is recent enough to be taken as current."""
        reported = self.usage_reported_at
        return reported is not None and now - reported <= USAGE_FRESH_FOR

    def usage_at(self, now: datetime) -> NodeUsage | None:
        """Return the latest heartbeat's usage if it is fresh at ``now``, else None."""
        return self.latest_usage() if self.usage_fresh_at(now) else None

    def silence(self, now: datetime) -> timedelta | None:
        """How long since the node was last heard from, or None if never."""
        heard = self.last_heartbeat or self.registered_at
        return None if heard is None else now - heard

    def liveness_at(self, now: datetime) -> NodeState:
        """Say what the node's silence makes it at ``now``, whatever state is stored.

        A node never heard from has not gone silent, so it reads as connected.
        """
        silence = self.silence(now)
        if silence is None or silence <= timedelta(seconds=settings.NODE_UNREACHABLE_AFTER):
            return NodeState.CONNECTED
        if silence <= timedelta(seconds=settings.NODE_LOST_AFTER):
            return NodeState.UNREACHABLE
        return NodeState.LOST

    @property
    def warnings(self) -> list[str]:
        """What an operator should look at: engine ports open to the network, the agent's
        own warnings, then GPU holders."""
        facts = self.inventory_facts()
        open_ports = [facts.engine_ports_open] if facts and facts.engine_ports_open else []
        return (
            open_ports
            + list(facts.warnings if facts else [])
            + [unexpected_gpu_user_warning(user) for user in self.unexpected_gpu_users]
        )


def without_reports(via: str = "") -> list[str]:
    """``NODE_REPORTS`` as ``defer()`` names them, through a relation (``via="node"``)."""
    return [f"{via}__{name}" if via else name for name in NODE_REPORTS]


Fact = TypeVar("Fact", bound=BaseModel)


def _stored(model: type[Fact], stored: dict, node_id: str) -> Fact | None:
    """Read back a protocol model the node sent, stored as JSON; None if it no longer reads.

    What is stored was valid when it came; a control plane upgraded since may read it
    differently until the node speaks again, and one such row must not break a page.
    """
    try:
        return model.model_validate(stored)
    except ValidationError as exc:
        log.warning("node %s: stored %s no longer reads: %s", node_id, model.__name__, exc)
        return None


def known_memory(inventory_total: int, heartbeat_total: int) -> int:
    """The RAM a node is known to have: its register's or a heartbeat's, the larger."""
    return max(inventory_total, heartbeat_total)


def ram_gained(before: int, after: int) -> list[str]:
    """RAM grown past what was known, in words; nothing when nothing was known before."""
    return [f"RAM grew to {format_bytes(after)}"] if before and after > before else []


def unexpected_gpu_user_warning(user: dict) -> str:
    return (
        f"unexpected GPU user: pid {user.get('pid')} of {user.get('user') or 'unknown user'} "
        f"({user.get('cmdline') or user.get('name')}); llmgw did not start it and leaves it "
        "running, so the GPU memory it holds is not free"
    )


class Replica(models.Model):
    """One copy of a model running under one profile, across one or more nodes."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Names, not only keys: a replica whose model left the catalog must still be
    # described (and stopped) after the catalog row is gone.
    model_name = models.CharField(max_length=128)
    profile_name = models.CharField(max_length=64)
    profile = models.ForeignKey(
        "catalog.Profile",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="running_replicas",
    )
    # The fingerprint the engines were started with; "" reads as unknown, never as matching.
    fingerprint = models.CharField(max_length=64, blank=True)
    # The engine and the version its engines run, resolved by the control plane (pinned,
    # else the catalog's newest, else the newest on the node placed on); "" while unknown.
    engine = models.CharField(max_length=32, blank=True)
    engine_version = models.CharField(max_length=64, blank=True)
    state = models.CharField(
        max_length=16, choices=ReplicaState.choices, default=ReplicaState.PLACING
    )
    reasons = models.JSONField(default=list, blank=True)
    # When placement last worked out why it is refused (``reasons``): every 30 to 60 s, or
    # at the next pass after an operator acts on a node or the catalog. None otherwise.
    reasons_at = models.DateTimeField(null=True, blank=True)
    # The per-replica secret engines require; only the router sends it.
    secret = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    # When the replica began starting; a download in progress does not reset it.
    starting_since = models.DateTimeField(null=True, blank=True)
    # Set on a stand-in: a replica placed at once, beyond the profile's count, when no
    # router reaches any of its model's replicas and their nodes are silent (the nodes are
    # not yet lost: the mass-silence hold). Retired once the originals answer again; it
    # counts as one of them (this is cleared) once their nodes are lost.
    stands_in_since = models.DateTimeField(null=True, blank=True)
    # When a rolling restart took it out of the routing table to finish its requests;
    # it stays ready (its engines still answer) until the drain is over and it is stopped.
    draining_since = models.DateTimeField(null=True, blank=True)
    adapters = models.JSONField(default=list, blank=True)  # LoRA ones it started with, in order

    class Meta:
        ordering = ["model_name", "created_at"]

    def __str__(self) -> str:
        return f"{self.model_name}/{self.profile_name} {str(self.id)[:8]}"

    @property
    def serves_from_lost_node(self) -> bool:
        """Ready, with a shard on a node the control plane has lost.

        A lost node may only be cut from the control plane, its engines still answering
        the router, so such a replica stays routable (the router's breaker judges whether
        it answers) but no longer counts toward its profile: a replacement is made, and
        it is stopped once that is ready. Reads ``shards`` with their nodes: prefetch them.
        """
        return self.state == ReplicaState.READY and any(
            shard.node is not None and shard.node.state == NodeState.LOST
            for shard in self.shards.all()
        )

    @property
    def engine_label(self) -> str:
        """The engine and version as replica rows show it ("llama.cpp b6000"); "" if none."""
        return engine_label(self.engine, self.engine_version)

    def runs_settings(self, fingerprint: str) -> bool:
        """Whether its engines started with the settings ``fingerprint`` stands for; an
        unknown fingerprint ("") never matches, so such a replica reads as stale."""
        return bool(self.fingerprint) and self.fingerprint == fingerprint

    def version_to_run(self, newest: Mapping[str, str] | None = None) -> str:
        """The engine version it was resolved to; one made before versions were recorded
        takes its profile's as it resolves now (if that changed, the replica is stale).
        ``newest`` (``newest_engine_versions()``) saves a query per replica in loops."""
        if self.engine_version or self.profile is None:
            return self.engine_version
        return self.profile.resolved_engine_version(newest)


def with_shard_nodes(replicas: models.QuerySet[Replica]) -> models.QuerySet[Replica]:
    """``replicas`` with their shards and each shard's node's state and when it was last
    heard (not its reports, each kilobytes of JSON): what ``serves_from_lost_node``,
    ``finish_stops`` and stand-ins read, in three queries however many replicas there are."""
    nodes = Node.objects.only("id", "state", "last_heartbeat", "registered_at")
    return replicas.prefetch_related("shards", models.Prefetch("shards__node", queryset=nodes))


def engine_label(engine: str, version: str) -> str:
    """'llama.cpp b6000'; a replica started before versions were recorded says so."""
    if not engine:
        return ""
    return f"{engine} {version or '(version not recorded)'}"


class Shard(models.Model):
    """One rank of a replica, on one node."""

    id = models.CharField(max_length=64, primary_key=True)
    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="shards")
    rank = models.PositiveIntegerField(default=0)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="shards"
    )
    gpus = models.JSONField(default=list, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=ShardState.choices, default=ShardState.PENDING)
    reason = models.TextField(blank=True)
    output_tail = models.JSONField(default=list, blank=True)
    # Download progress rides beside the state; the next transition clears it.
    progress = models.JSONField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    # The node's sequence number of the state held here: an older status is ignored.
    status_seq = models.BigIntegerField(default=0)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["replica", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["replica", "rank"], name="shard_unique_rank")
        ]

    def __str__(self) -> str:
        return f"{self.id} rank {self.rank}"

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex


class FleetMember(models.Model):
    """A router or control-plane process as the leader last heard of it: the addresses
    every engine's HTTP port admits (``protocol.members``)."""

    id = models.CharField(max_length=255, primary_key=True)  # "<role>:<its own id>"
    role = models.CharField(max_length=16)
    addresses = models.JSONField(default=list)
    seen_at = models.DateTimeField()
    left_at = models.DateTimeField(null=True, blank=True)  # it said it stopped

    def __str__(self) -> str:
        return f"{self.id} ({', '.join(self.addresses)})"


class LeaderEpoch(models.Model):
    """The highest leader epoch granted under a lease key, kept where a restart keeps it.

    The lease lives in Redis, which forgets everything when it restarts; an epoch that
    began again at 1 would be older than what every agent has seen, and they would
    ignore the new leader's commands for good.
    """

    lease_key = models.CharField(max_length=200, primary_key=True)
    highest = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.lease_key}: epoch {self.highest}"


class NodeCertificate(models.Model):
    """A certificate llmgw's CA issued to a node; a revoked one is refused on every link."""

    serial = models.CharField(max_length=64, primary_key=True)  # decimal: 159 bits
    node_id = models.CharField(max_length=253, db_index=True)
    issued_at = models.DateTimeField(auto_now_add=True)
    not_after = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The SHA-256 of the node's own broker password (its bundle holds the password): what
    # its Redis user is made with again whenever Redis forgot it (fleet/pki/broker_users).
    broker_password_sha256 = models.CharField(max_length=64, blank=True, default="")
    # The certificate itself (PEM), from its issuance or the first link it proved: a
    # replica's secret travels on the broker sealed to its public key.
    certificate_pem = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["node_id", "issued_at"]

    def __str__(self) -> str:
        return f"{self.node_id} #{self.serial}"
