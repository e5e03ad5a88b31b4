"""Where the weights are: which nodes and fabrics hold each model, counting a shared store
once.

A node holds what it lists itself, and what lies on a shared store it shares: a declared
shared directory is seen by every node of the fabrics of the nodes that report it, a
network filesystem (same type, source and device) by the nodes that report it. Bytes on
a shared store count once in totals, however many nodes see them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from catalog.models import Model
from fleet.models import Node, Shard, ShardState

DECLARED = "shared:"


@dataclass
class ModelWeights:
    """One model's weights across the fleet."""

    model: str
    source: str
    nodes: list[str] = field(default_factory=list)
    fabrics: list[str] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)  # shared stores it lies on
    size: int = 0  # bytes held, a shared store counted once
    fetching: dict[str, dict] = field(default_factory=dict)  # node -> progress


@dataclass
class WeightsMap:
    """What every node holds (own and shared), and the bytes counted once."""

    held: dict[str, frozenset[str]]  # node -> sources it holds
    fabrics: dict[str, list[str]]  # node -> its fabric names
    total: int  # bytes, each shared store once
    held_bytes: dict[str, int]  # source -> bytes of every copy, a shared store's once
    stores_of: dict[str, set[str]]  # source -> shared stores it lies on

    def holders(self, source: str) -> list[str]:
        return sorted(node for node, sources in self.held.items() if source in sources)


def weights_map(nodes: Iterable[Node] | None = None) -> WeightsMap:
    nodes = list(Node.objects.all() if nodes is None else nodes)
    fabrics = {node.id: _fabrics(node) for node in nodes}
    own: dict[str, set[str]] = defaultdict(set)
    store_files: dict[str, dict[str, int]] = defaultdict(dict)  # store -> source -> size
    reporters: dict[str, set[str]] = defaultdict(set)
    held_bytes: dict[str, int] = defaultdict(int)
    stores_of: dict[str, set[str]] = defaultdict(set)
    for node in nodes:
        for weight in node.weights or []:
            source, size, store = weight.get("source"), weight.get("size", 0), weight.get("store")
            if not source:
                continue
            own[node.id].add(source)
            if store:
                if source not in store_files[store]:
                    held_bytes[source] += size
                store_files[store][source] = size
                reporters[store].add(node.id)
                stores_of[source].add(store)
            else:
                held_bytes[source] += size
    held = {node.id: set(own[node.id]) for node in nodes}
    for store, files in store_files.items():
        for node_id in _seeing(store, reporters[store], fabrics):
            held.setdefault(node_id, set()).update(files)
    return WeightsMap(
        held={node_id: frozenset(sources) for node_id, sources in held.items()},
        fabrics=fabrics,
        total=sum(held_bytes.values()),
        held_bytes=dict(held_bytes),
        stores_of=stores_of,
    )


def model_weights(mapped: WeightsMap | None = None) -> list[ModelWeights]:
    """Per catalog model: who holds it, on which fabrics, and who is fetching it."""
    mapped = mapped or weights_map()
    fetching: dict[str, dict[str, dict]] = defaultdict(dict)
    for model, node_id, progress in Shard.objects.filter(
        state=ShardState.FETCHING, node__isnull=False
    ).values_list("replica__model_name", "node_id", "progress"):
        fetching[model][node_id] = progress or {}
    rows = []
    for model in Model.objects.order_by("name"):
        nodes = mapped.holders(model.source)
        rows.append(
            ModelWeights(
                model=model.name,
                source=model.source,
                nodes=nodes,
                fabrics=sorted({f for node in nodes for f in mapped.fabrics.get(node, [])}),
                stores=sorted(mapped.stores_of.get(model.source, ())),
                size=mapped.held_bytes.get(model.source, 0),
                fetching=fetching.get(model.name, {}),
            )
        )
    return rows


def _seeing(store: str, reporters: set[str], fabrics: dict[str, list[str]]) -> set[str]:
    """The nodes that see a shared store: its reporters and, for a declared shared
    directory, every node on a fabric of theirs."""
    if not store.startswith(DECLARED):
        return set(reporters)
    their_fabrics = {f for node in reporters for f in fabrics.get(node, [])}
    return set(reporters) | {
        node for node, names in fabrics.items() if their_fabrics.intersection(names)
    }


def _fabrics(node: Node) -> list[str]:
    facts = node.inventory_facts()
    return sorted(fabric.name for fabric in facts.fabrics) if facts else []
