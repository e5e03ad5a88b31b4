"""Where the weights are, with real directories: a shared look directory seen by two nodes
of one fabric (found from fake sysfs trees), a local look directory seen by one, and
llmgw refusing to delete anything it did not fetch."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from agent_worker.discovery.infiniband import discover_adapters, usable_fabrics
from agent_worker.weights import WeightStore
from agent_worker.weights.look import LookDirs, list_look_dirs
from audit.actors import AGENT_LINK
from catalog.actions.entries import apply_catalog
from fleet.actions.reports import register_node, update_weights
from fleet.models import Node
from fleet.pages.mirror import mirror_detail
from fleet.planning.snapshot import node_snapshots
from fleet.weights_map import model_weights, weights_map
from protocol import messages
from tests.agent.fakes.sysfs import add_adapter
from tests.factories import SETUP, make_user
from tests.fleet.inventories import inventory

pytestmark = pytest.mark.django_db

GIB = 1 << 30


def model_file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.truncate(size)  # sparse: the size is what counts
    return path


def node_on(tmp_path: Path, node_id: str, fabric: str | None, look: LookDirs) -> None:
    """Register ``node_id`` as its agent would: fabrics from its sysfs, weights listed."""
    sysfs = tmp_path / f"sysfs-{node_id}"
    add_adapter(sysfs, "mlx5_0", {1: ("ACTIVE", 200)})
    declared = {fabric: ["mlx5_0"]} if fabric else {}
    fabrics, _warnings = usable_fabrics(declared, discover_adapters(sysfs))
    weights = [messages.WeightFile(**weight) for weight in list_look_dirs(look)]
    register = messages.Register(
        inventory=inventory(node_id, fabrics=fabrics), engines_probed=True, weights=weights
    )
    register_node(node_id, register, actor=AGENT_LINK)


@pytest.fixture
def fleet(tmp_path):
    shared = tmp_path / "lustre" / "models"
    gemma = model_file(shared / "gemma-3.gguf", 4 * GIB)
    local = tmp_path / "node-a-scratch"
    qwen = model_file(local / "qwen" / "qwen.gguf", 2 * GIB)
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\n/dev/sdb1 {local} xfs rw 0 0\n")
    node_on(tmp_path, "a", "ib-a", LookDirs(look=(local,), shared=(shared,), mounts=mounts))
    node_on(tmp_path, "b", "ib-a", LookDirs(shared=(shared,), mounts=mounts))
    node_on(tmp_path, "c", "ib-b", LookDirs(mounts=mounts))
    apply_catalog(
        f"""
models:
  - name: gemma-3
    source: {gemma}
    profiles: [{{name: cpu, engine: llama.cpp, replicas: 0, disk: 8GiB}}]
  - name: qwen
    source: {qwen}
    profiles: [{{name: cpu, engine: llama.cpp, replicas: 0, disk: 8GiB}}]
""",
        actor=SETUP,
    )
    return gemma, qwen, local, shared


def test_a_shared_model_is_held_by_both_nodes_of_its_fabric_and_counted_once(fleet):
    gemma, qwen, _local, _shared = fleet

    mapped = weights_map()
    rows = {row.model: row for row in model_weights(mapped)}

    assert rows["gemma-3"].nodes == ["a", "b"] and rows["gemma-3"].fabrics == ["ib-a"]
    assert rows["gemma-3"].size == 4 * GIB  # two nodes see it; one copy
    assert rows["qwen"].nodes == ["a"] and rows["qwen"].stores == []
    assert mapped.total == 6 * GIB
    # Placement sees the same: both hold gemma (so its disk need is waived), only a qwen.
    held = {snapshot.id: snapshot.weights for snapshot in node_snapshots(timezone.now())}
    assert str(gemma) in held["a"] and str(gemma) in held["b"] and str(gemma) not in held["c"]
    assert str(qwen) in held["a"] and str(qwen) not in held["b"]


def test_a_node_of_the_fabric_that_does_not_list_the_share_does_not_hold_it(fleet, tmp_path):
    # Its mount failed (or it was never told to look): crediting it sends placement there
    # without a disk check, and its engine fails with "model file … is not on this node".
    gemma, *_ = fleet
    node_on(tmp_path, "d", "ib-a", LookDirs(mounts=tmp_path / "mounts"))

    assert weights_map().holders(str(gemma)) == ["a", "b"]
    held = {snapshot.id: snapshot.weights for snapshot in node_snapshots(timezone.now())}
    assert str(gemma) not in held["d"]


def test_a_network_filesystem_is_one_store_for_the_nodes_that_mount_it(tmp_path):
    filer = tmp_path / "nfs"
    model_file(filer / "m.gguf", GIB)
    model_file(filer / "deeper" / "d.gguf", GIB)
    mounts = tmp_path / "mounts"
    mounts.write_text(f"filer:/export/llm {filer} nfs4 rw 0 0\n")
    local_mounts = tmp_path / "local-mounts"
    local_mounts.write_text(f"/dev/sdc1 {filer} ext4 rw 0 0\n")

    on_nfs = list_look_dirs(LookDirs(look=(filer, filer / "deeper"), mounts=mounts))
    [on_disk, _] = list_look_dirs(LookDirs(look=(filer,), mounts=local_mounts))
    [on_ib_a, _] = list_look_dirs(LookDirs(look=(filer,), mounts=mounts, fabrics=("ib-a",)))

    # As the server names it: no client's device number (each client numbers its own),
    # and one store whichever directory of it is looked in.
    assert [w["store"] for w in on_nfs] == ["nfs4:filer:/export/llm"] * 3
    assert on_ib_a["store"] == "ib-a/nfs4:filer:/export/llm"
    assert on_disk["store"] == ""  # local storage is never taken for shared
    assert not (filer / ".llmgw-share").exists()  # only a declared share is marked


def test_two_fabrics_with_their_own_filer_at_one_path_do_not_pool_their_weights(tmp_path):
    path = tmp_path / "lustre" / "models"
    gemma = model_file(path / "gemma-3.gguf", 4 * GIB)
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\n")
    node_on(tmp_path, "a", "ib-a", LookDirs(shared=(path,), mounts=mounts, fabrics=("ib-a",)))
    # ib-b's own filer, mounted at the same path on its nodes: other files, its own marker.
    path.rename(tmp_path / "ib-a-filer")
    qwen = model_file(path / "qwen.gguf", GIB)
    node_on(tmp_path, "c", "ib-b", LookDirs(shared=(path,), mounts=mounts, fabrics=("ib-b",)))

    mapped = weights_map()

    assert mapped.holders(str(gemma)) == ["a"]
    assert mapped.holders(str(qwen)) == ["c"]
    assert mapped.total == 5 * GIB
    [a_store] = mapped.stores_of[str(gemma)]
    [c_store] = mapped.stores_of[str(qwen)]
    assert a_store.startswith("ib-a/share:") and c_store.startswith("ib-b/share:")


def test_a_declared_share_is_named_by_its_marker_not_by_the_path_a_node_sees_it_at(tmp_path):
    # One filer, mounted at /models on one node and /mnt/llm on another: the marker the
    # first agent wrote is what both read.
    here, there = tmp_path / "models", tmp_path / "mnt-llm"
    model_file(here / "m.gguf", GIB)
    [first] = list_look_dirs(LookDirs(shared=(here,), fabrics=("ib-a",)))
    there.mkdir()
    (there / ".llmgw-share").write_text((here / ".llmgw-share").read_text())
    model_file(there / "m.gguf", GIB)
    [second] = list_look_dirs(LookDirs(shared=(there,), fabrics=("ib-a",)))

    marker = (here / ".llmgw-share").read_text().strip()
    assert first["store"] == second["store"] == f"ib-a/share:{marker}"
    assert (
        list_look_dirs(LookDirs(shared=(here,), fabrics=("ib-a",)))[0]["store"] == (first["store"])
    )  # read again, not written anew
    assert sorted(p.name for p in here.iterdir()) == [".llmgw-share", "m.gguf"]


def test_nothing_in_a_look_directory_is_ever_deleted(fleet, tmp_path):
    _gemma, qwen, local, shared = fleet
    before = sorted(p for p in (*local.rglob("*"), *shared.rglob("*")))
    # Even a weights directory that is the look directory itself: nothing there was fetched.
    for directory in (local, shared, tmp_path / "weights"):
        assert WeightStore(directory).reclaim_unused_weights(keep=[]) == []

    assert sorted(p for p in (*local.rglob("*"), *shared.rglob("*"))) == before
    assert qwen.exists()


def test_llmgw_ctl_weights_by_fabric_says_who_holds_what(fleet):
    out = StringIO()
    call_command("llmgw_ctl", "weights", "--by-fabric", stdout=out)
    table = out.getvalue()
    call_command("llmgw_ctl", "weights", "--by-fabric", "--json", stdout=(out := StringIO()))
    data = json.loads(out.getvalue())

    assert "total held: 6 GiB (a shared store counted once)" in table
    [gemma_line] = [line for line in table.splitlines() if line.startswith("gemma-3")]
    assert gemma_line.split()[:4] == ["gemma-3", "ib-a", "a,b", "4"]
    models = {row["model"]: row for row in data["models"]}
    assert models["qwen"]["nodes"] == ["a"] and data["total_bytes"] == 6 * GIB


def test_the_mirror_warns_when_no_node_able_to_serve_holds_or_can_fetch(fleet):
    apply_catalog(
        """
models:
  - name: big
    source: https://models.example/big.gguf
    profiles: [{name: cpu, engine: llama.cpp, replicas: 0, memory: 1TiB}]
""",
        actor=SETUP,
    )

    detail = mirror_detail("big")
    gemma = mirror_detail("gemma-3")

    assert detail["warnings"] == [
        "no node with llama.cpp and 1 TiB free holds big or can reach its URL"
    ]
    assert [row["node"] for row in gemma["holders"]] == ["a", "b"]
    assert gemma["held_bytes"] == 4 * GIB
    assert mirror_detail("nothing-of-that-name") is None


def test_the_mirror_page_needs_a_login_and_shows_readers_the_holders(fleet, client):
    assert client.get("/weights/gemma-3/").status_code == 302
    client.force_login(make_user("rita"))

    html = client.get("/weights/gemma-3/").content.decode()

    assert 'data-node="a"' in html and 'data-node="b"' in html and "4 GiB held" in html
    assert client.get("/weights/nothing/").status_code == 404


def test_llmgw_ctl_status_says_who_holds_each_model(fleet):
    out = StringIO()
    call_command("llmgw_ctl", "status", stdout=out)
    call_command("llmgw_ctl", "status", "--json", stdout=(as_json := StringIO()))

    lines = {line.split()[0]: line.split() for line in out.getvalue().splitlines()}
    assert lines["MODEL"][3:5] == ["HELD", "BY"]
    assert lines["gemma-3"][3:5] == ["a,b", "ib-a"] and lines["qwen"][3] == "a"
    models = {m["name"]: m for m in json.loads(as_json.getvalue())["models"]}
    assert models["gemma-3"]["held_by"] == ["a", "b"] and models["gemma-3"]["fetching"] == []


def test_a_weights_message_not_meant_as_a_list_changes_nothing(fleet):
    # listed: false is an agent with nothing to say, not one that holds nothing.
    held = Node.objects.get(id="a").weights
    assert held  # it listed its look directories

    update_weights("a", messages.Weights(listed=False, weights=[]), actor=AGENT_LINK)
    kept = Node.objects.get(id="a").weights
    update_weights("a", messages.Weights(listed=True, weights=[]), actor=AGENT_LINK)

    assert kept == held
    assert Node.objects.get(id="a").weights == []  # an empty list meant: it holds nothing
