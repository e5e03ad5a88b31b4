"""The routing table: for each model, its ready endpoints and why others are not ready.

Built from a ``protocol.routing.RoutingSnapshot``, which the database gives
(``fleet.routing_table.routing_snapshot()``) or a static YAML file is read into
(``LLMGW_ROUTER_STATIC``, router-only mode). A table is immutable:
a reload builds a new one and swaps it in with one assignment, so a request in flight
never sees half a table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from protocol.routing import (
    LEAST_OUTSTANDING,
    ReplicaEndpoint,
    RoutableModel,
    RoutingPolicy,
    RoutingSnapshot,
)
from protocol.serving import DEFAULT_SERVES, SERVE_KINDS, ServeKind, TranslatedApi
from protocol.shard import adapter_id

# Retry-After (seconds) by why no replica is ready: a starting engine is seconds away,
# placement runs every few seconds, and nothing changes soon when nothing is wanted.
RETRY_STARTING = 5
RETRY_PLACING = 10
RETRY_STUCK = 60


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Rank 0 of one ready replica: where to send requests, and the engine's secret."""

    replica: str
    url: str
    authorization: bytes  # b"Bearer <secret>", or b"" when the engine wants none
    # The engine's name as its adapter gives it ("llama.cpp", "vllm"): whether and how a
    # broken stream can be continued there (forward/migration.py). "" while snapshots carry none.
    engine: str = ""
    # What its profile serves (protocol.serving kinds), and the chat APIs (messages,
    # responses) its engine serves itself; the router translates the others.
    serves: frozenset[str] = frozenset(DEFAULT_SERVES)
    native: frozenset[str] = frozenset()
    # The LoRA adapters it was started with, in load order (llama.cpp's ids), and how many
    # it holds when it loads more while it runs (vLLM; 0: none).
    adapters: tuple[str, ...] = ()
    max_loras: int = 0


@dataclass(frozen=True)
class ModelRoute:
    """One model as the router serves it."""

    name: str  # the catalog name, which is also the name the engine serves
    aliases: tuple[str, ...] = ()
    endpoints: tuple[Endpoint, ...] = ()
    wanted: int = 0
    states: dict[str, int] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    # Serving from the saved table: the endpoints left out because their engines did not
    # answer a health check, each as a sentence.
    unanswered: tuple[str, ...] = ()
    # "least_outstanding", or "prefix": requests that share a prompt prefix keep to one
    # replica (router/balance/prefix.py), so its engine's prefix cache serves them.
    routing: RoutingPolicy = LEAST_OUTSTANDING
    # Requests one replica serves at once; more wait in the router (balance/waiting.py).
    # 0: no limit.
    concurrency: int = 0
    # Replicas follow demand: with none ready, a request waits for one to start.
    autoscaled: bool = False
    # What its profiles serve together (protocol.serving kinds).
    serves: tuple[str, ...] = DEFAULT_SERVES
    # A LoRA adapter: its base model (whose replicas serve it), its name there, its scale,
    # and where an engine that loads adapters while it runs finds it. "" for a model.
    parent: str = ""
    adapter: str = ""
    scale: float = 1.0
    source: str = ""

    @property
    def names(self) -> frozenset[str]:
        return frozenset((self.name, *self.aliases))

    def serving(self, kind: str | None) -> ModelRoute:
        """This route with only the endpoints that serve ``kind`` (None: every kind)."""
        if kind is None or all(kind in e.serves for e in self.endpoints):
            return self
        return replace(self, endpoints=tuple(e for e in self.endpoints if kind in e.serves))

    def replica_ids(self) -> list[str]:
        return [endpoint.replica for endpoint in self.endpoints]

    def unavailable(self) -> tuple[str, int]:
        """Why no replica can take a request, in words, and when to try again."""
        states = self.states
        counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()) if s != "ready")
        head = f"No ready replica of {self.name}"
        if self.unanswered:
            return (
                f"{head}: the router is serving from its saved routing table (the database "
                f"does not answer) and {'; '.join(self.unanswered)}.",
                RETRY_STARTING,
            )
        if states.get("starting"):
            return f"{head}: {counts}; starting engines are usually seconds away.", RETRY_STARTING
        if states.get("placing"):
            return f"{head}: {counts}; placement is choosing nodes.", RETRY_PLACING
        if states.get("unplaceable"):
            why = "; ".join(dict.fromkeys(self.reasons)) or "no reason recorded"
            return f"{head}: {counts}. Placement says: {why}", RETRY_STUCK
        if self.reasons:
            return f"{head}: {'; '.join(self.reasons)}.", RETRY_STARTING
        if self.wanted == 0:
            return (
                f"{head}: none wanted (every profile of {self.name} has replicas: 0, or it "
                "has no profile); an operator raises replicas in the catalog.",
                RETRY_STUCK,
            )
        detail = f" ({counts})" if counts else ""
        return (
            f"{head}: {self.wanted} wanted, none running yet{detail}; the reconciler "
            "places them within seconds.",
            RETRY_PLACING,
        )


@dataclass(frozen=True)
class RoutingTable:
    """Every model, and each name or alias a client may ask for."""

    routes: dict[str, ModelRoute] = field(default_factory=dict)
    by_name: dict[str, ModelRoute] = field(default_factory=dict)
    loaded_at: float = 0.0  # time.time() of the load; 0 for the empty table
    # "database", "static" or "saved" (the database's last table, read from disk).
    source: str = ""

    @classmethod
    def from_snapshot(
        cls, snapshot: RoutingSnapshot, *, loaded_at: float | None = None,
        source: str = "database",
    ) -> RoutingTable:  # fmt: skip
        """Build a table; ``loaded_at`` is now unless the snapshot was loaded earlier."""
        routes: dict[str, ModelRoute] = {}
        for entry in snapshot.models:
            endpoints = tuple(
                Endpoint(
                    replica=e.replica,
                    url=e.url.rstrip("/"),
                    authorization=f"Bearer {e.secret}".encode() if e.secret else b"",
                    engine=e.engine,
                    serves=frozenset(e.serves),
                    native=frozenset(e.native),
                    adapters=tuple(e.adapters),
                    max_loras=e.max_loras,
                )
                for e in entry.endpoints
            )
            routes[entry.name] = ModelRoute(
                name=entry.name,
                aliases=tuple(entry.aliases),
                endpoints=endpoints,
                wanted=entry.wanted,
                states=dict(entry.states),
                reasons=tuple(entry.reasons),
                routing=entry.routing,
                concurrency=entry.concurrency,
                autoscaled=entry.autoscaled,
                serves=tuple(entry.serves),
                parent=entry.parent,
                adapter=entry.adapter,
                scale=entry.scale,
                source=entry.source,
            )
        return cls(
            routes=routes, by_name=_by_name(routes),
            loaded_at=time.time() if loaded_at is None else loaded_at, source=source,
        )  # fmt: skip

    def leaving_out(self, unanswered: dict[str, str]) -> RoutingTable:
        """This table without the endpoints of ``unanswered`` (replica -> why not)."""
        routes: dict[str, ModelRoute] = {}
        for name, route in self.routes.items():
            out = [e for e in route.endpoints if e.replica in unanswered]
            routes[name] = route if not out else replace(
                route,
                endpoints=tuple(e for e in route.endpoints if e.replica not in unanswered),
                unanswered=tuple(
                    f"the engine at {e.url} (replica {e.replica[:8]}) did not answer its "
                    f"health check: {unanswered[e.replica]}"
                    for e in out
                ),
            )  # fmt: skip
        return replace(self, routes=routes, by_name=_by_name(routes))

    def engine_hosts(self) -> set[str]:
        """The host of every engine this table routes to: nodes of the fleet."""
        return {
            urlsplit(endpoint.url).hostname or ""
            for route in self.routes.values()
            for endpoint in route.endpoints
        } - {""}


def _by_name(routes: dict[str, ModelRoute]) -> dict[str, ModelRoute]:
    by_name: dict[str, ModelRoute] = {}
    # Aliases first, so a model's own name wins over another model's alias.
    for route in routes.values():
        for alias in route.aliases:
            by_name.setdefault(alias, route)
    for route in routes.values():
        by_name[route.name] = route
    return by_name


class StaticEndpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    secret: str = ""
    # The chat APIs the server there answers itself; the router translates the others.
    native: list[TranslatedApi] = []
    # The server's engine, and the LoRA adapters it loaded, in its order (llama.cpp's ids).
    engine: str = ""
    adapters: list[str] = []
    # vLLM: adapters it holds at once when the router loads them on demand; 0: none.
    max_loras: int = Field(default=0, ge=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value


class StaticAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, pattern=r"^[^:]+$")
    aliases: list[str] = []
    scale: float = Field(default=1.0, gt=0)
    # Where an engine that loads adapters while it runs (vLLM) finds it.
    source: str = ""


class StaticModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    aliases: list[str] = []
    endpoints: list[StaticEndpoint] = Field(min_length=1)
    routing: RoutingPolicy = LEAST_OUTSTANDING
    # The router cannot know what a server it did not start serves: every kind, unless
    # the file says, and the server's own answer for what it does not.
    serves: list[ServeKind] = Field(default_factory=lambda: list(SERVE_KINDS), min_length=1)
    # Served as <name>:<adapter> by the endpoints that list it under their adapters.
    adapters: list[StaticAdapter] = []


class StaticKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the key")
    models: list[str] = []


class StaticFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[StaticModel] = []
    keys: list[StaticKey] | None = None
    # Serving without keys must be asked for in so many words.
    auth: bool = True


class StaticFileError(Exception):
    """A static routing file that cannot be used, naming the file, the entry and the field."""


def load_static(path: str) -> tuple[RoutingSnapshot, list[dict[str, Any]] | None]:
    """Read a static routing file: the table snapshot, and the keys (None: no auth).

    The format::

        models:
          - name: gemma
            aliases: [g]
            routing: prefix                 # optional; least_outstanding by default
            serves: [chat]                  # optional; every kind by default (protocol/serving.py)
            adapters:                       # optional: LoRA adapters, asked for as gemma:sql
              - name: sql
                scale: 1.0                  # optional
                source: /loras/sql          # optional: where vLLM loads it from on demand
            endpoints:
              - url: http://10.0.0.5:9001
                secret: engine-api-key      # optional
                native: [messages, responses]  # optional: served there, not translated
                engine: llama.cpp           # optional; with adapters, which it loaded
                adapters: [sql]             # in the order of its --lora flags
                max_loras: 4                # optional (vLLM): adapters loaded on demand
        keys:                               # required unless `auth: false`
          - name: team-a
            sha256: <hex>                   # printf %s KEY | sha256sum
            models: [gemma]                 # optional; empty means every model
    """
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise StaticFileError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise StaticFileError(f"{path}: not YAML: {exc}") from None
    try:
        parsed = StaticFile.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"{path}: {'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        ]
        raise StaticFileError("\n".join(problems)) from None
    if parsed.auth and parsed.keys is None:
        raise StaticFileError(
            f"{path}: keys: missing; list the keys clients may use, or set `auth: false` "
            "to serve without keys"
        )
    names = [m.name for m in parsed.models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise StaticFileError(f"{path}: models: {', '.join(duplicates)} listed twice")
    snapshot = RoutingSnapshot(
        models=[_static_model(m, adapter) for m in parsed.models for adapter in [None, *m.adapters]]
    )
    keys = None
    if parsed.auth:
        keys = [
            {"name": k.name, "prefix": k.name[:16], "sha256": k.sha256, "models": k.models}
            for k in parsed.keys or []
        ]
    return snapshot, keys


def _static_model(model: StaticModel, adapter: StaticAdapter | None) -> RoutableModel:
    """A static file's model, or one of its adapters on the endpoints that loaded it."""
    # A static endpoint has no replica id: its URL stands for one.
    endpoints = [
        ReplicaEndpoint(
            replica=e.url,
            url=e.url,
            secret=e.secret,
            serves=list(model.serves),
            native=list(e.native),
            engine=e.engine,
            adapters=list(e.adapters),
            max_loras=e.max_loras,
        )
        for e in model.endpoints
        if adapter is None or adapter.name in e.adapters or (e.max_loras and adapter.source)
    ]
    served = RoutableModel(
        name=model.name,
        aliases=model.aliases,
        wanted=len(endpoints),
        endpoints=endpoints,
        states={"ready": len(endpoints)},
        routing=model.routing,
        serves=list(model.serves),
    )
    if adapter is None:
        return served
    return served.model_copy(
        update={
            "name": adapter_id(model.name, adapter.name),
            "aliases": adapter.aliases,
            "parent": model.name,
            "adapter": adapter.name,
            "scale": adapter.scale,
            "source": adapter.source,
        }
    )
