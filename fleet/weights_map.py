"""Where the weights are: which nodes and fabrics hold each model, counting a shared store
once.

A node holds what it lists itself, what lies on a shared store it reports (a declared
shared directory or a network filesystem), and a path source it runs an engine from. A
store is credited only to the nodes that report it: a node whose mount failed lists
nothing there, and crediting it by its fabric would send it shards that fail with
"model file … is not on this node". Bytes on a shared store count once in totals,
however many nodes see them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from catalog.models import Model
from fleet.models import Node, Shard, ShardState
from protocol.shard import adapter_id

# Past these, the agent has resolved a path source and an engine runs (or is loading) from
# it: the file is on that node, listed or not.
RUNS_FROM_ITS_SOURCE = (ShardState.STARTING, ShardState.READY)


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
    # node -> path sources it runs an engine from (held whether it lists them or not)
    runs_from: dict[str, frozenset[str]] = field(default_factory=dict)

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
        for weight in node.weight_files():
            source, size, store = weight.source, weight.size, weight.store
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
        for node_id in reporters[store]:
            held[node_id].update(files)
    runs_from = {n: sources for n, sources in _path_sources_running().items() if n in held}
    for node_id, sources in runs_from.items():
        held[node_id].update(sources)
    return WeightsMap(
        held={node_id: frozenset(sources) for node_id, sources in held.items()},
        fabrics=fabrics,
        total=sum(held_bytes.values()),
        held_bytes=dict(held_bytes),
        stores_of=stores_of,
        runs_from={node_id: frozenset(sources) for node_id, sources in runs_from.items()},
    )


def _path_sources_running() -> dict[str, set[str]]:
    """Node -> the path sources its engines run from.

    A path is used as is, never fetched, and only a look directory's files are listed: the
    demo's GGUF inside site-packages is listed by no node. The agent checks the file is
    there before it starts an engine, so a shard past that check shows the node has it.
    """
    running: dict[str, set[str]] = defaultdict(set)
    for node_id, source in Shard.objects.filter(
        node__isnull=False,
        state__in=RUNS_FROM_ITS_SOURCE,
        replica__profile__model__source__startswith="/",
    ).values_list("node_id", "replica__profile__model__source"):
        running[node_id].add(source)
    return running


def model_weights(mapped: WeightsMap | None = None) -> list[ModelWeights]:
    """Per catalog model: who holds it, on which fabrics, and who is fetching it."""
    mapped = mapped or weights_map()
    fetching: dict[str, dict[str, dict]] = defaultdict(dict)
    for model_name, node_id, progress in Shard.objects.filter(
        state=ShardState.FETCHING, node__isnull=False
    ).values_list("replica__model_name", "node_id", "progress"):
        fetching[model_name][node_id] = progress or {}
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
        # Its LoRA adapters are weights too: fetched, held and kept like the model's.
        for adapter in model.adapters:
            holders = mapped.holders(adapter["source"])
            rows.append(
                ModelWeights(
                    model=adapter_id(model.name, adapter["name"]),
                    source=adapter["source"],
                    nodes=holders,
                    fabrics=sorted({f for node in holders for f in mapped.fabrics.get(node, [])}),
                    stores=sorted(mapped.stores_of.get(adapter["source"], ())),
                    size=mapped.held_bytes.get(adapter["source"], 0),
                )
            )
    return rows


def _fabrics(node: Node) -> list[str]:
    facts = node.inventory_facts()
    return sorted(fabric.name for fabric in facts.fabrics) if facts else []
