"""/metrics: the fleet's gauges from each node's latest heartbeat, read at scrape time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings as django_settings
from prometheus_client.parser import text_string_to_metric_families

from core.secret_files import metrics_token
from fleet.link.heartbeats import write_heartbeats
from fleet.models import NodeState
from protocol.inventory import Filesystem, Gpu, NodeUsage, ShardUsage
from tests.factories import make_model, make_node, make_profile, make_replica, make_shard
from tests.fleet.inventories import inventory

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
GiB = 1 << 30


def usage(**fields) -> dict:
    """A heartbeat's usage as the batcher stores it: protocol NodeUsage dumped to JSON."""
    values = {
        "cpu_percent": 37.5,
        "load": (2.5, 1.25, 0.75),
        "memory_total": 64 * GiB,
        "memory_used": 24 * GiB,
        "memory_available": 40 * GiB,
        "gpu_memory_used": {0: 70 * GiB, 1: 3 * GiB},
        "filesystems": [
            Filesystem(path="/var/lib/llmgw/weights", mount="/", total=900 * GiB, free=512 * GiB)
        ],
    }
    values.update(fields)
    return NodeUsage(**values).model_dump(mode="json")


def gpu(index: int, peers: list[int] | None = None) -> Gpu:
    return Gpu(
        index=index, uuid=f"GPU-{index}", name="H100", memory_total=80 * GiB, memory_used=0,
        nvlink_peers=peers or [],
    )  # fmt: skip


def inventory_json(node_id: str, gpus: list[Gpu]) -> dict:
    return inventory(node_id).model_copy(update={"gpus": gpus}).model_dump(mode="json")


def gpu_node(node_id: str = "gpu01", **fields):
    """A node with two NVLinked GPUs and a third without links, heard from 5 s ago."""
    fields.setdefault("usage", usage())
    fields.setdefault("usage_reported_at", NOW - timedelta(seconds=5))
    fields.setdefault("last_heartbeat", fields["usage_reported_at"])
    gpus = [gpu(0, [1]), gpu(1, [0]), gpu(2)]
    return make_node(node_id, inventory=inventory_json(node_id, gpus), **fields)


def scrape(client, **headers) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics (with the metrics token) and return {(sample name, sorted labels): value}."""
    headers = {"Authorization": f"Bearer {django_settings.METRICS_TOKEN}", **headers}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def of(samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


@pytest.fixture
def at_now():
    with time_machine.travel(NOW, tick=False):
        yield


def test_every_gauge_carries_the_latest_heartbeat_exactly(client, at_now):
    node = make_node(
        "gpu01",
        inventory=inventory_json("gpu01", [gpu(0, [1, 2]), gpu(1, [0])]),
        usage_reported_at=NOW - timedelta(seconds=5),
        last_heartbeat=NOW - timedelta(seconds=5),
    )
    replica = make_replica()
    shard = make_shard(replica, node=node)
    node.usage = usage(shards={shard.id: ShardUsage(cpu_cores=3.5, rss=12 * GiB)})
    node.save(update_fields=["usage"])

    samples = scrape(client)

    n = (("node", "gpu01"),)
    assert of(samples, "llmgw_node_up") == {n: 1.0}
    assert of(samples, "llmgw_node_cpu_utilization_percent") == {n: 37.5}
    assert of(samples, "llmgw_node_cpus") == {n: 16.0}
    assert of(samples, "llmgw_node_load") == {
        (("node", "gpu01"), ("period", "1m")): 2.5,
        (("node", "gpu01"), ("period", "5m")): 1.25,
        (("node", "gpu01"), ("period", "15m")): 0.75,
    }
    assert of(samples, "llmgw_node_memory_bytes") == {n: float(64 * GiB)}
    assert of(samples, "llmgw_node_memory_used_bytes") == {n: float(24 * GiB)}
    assert of(samples, "llmgw_node_memory_available_bytes") == {n: float(40 * GiB)}
    assert of(samples, "llmgw_node_disk_free_bytes") == {
        (("node", "gpu01"), ("path", "/var/lib/llmgw/weights")): float(512 * GiB)
    }
    assert of(samples, "llmgw_gpu_memory_used_bytes") == {
        (("gpu", "0"), ("node", "gpu01")): float(70 * GiB),
        (("gpu", "1"), ("node", "gpu01")): float(3 * GiB),
    }
    assert of(samples, "llmgw_gpu_nvlink_peers") == {
        (("gpu", "0"), ("node", "gpu01")): 2.0,
        (("gpu", "1"), ("node", "gpu01")): 1.0,
    }
    shard_labels = (("model", replica.model_name), ("node", "gpu01"), ("shard", shard.id))
    assert of(samples, "llmgw_shard_cpu_cores") == {shard_labels: 3.5}
    assert of(samples, "llmgw_shard_memory_bytes") == {shard_labels: float(12 * GiB)}


def test_the_scrape_reads_the_latest_batched_heartbeat(client, at_now):
    gpu_node("gpu01", usage={}, usage_reported_at=None, last_heartbeat=None)
    write_heartbeats({"gpu01": (NOW - timedelta(seconds=7), usage(cpu_percent=10.0))})
    write_heartbeats({"gpu01": (NOW - timedelta(seconds=2), usage(cpu_percent=80.0))})
    assert of(scrape(client), "llmgw_node_cpu_utilization_percent") == {(("node", "gpu01"),): 80.0}


def test_a_gpu_without_nvlink_reports_zero_peers(client, at_now):
    gpu_node("gpu01")
    assert of(scrape(client), "llmgw_gpu_nvlink_peers") == {
        (("gpu", "0"), ("node", "gpu01")): 1.0,
        (("gpu", "1"), ("node", "gpu01")): 1.0,
        (("gpu", "2"), ("node", "gpu01")): 0.0,
    }


def test_a_shard_whose_replica_is_unknown_has_an_empty_model_label(client, at_now):
    node = gpu_node("gpu01")
    node.usage = usage(shards={"orphan": ShardUsage(cpu_cores=0.5, rss=GiB)})
    node.save(update_fields=["usage"])
    assert of(scrape(client), "llmgw_shard_cpu_cores") == {
        (("model", ""), ("node", "gpu01"), ("shard", "orphan")): 0.5
    }


USAGE_GAUGES = [
    "llmgw_node_cpu_utilization_percent",
    "llmgw_node_load",
    "llmgw_node_memory_bytes",
    "llmgw_node_memory_used_bytes",
    "llmgw_node_memory_available_bytes",
    "llmgw_node_disk_free_bytes",
    "llmgw_gpu_memory_used_bytes",
    "llmgw_shard_cpu_cores",
    "llmgw_shard_memory_bytes",
]


@pytest.mark.parametrize(
    ("age", "exported"),
    [
        pytest.param(timedelta(seconds=59), True, id="59s-old-is-exported"),
        pytest.param(timedelta(seconds=60), True, id="exactly-a-minute-is-exported"),
        pytest.param(timedelta(seconds=61), False, id="61s-old-is-left-out"),
        pytest.param(timedelta(hours=3), False, id="hours-old-is-left-out"),
    ],
)
def test_a_measurement_older_than_a_minute_is_left_out(client, at_now, age, exported):
    node = gpu_node("gpu01", usage_reported_at=NOW - age, last_heartbeat=NOW - age)
    node.usage = usage(shards={"s1": ShardUsage(cpu_cores=1.0, rss=GiB)})
    node.save(update_fields=["usage"])
    samples = scrape(client)
    for name in USAGE_GAUGES:
        assert bool(of(samples, name)) is exported, name
    # What the inventory says is not a measurement: it stays whatever the age.
    assert of(samples, "llmgw_node_cpus") == {(("node", "gpu01"),): 16.0}
    assert len(of(samples, "llmgw_gpu_nvlink_peers")) == 3


def test_time_passing_retires_a_measurement(client):
    with time_machine.travel(NOW, tick=False) as clock:
        gpu_node("gpu01", usage_reported_at=NOW)
        assert of(scrape(client), "llmgw_node_cpu_utilization_percent")
        clock.shift(timedelta(seconds=61))
        assert not of(scrape(client), "llmgw_node_cpu_utilization_percent")


def test_a_node_never_heard_from_exports_only_what_it_registered(client, at_now):
    make_node("fresh", inventory=inventory("fresh").model_dump(mode="json"))
    samples = scrape(client)
    assert of(samples, "llmgw_node_up") == {(("node", "fresh"),): 1.0}
    assert of(samples, "llmgw_node_cpus") == {(("node", "fresh"),): 16.0}
    assert not of(samples, "llmgw_node_cpu_utilization_percent")


@pytest.mark.parametrize(
    ("state", "up"),
    [
        pytest.param(NodeState.CONNECTED, 1.0, id="connected-is-up"),
        pytest.param(NodeState.UNREACHABLE, 0.0, id="unreachable-is-down"),
        pytest.param(NodeState.LOST, 0.0, id="lost-is-down"),
    ],
)
def test_node_up_follows_the_node_state(client, at_now, state, up):
    gpu_node("gpu01", state=state)
    assert of(scrape(client), "llmgw_node_up") == {(("node", "gpu01"),): up}


def test_every_node_is_exported_under_its_own_label(client, at_now):
    gpu_node("gpu01")
    gpu_node("gpu02", state=NodeState.UNREACHABLE, usage=usage(cpu_percent=99.0))
    samples = scrape(client)
    assert of(samples, "llmgw_node_up") == {(("node", "gpu01"),): 1.0, (("node", "gpu02"),): 0.0}
    assert of(samples, "llmgw_node_cpu_utilization_percent") == {
        (("node", "gpu01"),): 37.5,
        (("node", "gpu02"),): 99.0,
    }


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        pytest.param(None, 401, id="no-header"),
        pytest.param("Bearer wrong", 401, id="wrong-token"),
        pytest.param("s3cret", 401, id="token-without-bearer"),
        pytest.param("Bearer s3cret", 200, id="right-token"),
    ],
)
def test_a_metrics_token_guards_the_endpoint(client, settings, at_now, authorization, status):
    settings.METRICS_TOKEN = "s3cret"
    gpu_node("gpu01")
    headers = {"Authorization": authorization} if authorization else {}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == status
    if status == 401:
        assert b"LLMGW_METRICS_TOKEN" in response.content
        assert b"llmgw_node_up" not in response.content
    else:
        assert b'llmgw_node_up{node="gpu01"} 1.0' in response.content


def test_a_home_without_a_metrics_token_gets_one_made_once_and_kept_to_its_owner(tmp_path):
    """Review finding 20: /metrics is never open by default; `up` and the router make the
    same token on one host, and Prometheus is given the file's text."""
    made = metrics_token(tmp_path, environ={})
    assert len(made) >= 32
    assert (tmp_path / "metrics-token").read_text().strip() == made
    assert (tmp_path / "metrics-token").stat().st_mode & 0o777 == 0o600
    assert metrics_token(tmp_path, environ={}) == made  # kept, not made again
    assert metrics_token(tmp_path, environ={"LLMGW_METRICS_TOKEN": "set"}) == "set"
    assert metrics_token(tmp_path, environ={"LLMGW_METRICS_TOKEN": ""}) == made  # empty: unset


def test_replicas_are_counted_by_model_and_state_beside_what_the_catalog_wants(client, at_now):
    gemma = make_profile(make_model("gemma"), replicas=3)
    make_profile(gemma.model, name="gpu", replicas=1)
    make_replica(gemma, state="ready")
    make_replica(gemma, state="ready")
    make_replica(gemma, state="starting")
    make_profile(make_model("idle"), replicas=0)
    samples = scrape(client)
    assert of(samples, "llmgw_replicas") == {
        (("model", "gemma"), ("state", "ready")): 2.0,
        (("model", "gemma"), ("state", "starting")): 1.0,
    }
    assert of(samples, "llmgw_model_replicas_wanted") == {
        (("model", "gemma"),): 4.0,
        (("model", "idle"),): 0.0,
    }


@time_machine.travel(NOW, tick=False)
def test_the_scrape_writes_what_prometheus_client_would_byte_for_byte():
    from prometheus_client import CollectorRegistry, generate_latest

    from fleet.metrics import FleetCollector, exposition

    odd = Filesystem(path='/data/"quoted"\\back\nline', mount="/", total=GiB, free=GiB // 2)
    gpu_node("gpu01")
    gpu_node("gpu02", usage=usage(filesystems=[odd], memory_total=512 * GiB))
    make_replica(make_profile(make_model("gemma")), state="ready")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    expected = generate_latest(registry)
    assert b'\\"quoted\\"\\\\back\\nline' in expected  # the escapes were exercised
    assert exposition(FleetCollector().collect()) == expected
