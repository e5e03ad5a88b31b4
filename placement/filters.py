"""Filters: each one dimension a node must satisfy, refused in words an operator can act on.

Every filter runs on every node, so a node short of GPUs and of RAM says both
at once instead of revealing its problems one fix at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.humanize import count_of, format_bytes, format_need_and_have, plural
from placement.snapshot import (
    CONNECTED,
    DRAINING,
    LOST,
    UNREACHABLE,
    UNWALLED,
    FabricSnapshot,
    NodeSnapshot,
    PlacementRequest,
)


@dataclass(frozen=True)
class Refusal:
    """Why one node cannot take a replica.

    `sentence` is the node's own explanation; `shortfall` is the plural phrase
    that nodes refused the same way are counted under ("lack free GPU memory").
    """

    sentence: str
    shortfall: str


Filter = Callable[[NodeSnapshot, PlacementRequest], Refusal | None]

_STATE_REFUSALS = {
    DRAINING: Refusal("draining: takes no new replicas", "are draining"),
    UNREACHABLE: Refusal("unreachable: no recent heartbeat", "are unreachable"),
    LOST: Refusal("lost: no heartbeat for too long", "are lost"),
}


def node_connected(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse a node that is not connected; a draining one is refused too, and says so."""
    if node.state == CONNECTED:
        return None
    known = _STATE_REFUSALS.get(node.state)
    if known is not None:
        return known
    return Refusal(f"{node.state}: only connected nodes take replicas", f"are {node.state}")


def need_known(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse every node while the memory a replica needs is not known yet: placed on a
    guess, it could take a node it cannot run on, and the estimate is on its way."""
    if not request.waiting_for:
        return None
    return Refusal(request.waiting_for, "wait for the model's memory estimate")


def engine_installed(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse a node that reported its engines and lacks this one (or this version).

    A node that sent no list at all passes: that is what every agent older than
    engine probing reports, and emptying a fleet on an upgrade is worse.
    """
    if node.engines is None:
        return None
    engine, wanted = request.engine, request.engine_version
    installed = node.engines.get(engine, ())
    if installed and (not wanted or wanted in installed):
        return None
    # The node's own words for the version on its way beat "not installed".
    progress = sorted(
        (version, words)
        for (name, version), words in node.engine_progress.items()
        if name == engine and (not wanted or version == wanted)
    )
    if progress:
        version, words = progress[-1]
        sentence = f"{engine} {version} {words}"
    elif not installed:
        sentence = f"engine {engine} not installed"
    else:
        sentence = f"engine {engine} {', '.join(installed)} installed, needs {wanted}"
    shortfall = f"lack engine {engine} {wanted}" if wanted else f"lack engine {engine}"
    return Refusal(sentence, shortfall)


def in_pool(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse a node outside the pool the request names; no pool named places anywhere."""
    if not request.pool or node.pool == request.pool:
        return None
    where = f"in pool {node.pool}" if node.pool else "in no pool"
    return Refusal(f"{where}, needs pool {request.pool}", f"are not in pool {request.pool}")


def gpus_free(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse a node without enough free GPUs, counting only GPUs with the memory asked for."""
    wanted = request.gpus_per_rank
    if wanted == 0:
        return None
    fitting = sum(1 for gpu in node.gpus if gpu.memory_free >= request.gpu_memory)
    if fitting >= wanted:
        return None
    # The shortfall names the dimension an operator would change: free more GPUs,
    # or free memory on the ones that are free.
    shortfall = "lack free GPUs" if len(node.gpus) < wanted else "lack free GPU memory"
    if request.gpu_memory:
        memory = format_bytes(request.gpu_memory)
        basis = _basis(request.gpu_memory_basis)
        sentence = f"needs {count_of(wanted, 'GPU')} with {memory} free{basis}, has {fitting}"
        return Refusal(sentence, shortfall)
    return Refusal(f"needs {wanted} free {plural(wanted, 'GPU')}, has {fitting}", shortfall)


def ram_free(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse a node without the host RAM one rank needs."""
    if node.ram_free >= request.memory:
        return None
    need, have = format_need_and_have(request.memory, node.ram_free)
    basis = _basis(request.memory_basis)
    return Refusal(f"needs {need} RAM free{basis}, has {have}", "lack free RAM")


def _basis(words: str) -> str:
    return f" ({words})" if words else ""


def disk_free(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse a node without room for the weights, unless it holds or is fetching them.

    Holding the file is what used the space, so without the exception the node
    best placed to run a model would be the one most likely to be refused.
    """
    if node.disk_free >= request.disk or holds_or_fetches(node, request.weights_key):
        return None
    need, have = format_need_and_have(request.disk, node.disk_free)
    if request.weights_on_rank_0_only:  # enough to be a worker, not rank 0
        return Refusal(f"needs {need} disk free for rank 0's weights, has {have}",
                       "lack disk for rank 0's weights")  # fmt: skip
    return Refusal(f"needs {need} disk free for weights, has {have}", "lack disk for weights")


def fabric_active(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse a node with no usable fabric when the replica spans nodes."""
    if request.ranks <= 1 or any(fabric.usable for fabric in node.fabrics):
        return None
    sentence = f"no active fabric for a {request.ranks}-node replica"
    details = [_why_unusable(fabric) for fabric in node.fabrics]
    if details:
        sentence = f"{sentence} ({'; '.join(details)})"
    return Refusal(sentence, "lack an active fabric")


def ports_walled(node: NodeSnapshot, request: PlacementRequest) -> Refusal | None:
    """Refuse a node that cannot wall engine ports when the replica spans nodes: its
    rpc-server and rendezvous ports would answer anyone on the network."""
    if request.ranks <= 1 or node.firewall != UNWALLED:
        return None
    why = f": {node.firewall_problem}" if node.firewall_problem else ""
    return Refusal(
        f"cannot wall engine ports{why}; a {request.ranks}-node replica's rpc-server and "
        "rendezvous ports would be open to the network: install nftables on it, or set "
        "LLMGW_AGENT_FIREWALL=off there to accept that",
        "cannot wall engine ports",
    )


def _why_unusable(fabric: FabricSnapshot) -> str:
    if fabric.inactive_adapters:
        return f"{fabric.name}: {', '.join(fabric.inactive_adapters)} not active"
    if not fabric.adapters:
        return f"{fabric.name}: no adapter on this node"
    return f"{fabric.name}: not active"


def holds_or_fetches(node: NodeSnapshot, weights_key: str) -> bool:
    """Say whether the node has the weights or a shard is already fetching them there."""
    return bool(weights_key) and (
        weights_key in node.weights or weights_key in node.weights_fetching
    )


FILTERS: tuple[Filter, ...] = (
    need_known,
    node_connected,
    engine_installed,
    in_pool,
    gpus_free,
    ram_free,
    disk_free,
    fabric_active,
    ports_walled,
)


def refusals_for(node: NodeSnapshot, request: PlacementRequest) -> list[Refusal]:
    """Run every filter on the node and return every refusal, in filter order."""
    found = []
    for check in FILTERS:
        refusal = check(node, request)
        if refusal is not None:
            found.append(refusal)
    return found
