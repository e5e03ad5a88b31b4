"""The fleet as Prometheus metrics, from the latest heartbeats (no scrape target per node)
and the replica rows (replicas by model and state, and how many the catalog wants)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime

from django.db.models import Count, JSONField, Sum
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTransform
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from catalog.models import Profile
from fleet.models import Node, NodeState, Replica, Shard
from protocol.inventory import ShardUsage

# The two facts the scrape takes from each node's register, read in PostgreSQL: decoding
# and validating 2,000 inventories (3 KB of JSON each) for them was half the scrape. A
# field the node did not send reads as nothing (a GPU without an NVLink list: 0 peers).
CORES = KeyTransform("cores", KeyTransform("cpu", "inventory"))
GPU_LINKS = RawSQL(
    """SELECT coalesce(jsonb_agg(jsonb_build_array(
           gpu -> 'index',
           CASE WHEN jsonb_typeof(gpu -> 'nvlink_peers') = 'array'
                THEN jsonb_array_length(gpu -> 'nvlink_peers') ELSE 0 END)), '[]'::jsonb)
       FROM jsonb_array_elements(
           CASE WHEN jsonb_typeof(fleet_node.inventory -> 'gpus') = 'array'
                THEN fleet_node.inventory -> 'gpus' ELSE '[]'::jsonb END) AS gpu""",
    [],
    output_field=JSONField(),
)


class FleetCollector(Collector):
    """Collect node and shard gauges at scrape time from the database."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nodes, shard_usages = _node_families(timezone.now())
        yield from nodes
        yield from _shard_families(shard_usages)
        yield from _replica_families()


ShardUsages = list[tuple[str, str, ShardUsage]]  # (node, shard, its usage)


def _node_families(now: datetime) -> tuple[list[GaugeMetricFamily], ShardUsages]:
    """Each node's gauges from its register and latest heartbeat, and the shards' usage
    those heartbeats carry."""
    up = GaugeMetricFamily("llmgw_node_up", "1 when the node's agent is connected", labels=["node"])
    cpus = GaugeMetricFamily("llmgw_node_cpus", "CPU cores on the node", labels=["node"])
    cpu = GaugeMetricFamily(
        "llmgw_node_cpu_utilization_percent", "CPU use across all cores", labels=["node"]
    )
    load = GaugeMetricFamily("llmgw_node_load", "Load average", labels=["node", "period"])
    mem = GaugeMetricFamily("llmgw_node_memory_bytes", "RAM installed", labels=["node"])
    mem_used = GaugeMetricFamily("llmgw_node_memory_used_bytes", "RAM used", labels=["node"])
    mem_avail = GaugeMetricFamily(
        "llmgw_node_memory_available_bytes", "RAM available", labels=["node"]
    )
    disk = GaugeMetricFamily(
        "llmgw_node_disk_free_bytes", "Free disk where llmgw writes", labels=["node", "path"]
    )
    gpu_used = GaugeMetricFamily(
        "llmgw_gpu_memory_used_bytes", "GPU memory used", labels=["node", "gpu"]
    )
    nvlink = GaugeMetricFamily(
        "llmgw_gpu_nvlink_peers", "NVLink peers NVML reports (0: none or unknown)",
        labels=["node", "gpu"],
    )  # fmt: skip
    shard_usages: ShardUsages = []
    nodes = Node.objects.only("id", "state", "usage", "usage_reported_at").annotate(
        cores=CORES, gpu_links=GPU_LINKS
    )
    for node in nodes:
        up.add_metric([node.id], 1.0 if node.state == NodeState.CONNECTED else 0.0)
        if isinstance(node.cores, int):
            cpus.add_metric([node.id], node.cores)
        for index, peers in node.gpu_links:
            if isinstance(index, int):
                nvlink.add_metric([node.id, str(index)], peers)
        # A measurement that is not fresh is left out rather than repeated as if current.
        usage = node.usage_at(now)
        if usage is None:
            continue
        cpu.add_metric([node.id], usage.cpu_percent)
        for period, value in zip(("1m", "5m", "15m"), usage.load, strict=True):
            load.add_metric([node.id, period], value)
        mem.add_metric([node.id], usage.memory_total)
        mem_used.add_metric([node.id], usage.memory_used)
        mem_avail.add_metric([node.id], usage.memory_available)
        for fs in usage.filesystems:
            disk.add_metric([node.id, fs.path], fs.free)
        for index, used in usage.gpu_memory_used.items():
            gpu_used.add_metric([node.id, str(index)], used)
        shard_usages.extend((node.id, shard_id, shard) for shard_id, shard in usage.shards.items())
    families = [up, cpus, cpu, load, mem, mem_used, mem_avail, disk, gpu_used, nvlink]
    return families, shard_usages


def _shard_families(shard_usages: ShardUsages) -> list[GaugeMetricFamily]:
    """Each engine's cores and memory, labelled with the model it serves."""
    shard_cores = GaugeMetricFamily(
        "llmgw_shard_cpu_cores", "Cores an engine's process group uses",
        labels=["node", "shard", "model"],
    )  # fmt: skip
    shard_mem = GaugeMetricFamily(
        "llmgw_shard_memory_bytes", "Resident memory of an engine's process group",
        labels=["node", "shard", "model"],
    )  # fmt: skip
    # Only the shards heartbeats name: every shard ever placed would grow with history.
    ids = [shard_id for _node, shard_id, _shard in shard_usages]
    models_by_shard = dict(
        Shard.objects.filter(id__in=ids).values_list("id", "replica__model_name")
    )
    for node_id, shard_id, shard in shard_usages:
        labels = [node_id, shard_id, models_by_shard.get(shard_id, "")]
        shard_cores.add_metric(labels, shard.cpu_cores)
        shard_mem.add_metric(labels, shard.rss)
    return [shard_cores, shard_mem]


def _replica_families() -> list[GaugeMetricFamily]:
    """Replicas by model and state, and how many the catalog's profiles want."""
    replicas = GaugeMetricFamily(
        "llmgw_replicas", "Replicas by model and state", labels=["model", "state"]
    )
    wanted = GaugeMetricFamily(
        "llmgw_model_replicas_wanted", "Replicas the catalog's profiles ask for",
        labels=["model"],
    )  # fmt: skip
    for row in Replica.objects.values("model_name", "state").annotate(count=Count("id")):
        replicas.add_metric([row["model_name"], row["state"]], row["count"])
    for name, count in Profile.objects.values_list("model__name").annotate(n=Sum("replicas")):
        wanted.add_metric([name], count or 0)
    return [replicas, wanted]


def exposition(families: Iterable[Metric]) -> bytes:
    """Prometheus' text format for ``families``, as prometheus_client's generate_latest
    writes it, at a fleet's size several times faster: a node's label, escaped once, is
    reused by each of its ~27 series (54,648 samples at 2,000 nodes)."""
    lines: list[str] = []
    escaped: dict[str, str] = {}
    for family in families:
        help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines.append(f"# HELP {family.name} {help_text}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            labels = ""
            if sample.labels:
                parts = []
                for key, value in sorted(sample.labels.items()):
                    text = escaped.get(value)
                    if text is None:
                        text = escaped[value] = (
                            value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
                        )
                    parts.append(f'{key}="{text}"')
                labels = "{" + ",".join(parts) + "}"
            lines.append(f"{sample.name}{labels} {floatToGoString(sample.value)}")
    lines.append("")
    return "\n".join(lines).encode()
