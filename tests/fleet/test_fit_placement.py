"""Placement with the estimate from a model's file: a profile that declares no memory asks
for the estimate and is refused in its words; a URL's model waits until its header is read."""

from __future__ import annotations

import pytest

from catalog.actions.entries import apply_catalog
from catalog.models import Model, Profile
from catalog.tasks import read_model_file_task
from fleet.models import Replica
from fleet.planning.snapshot import placement_request
from tests.agent.weights_server import WeightsServer
from tests.factories import SETUP
from tests.fleet.cluster import connect, run
from tests.gguf_files import llama_model

pytestmark = pytest.mark.django_db

# About 6 GiB of f16 weights (a sparse file: it takes no disk).
BIG = {"layers": 32, "embedding": 4096, "heads": 32, "kv_heads": 8, "feed_forward": 4096,
       "vocab": 32000, "context": 8192}  # fmt: skip
SMALL = {"layers": 2, "embedding": 128, "heads": 4, "kv_heads": 2, "feed_forward": 256,
         "vocab": 500, "context": 1024}  # fmt: skip


def catalog(source: str, memory: str = "") -> str:
    return f"""
models:
  - name: gemma
    source: {source}
    profiles:
      - name: cpu
        engine: llama.cpp
        context: 4096
{f"        memory: {memory}" if memory else ""}
"""


def test_a_profile_without_memory_asks_for_the_estimate_and_is_refused_in_its_words(
    node_ids, tmp_path, django_capture_on_commit_callbacks
):
    path = llama_model(tmp_path / "big.gguf", **BIG, kind="f16")
    connect(node_ids[0], memory_total=4 << 30)
    apply_catalog(catalog(str(path)), actor=SETUP)
    profile = Profile.objects.get()
    fit = profile.fit()
    assert fit is not None and fit.weights > 5 << 30
    request = placement_request("gemma-0", profile)
    assert request.memory == fit.total
    assert request.memory_basis == f"estimated from its file: {fit.parts()}"
    run(django_capture_on_commit_callbacks)
    replica = Replica.objects.get()
    assert replica.state == "unplaceable"
    refusal = f"RAM free ({request.memory_basis}), has "
    assert any(
        reason.startswith(f"{node_ids[0]}: needs ") and refusal in reason
        for reason in replica.reasons
    ), replica.reasons


def test_a_declared_memory_is_placed_as_declared_whatever_the_estimate(
    node_ids, tmp_path, django_capture_on_commit_callbacks
):
    path = llama_model(tmp_path / "big.gguf", **BIG, kind="f16")
    connect(node_ids[0], memory_total=4 << 30)
    apply_catalog(catalog(str(path), memory="1GiB"), actor=SETUP)
    request = placement_request("gemma-0", Profile.objects.get())
    assert (request.memory, request.memory_basis) == (1 << 30, "")
    run(django_capture_on_commit_callbacks)
    assert Replica.objects.get().state == "starting"


def test_a_url_model_waits_for_its_header_then_is_placed_with_the_estimate(
    node_ids, tmp_path, django_capture_on_commit_callbacks, settings
):
    settings.LLMGW_FIT_DOWNLOAD_HOSTS = ["127.0.0.1"]  # the test's weights server's host
    data = llama_model(tmp_path / "small.gguf", **SMALL, kind="f16").read_bytes()
    server = WeightsServer(data, name="small.gguf")
    try:
        connect(node_ids[0])
        with django_capture_on_commit_callbacks() as sent:
            apply_catalog(catalog(server.url), actor=SETUP)
        assert sent, "reading the header is handed to a task once the apply commits"
        model = Model.objects.get()
        assert model.shape() is None
        run(django_capture_on_commit_callbacks)
        replica = Replica.objects.get()
        assert replica.state == "unplaceable"
        assert (
            f"{node_ids[0]}: the memory it needs is not known yet (its header at {server.url} "
            "is being read); set memory: to place it before the estimate comes"
        ) in replica.reasons
        # The task, as a worker runs it: a ranged read of the first bytes.
        assert read_model_file_task(model.id, server.url) == "read"
    finally:
        server.stop()
    assert Model.objects.get().shape() is not None
    run(django_capture_on_commit_callbacks)
    replica.refresh_from_db()
    assert replica.state == "starting"
    assert placement_request("gemma-0", Profile.objects.get()).memory_basis


@pytest.mark.parametrize(("engine", "read"), [("llama.cpp", False), ("vllm", True)])
def test_placement_asks_disk_of_the_workers_only_where_they_read_the_weights(engine, read):
    from tests.factories import make_profile

    profile = make_profile(engine=engine, nodes=2)
    request = placement_request("gemma-0", profile)
    assert request.workers_read_weights is read
    assert request.weights_on_rank_0_only is not read
