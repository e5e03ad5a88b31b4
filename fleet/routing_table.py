"""What the router needs from the database.

The producer's half of ``protocol/routing.py``: ``routing_snapshot()`` reads the catalog
and the replicas into the typed snapshot routers load (``audit.notices`` tells them to load
it again), and ``read_inflight_reports()`` reads back what each router carries
(``router/balance/inflight.py`` writes it). Models are imported inside the functions that read
them.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from audit.redis import redis_client
from protocol.engines import chosen_install
from protocol.routing import (
    INFLIGHT_KEY_PREFIX,
    PREFIX,
    ReplicaEndpoint,
    RoutableModel,
    RoutingSnapshot,
)
from protocol.serving import DEFAULT_SERVES, natively_served
from protocol.shard import adapter_id, loras_of

logger = logging.getLogger(__name__)


def read_inflight_reports() -> list[dict[str, Any]] | None:
    """Every live router's latest report; None when Redis cannot be read (nothing is known)."""
    try:
        client = redis_client()
        keys = list(client.scan_iter(match=INFLIGHT_KEY_PREFIX + "*", count=100))
        values = client.mget(keys) if keys else []
    except Exception as exc:
        logger.warning("could not read the routers' in-flight reports: %s", exc)
        return None
    reports = []
    for key, value in zip(keys, values, strict=True):
        if value is None:
            continue  # expired between the scan and the read
        try:
            report = json.loads(value)
            reports.append(
                {
                    "router": key.decode().removeprefix(INFLIGHT_KEY_PREFIX),
                    "at": float(report["at"]),
                    "routed": [str(r) for r in report.get("routed", [])],
                    "inflight": {str(k): int(v) for k, v in report.get("inflight", {}).items()},
                    # Its breakers' word that these do not answer; absent from older routers.
                    "failing": [str(r) for r in report.get("failing", [])],
                    "models": {
                        str(name): {"inflight": int(c["inflight"]), "queued": int(c["queued"])}
                        for name, c in report.get("models", {}).items()
                    },
                }
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            logger.warning("ignoring a malformed in-flight report under %s", key)
    return reports


def routing_snapshot() -> RoutingSnapshot:
    """Every routable model: ready endpoints, wanted count, and why others are not ready.

    Plain data, so the router process builds its table without holding ORM objects. An
    endpoint is rank 0's shard: ``http://<node.address>:<shard.port>``, with the replica's
    secret for the engine.
    """
    from django.db.models import Prefetch

    from catalog.models import Model
    from fleet.models import Replica, ReplicaState, Shard, without_reports

    rows = list(Model.objects.prefetch_related("profiles"))
    models: dict[str, RoutableModel] = {
        model.name: RoutableModel(
            name=model.name,
            aliases=list(model.aliases),
            wanted=sum(p.replicas for p in model.profiles.all()),
            # The tightest a profile asks for: one pick chooses among all its endpoints.
            concurrency=min(
                (p.concurrency for p in model.profiles.all() if p.concurrency), default=0
            ),
            autoscaled=any(p.autoscale for p in model.profiles.all()),
            serves=model.served_kinds,
        )  # fmt: skip
        for model in rows
    }
    adapters = _adapter_entries(rows, models)
    # Rank 0's node for its address, and its engines (a few entries) for what a replica
    # with no recorded version runs: its other reports are kilobytes of JSON a node.
    first_ranks = Shard.objects.filter(rank=0).select_related("node")
    unread = [name for name in without_reports("node") if name != "node__engines"]
    replicas = (
        Replica.objects.filter(state__in=ReplicaState.LIVE)
        .select_related("profile__model")
        .prefetch_related(Prefetch("shards", queryset=first_ranks.defer(*unread)))
    )
    for replica in replicas:
        # A replica whose model left the catalog still serves until it is stopped.
        entry = models.get(replica.model_name)
        if entry is None:
            entry = models[replica.model_name] = RoutableModel(name=replica.model_name)
        draining = replica.state == ReplicaState.READY and replica.draining_since is not None
        state = "draining" if draining else str(replica.state)
        entry.states[state] = entry.states.get(state, 0) + 1
        if replica.state == ReplicaState.UNPLACEABLE:
            entry.reasons.extend(str(reason) for reason in replica.reasons or [])
        if replica.state != ReplicaState.READY:
            continue
        if draining:
            # Being replaced: it finishes what it carries, and takes nothing new.
            entry.reasons.append(f"replica {str(replica.id)[:8]} is draining before it is replaced")
            continue
        rank0 = next(iter(replica.shards.all()), None)
        url = _endpoint_url(rank0)
        if url is None:
            entry.reasons.append(
                f"ready replica {str(replica.id)[:8]} has no address for rank 0 "
                "(its node sent no address, or the shard no port)"
            )
            continue
        endpoint = _endpoint(replica, rank0, url)
        entry.endpoints.append(endpoint)
        for adapter_entry, adapter in adapters.get(replica.model_name, []):
            _serve_adapter(adapter_entry, adapter, replica, endpoint)
        # One rule per model, since one pick chooses among all its endpoints: prefix as soon
        # as one routable replica's profile asks for it; one whose profile left the
        # catalog asks for nothing.
        if replica.profile is not None and replica.profile.routing == PREFIX:
            entry.routing = PREFIX
    for entries in adapters.values():
        for adapter_entry, _adapter in entries:
            _like_its_base(adapter_entry, models[adapter_entry.parent])
    return RoutingSnapshot(models=list(models.values()))


def _endpoint(replica, rank0, url: str) -> ReplicaEndpoint:
    """A ready replica as routers reach it."""
    # One whose profile left the catalog serves what every engine does by default.
    served: list[str] = (
        replica.profile.served_kinds if replica.profile else list[str](DEFAULT_SERVES)
    )
    return ReplicaEndpoint(
        replica=str(replica.id),
        url=url,
        secret=replica.secret,
        engine=replica.engine,
        serves=served,
        native=list[str](natively_served(replica.engine, _running_version(replica, rank0))),
        adapters=[str(name) for name in replica.adapters or []],
        max_loras=replica.profile.max_loras if replica.profile else 0,
    )


def _like_its_base(entry: RoutableModel, base: RoutableModel) -> None:
    """An adapter's replicas are its base's: their states, reasons and routing too."""
    entry.states = dict(base.states)
    entry.reasons = [*base.reasons, *entry.reasons]
    entry.routing = base.routing


def _adapter_entries(
    rows: list, models: dict[str, RoutableModel]
) -> dict[str, list[tuple[RoutableModel, dict]]]:
    """Each adapter as a model of its own (added to ``models``), by its base's name; its
    endpoints are its base's replicas that serve it, added as they are read."""
    adapters: dict[str, list[tuple[RoutableModel, dict]]] = {}
    for model in rows:
        base = models[model.name]
        for adapter in model.adapters:
            served_as = models[adapter_id(model.name, adapter["name"])] = RoutableModel(
                name=adapter_id(model.name, adapter["name"]),
                aliases=list(adapter.get("aliases", [])),
                wanted=sum(
                    p.replicas for p in model.profiles.all() if adapter in model.adapters_for(p)
                ),
                concurrency=base.concurrency,
                autoscaled=base.autoscaled,
                serves=base.serves,
                parent=model.name,
                adapter=adapter["name"],
                scale=float(adapter.get("scale", 1.0)),
                source=adapter["source"],
            )  # fmt: skip
            adapters.setdefault(model.name, []).append((served_as, adapter))
    return adapters


def _serve_adapter(entry: RoutableModel, adapter: dict, replica, endpoint: ReplicaEndpoint) -> None:
    """Route ``adapter`` to ``replica`` when it has it loaded, or can load it while it runs;
    else say why not, so a 503 for the adapter names the restart that would bring it."""
    profile = replica.profile
    if profile is None or adapter not in profile.model.adapters_for(profile):
        return  # a profile the adapter is not for
    loras = loras_of(replica.engine)
    if adapter["name"] in endpoint.adapters:
        entry.endpoints.append(endpoint)
    elif loras.at_runtime and endpoint.max_loras and not adapter["source"].startswith("http"):
        entry.endpoints.append(endpoint)  # the router loads it on demand
    else:
        entry.reasons.append(
            f"replica {str(replica.id)[:8]} started before adapter {adapter['name']} was "
            f"added and {replica.engine} loads adapters only at start; it has it once "
            f"restarted"
        )


def _running_version(replica, rank0) -> str:
    """The engine version the replica runs: the one the control plane resolved, else (the
    catalog declared none) the one its node runs for any version (protocol.engines)."""
    if replica.engine_version:
        return replica.engine_version
    install = chosen_install(rank0.node.engine_installs() or [], replica.engine)
    return install.version if install is not None else ""


def endpoint_url_of(replica) -> str | None:
    """Where routers reach ``replica`` (its rank 0), as the snapshot says it; None when its
    node or shard has not said."""
    return _endpoint_url(replica.shards.select_related("node").filter(rank=0).first())


def _endpoint_url(shard) -> str | None:
    if shard is None or shard.node is None or not shard.node.address or not shard.port:
        return None
    host = shard.node.address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"http://{host}:{shard.port}"
