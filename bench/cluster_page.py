"""Benchmark the cluster page at fleet scale: how long it takes to render, how big it is,
and how big one live push of its nodes is.

Run: DATABASE_URL=postgresql://… REDIS_URL=redis://… .venv/bin/python -m bench.cluster_page
         [--nodes 2000] [--query "state=unreachable"]

It creates (once) and migrates a database ``llmgw_bench_pages`` on the DATABASE_URL server,
so the seeded nodes never land in a real one, fills it with --nodes nodes as agents would
describe them (8 GPUs, two engines, a fabric, a fresh heartbeat; 1% unreachable, pools a
and b), and measures in this process, through Django's test client as an operator:

- render: GET / (the first page, and once with --query), median of 5 after one warm-up;
- size: the HTML of each;
- push: one live push of the nodes fragment, as the cluster page's socket renders it, and
  how long rendering it takes (median of 5 after one warm-up); and one push of
  heartbeats, which carries only the rows they changed (10 of the 50 shown, as 5 s
  heartbeats change in a second).

The figures are printed, never judged: compare runs made the same way on the same machine.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from bench.database import bench_django
from bench.report import median_seconds, ratio

BENCH_DATABASE = "llmgw_bench_pages"
GB = 1_000_000_000
NODE_PREFIX = "gpu"
WEIGHTS = "/var/lib/llmgw/weights"
ENGINES = [
    {"engine": "llama.cpp", "version": "b5000", "path": "/x", "status": "installed"},
    {"engine": "vllm", "version": "0.9", "path": "/y", "status": "installed"},
]


def seed(count: int) -> None:
    """``count`` nodes as a fleet's agents leave them: register, engines, a heartbeat."""
    from django.utils import timezone

    from audit.models import Event
    from fleet.models import Node, NodeState
    from protocol.inventory import Cpu, Gpu, Inventory, UsableFabric

    Event.objects.all().delete()
    Node.objects.all().delete()
    now = timezone.now()
    nodes = []
    for i in range(count):
        node_id = f"{NODE_PREFIX}{i:05d}"
        inventory = Inventory(
            hostname=node_id,
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            os="Debian GNU/Linux 12",
            kernel="6.1",
            arch="x86_64",
            cpu=Cpu(model="AMD EPYC 9654", cores=96, arch="x86_64", vector_extensions=["avx2"]),
            memory_total=1024 * GB,
            gpus=[
                Gpu(index=g, uuid=f"GPU-{i}-{g}", name="H100", memory_total=80 * GB, memory_used=0)
                for g in range(8)
            ],
            fabrics=[UsableFabric(name=f"ib-{i % 4}", adapters=["mlx5_0", "mlx5_1"])],
            weights_dir=WEIGHTS,
        )
        usage = {
            "cpu_percent": float(i % 100),
            "load": [2.5, 2.0, 1.5],
            "memory_total": 1024 * GB,
            "memory_used": 300 * GB,
            "memory_available": 700 * GB,
            "gpu_memory_used": {str(g): 12 * GB for g in range(8)},
            "filesystems": [{"path": WEIGHTS, "mount": "/", "total": 8000 * GB, "free": 5000 * GB}],
            "shards": {},
        }
        unreachable = i % 100 == 99
        heard = now - timedelta(seconds=30) if unreachable else now
        nodes.append(
            Node(
                id=node_id,
                address=inventory.address,
                state=NodeState.UNREACHABLE if unreachable else NodeState.CONNECTED,
                pool="a" if i % 2 == 0 else "b",
                inventory=inventory.model_dump(mode="json"),
                engines=ENGINES,
                usage=usage,
                usage_reported_at=heard,
                last_heartbeat=heard,
                registered_at=now - timedelta(hours=1),
                agent_version="0.1.0",
            )
        )
    Node.objects.bulk_create(nodes, batch_size=500)


def timed_get(client, path: str) -> tuple[float, int]:
    """Median seconds of 5 GETs after one warm-up, and the page's size in bytes."""

    def get():
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        return response

    seconds, response = median_seconds(get)
    return seconds, len(response.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--query", default="state=unreachable", help="a filtered view to time")
    args = parser.parse_args()
    with bench_django(BENCH_DATABASE):
        measure(args)


def measure(args: argparse.Namespace) -> None:
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from django.test.utils import setup_test_environment

    from catalog.permissions import OPERATORS_GROUP
    from fleet.pages import fragments

    setup_test_environment()
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    began = time.perf_counter()
    seed(args.nodes)
    print(f"seeded {args.nodes} nodes in {time.perf_counter() - began:.1f} s", flush=True)
    user, _ = User.objects.get_or_create(username="bench-operator")
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    client = Client()
    client.force_login(user)

    for path in ("/", f"/?{args.query}"):
        seconds, size = timed_get(client, path)
        print(f"GET {path:<28} {seconds * 1000:8.1f} ms median of 5, {size / 1024:8.1f} KiB")
    window, window_seconds = timed_push(fragments, [fragments.PAGES["cluster"].window], ())
    print(
        f"one push of the nodes fragment: {window / 1024:.1f} KiB, rendered in "
        f"{window_seconds * 1000:.1f} ms median of 5"
    )
    # At 5 s heartbeats, a push interval (1 s) holds a fifth of the rows shown.
    shown = [f"{NODE_PREFIX}{i:05d}" for i in range(0, 50, 5)]
    rows, rows_seconds = timed_push(fragments, [fragments.ROWS], shown)
    print(
        f"one heartbeat push ({len(shown)} of the 50 rows shown): {rows / 1024:.1f} KiB, "
        f"rendered in {rows_seconds * 1000:.1f} ms median of 5; "
        f"{ratio(window, rows, '.1f')}x smaller than the nodes fragment"
    )


def timed_push(fragments, names: list[str], rows) -> tuple[int, float]:
    """The size of one push of the cluster page (bytes) and the median of 5 renders."""
    seconds, push = median_seconds(
        lambda: fragments.render_push("cluster", "", True, names, None, rows)
    )
    return len(push.html.encode()), seconds


if __name__ == "__main__":
    main()
