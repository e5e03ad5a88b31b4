"""The fleet as Prometheus metrics, from the latest heartbeats (no scrape target per node)
and the replica rows (replicas by model and state, and how many the catalog wants)."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Sum
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from catalog.models import Profile
from fleet.models import Node, NodeState, Replica, Shard


class FleetCollector(Collector):
    """Collect node and shard gauges at scrape time from the database."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = timezone.now()
        up = GaugeMetricFamily(
            "llmgw_node_up", "1 when the node's agent is connected", labels=["node"]
        )
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
        shard_cores = GaugeMetricFamily(
            "llmgw_shard_cpu_cores", "Cores an engine's process group uses",
            labels=["node", "shard", "model"],
        )  # fmt: skip
        shard_mem = GaugeMetricFamily(
            "llmgw_shard_memory_bytes", "Resident memory of an engine's process group",
            labels=["node", "shard", "model"],
        )  # fmt: skip
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
        models_by_shard = dict(Shard.objects.values_list("id", "replica__model_name"))
        for node in Node.objects.all():
            up.add_metric([node.id], 1.0 if node.state == NodeState.CONNECTED else 0.0)
            facts = node.inventory_facts()
            if facts is not None:
                cpus.add_metric([node.id], facts.cpu.cores)
                for gpu in facts.gpus:
                    nvlink.add_metric([node.id, str(gpu.index)], len(gpu.nvlink_peers))
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
            for shard_id, shard in usage.shards.items():
                labels = [node.id, shard_id, models_by_shard.get(shard_id, "")]
                shard_cores.add_metric(labels, shard.cpu_cores)
                shard_mem.add_metric(labels, shard.rss)
        yield from (
            up, cpus, cpu, load, mem, mem_used, mem_avail, disk, gpu_used, nvlink, shard_cores,
            shard_mem, replicas, wanted,
        )  # fmt: skip
