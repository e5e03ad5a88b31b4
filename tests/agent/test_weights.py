"""Fetching weights over real HTTP: whole, resumed, checked, single-flight, with progress.

The server (``tests.agent.weights_server``) is a real ThreadingHTTPServer on 127.0.0.1
serving a generated file; it can leave out Content-Length, ignore Range, break off
mid-stream once, and hold the body.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from pathlib import Path

import pytest

from agent_worker.weights import (
    ChecksumMismatch,
    FetchCancelled,
    FetchSettings,
    WeightFetchError,
    WeightSourceError,
    WeightStore,
)
from agent_worker.weights.fetch import Flight
from agent_worker.weights.look import LookDirs, list_look_dirs
from tests.agent.weights_server import WeightsServer
from tests.support.polling import wait_until

SIZE = 256 * 1024
FAST = FetchSettings(progress_interval=0.0, attempts=3, backoff=0.01)


@pytest.fixture
def server():
    served = WeightsServer(os.urandom(SIZE))
    yield served
    served.stop()


@pytest.fixture
def store(tmp_path):
    return WeightStore(tmp_path / "weights", FAST)


# -- fetching ---------------------------------------------------------------------------


def test_a_url_is_fetched_whole_under_its_cache_name_with_a_record(server, store):
    path = store.fetch(server.url, sha256=server.sha256)

    assert path == store.path_for(server.url)
    assert path.parent == store.weights_dir
    assert re.fullmatch(r"[0-9a-f]{16}-model\.gguf", path.name)
    assert path.read_bytes() == server.data
    assert not path.with_name(path.name + ".partial").exists()
    record = json.loads(path.with_name(path.name + ".source.json").read_text())
    assert record["source"] == server.url and record["sha256"] == server.sha256
    assert len(server.requests) == 1
    assert server.requests[0]["User-Agent"] == "llmgw-agent"
    assert store.is_fetched(path)


def test_an_interrupted_transfer_resumes_with_only_the_rest(server, store):
    server.break_after = 100_000

    path = store.fetch(server.url, sha256=server.sha256)

    assert path.read_bytes() == server.data
    assert server.body_bytes == SIZE  # nothing sent twice
    assert server.requests[1]["Range"] == "bytes=100000-"
    assert server.requests[1]["If-Range"] == '"v1"'


def test_a_partial_left_by_an_earlier_run_is_resumed(server, store):
    partial = store.path_for(server.url).with_name(store.path_for(server.url).name + ".partial")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(server.data[:70_000])

    path = store.fetch(server.url, sha256=server.sha256)

    assert path.read_bytes() == server.data
    assert server.body_bytes == SIZE - 70_000


def test_a_server_that_ignores_range_is_fetched_again_from_the_start(server, store):
    server.honour_range = False
    server.break_after = 50_000

    path = store.fetch(server.url, sha256=server.sha256)

    assert path.read_bytes() == server.data
    assert server.body_bytes == 50_000 + SIZE
    assert len(server.requests) == 2


def test_a_whole_partial_is_installed_without_fetching_it_again(server, store):
    target = store.path_for(server.url)
    target.parent.mkdir(parents=True)
    target.with_name(target.name + ".partial").write_bytes(server.data)

    assert store.fetch(server.url, sha256=server.sha256).read_bytes() == server.data
    assert server.body_bytes == 0


def test_a_sha256_mismatch_is_refused_and_nothing_is_left_under_the_name(server, store):
    wrong = "0" * 64

    with pytest.raises(ChecksumMismatch) as refused:
        store.fetch(server.url, sha256=wrong)

    assert wrong in str(refused.value) and server.sha256 in str(refused.value)
    assert sorted(p.name for p in store.weights_dir.iterdir()) == []
    assert store.list_weights() == []


def test_eight_shards_share_one_download_and_all_see_its_progress(server, store):
    server.gate = threading.Event()
    paths, reports = [], {i: [] for i in range(8)}

    def shard(i):
        paths.append(store.fetch(server.url, on_progress=lambda *r: reports[i].append(r)))

    threads = [threading.Thread(target=shard, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    wait_until(lambda: store.active() == {server.url: 8})
    server.gate.set()
    for thread in threads:
        thread.join(10)

    assert len(server.requests) == 1
    assert paths == [store.path_for(server.url)] * 8
    assert all(seen[-1][:2] == (SIZE, SIZE) for seen in reports.values())
    assert store.active() == {}


def test_progress_without_content_length_has_no_total(server, store):
    server.send_length = False
    reports = []

    path = store.fetch(server.url, on_progress=lambda *r: reports.append(r))

    assert path.read_bytes() == server.data
    assert len(reports) > 2
    assert {total for _, total, _ in reports} == {None}
    assert [done for done, _, _ in reports] == sorted(done for done, _, _ in reports)
    assert reports[-1][0] == SIZE


class SteppingClock:
    """Every look at the clock is a quarter of a second after the last."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.25
        return self.now


def test_progress_comes_at_most_once_per_interval():
    clock, reports = SteppingClock(), []
    flight = Flight("https://example.com/m.gguf", Path("/nowhere"), "", FetchSettings(clock=clock))
    flight.watch(lambda *r: reports.append((clock.now, *r)))

    for step in range(1, 41):
        flight.progress(step * 1000, 40_000)
    flight.progress(40_000, 40_000, final=True)

    times = [at for at, *_ in reports]
    assert len(reports) == 11
    assert all(later - earlier >= 1.0 for earlier, later in zip(times, times[1:-1], strict=False))
    assert reports[1][1:] == (8000, 40_000, 4000.0)  # 4 steps of 1000 bytes in 1 s
    assert reports[-1][1:3] == (40_000, 40_000)


def test_a_late_watcher_is_told_at_once_how_far_the_download_has_got():
    flight = Flight(
        "https://example.com/m.gguf", Path("/nowhere"), "", FetchSettings(clock=SteppingClock())
    )
    flight.progress(5000, None, final=True)
    reports = []
    flight.watch(lambda *r: reports.append(r))
    assert [r[:2] for r in reports] == [(5000, None)]


def test_a_real_download_reports_rates_and_ends_whole(server, tmp_path):
    reports = []
    store = WeightStore(tmp_path, FetchSettings(clock=SteppingClock()))

    store.fetch(server.url, on_progress=lambda *r: reports.append(r))

    assert reports[-1][:2] == (SIZE, SIZE)
    assert all(rate is not None and rate >= 0 for *_, rate in reports)


def test_a_file_already_present_makes_no_request(server, store):
    target = store.path_for(server.url)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"already here")

    assert store.fetch(server.url, sha256=server.sha256) == target
    assert server.requests == []


def test_a_missing_file_is_a_clear_error_asked_once(server, store):
    with pytest.raises(WeightFetchError, match="answered 404"):
        store.fetch(server.url.replace("model.gguf", "other.gguf"))
    assert len(server.requests) == 1


def test_an_unreachable_server_is_retried_then_named(store):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/model.gguf"

    with pytest.raises(WeightFetchError, match=f"could not fetch {re.escape(url)}.*3 times"):
        store.fetch(url)


def test_the_last_caller_cancelling_stops_the_download(server, store):
    server.gate = threading.Event()
    cancel, raised = threading.Event(), []

    def shard():
        try:
            store.fetch(server.url, cancel=cancel)
        except FetchCancelled as exc:
            raised.append(exc)

    thread = threading.Thread(target=shard)
    thread.start()
    wait_until(lambda: store.active() == {server.url: 1})
    cancel.set()
    thread.join(2)
    assert raised and not thread.is_alive()
    server.gate.set()
    wait_until(lambda: store.active() == {})
    assert not store.path_for(server.url).exists()


def test_closing_the_store_ends_every_wait_and_keeps_the_partial(server, store):
    server.gate = threading.Event()
    server.break_after = 0
    raised = []

    def shard():
        try:
            store.fetch(server.url)
        except FetchCancelled as exc:
            raised.append(exc)

    thread = threading.Thread(target=shard)
    thread.start()
    wait_until(lambda: store.active() == {server.url: 1})
    store.close()
    server.gate.set()
    thread.join(5)
    assert raised and not thread.is_alive()
    assert not store.path_for(server.url).exists()


# -- sources ----------------------------------------------------------------------------


def test_a_local_path_is_used_as_is_and_a_hub_id_passes_through(store):
    local = store.resolve("/models/llama.gguf")
    assert (local.kind, local.model_path) == ("local", "/models/llama.gguf")
    hub = store.resolve("Qwen/Qwen2.5-7B-Instruct")
    assert (hub.kind, hub.path, hub.model_path) == ("hub", None, "")
    fetched = store.resolve("https://example.com/m/model.gguf?download=true")
    assert fetched.kind == "fetched" and fetched.path is not None
    assert fetched.path.parent == store.weights_dir
    assert fetched.path.name.endswith("-model.gguf")


@pytest.mark.parametrize(
    "source",
    [
        "",
        " /models/x.gguf",
        "../models/x.gguf",
        "./x.gguf",
        "file:///etc/passwd",
        "ftp://example.com/x.gguf",
        "http://example.com/x.gguf",
        "https://example.com/",
        "https://example.com/m/..",
        "https://example.com/m/%2e%2e",
        "https://example.com/m/a%2Fb.gguf",
        "https://example.com/m/.bashrc",
        "https://example.com/m/x.gguf.partial",
        "https://example.com/m/x.gguf.source.json",
        "https://example.com/m/x%00.gguf",
    ],
    ids=lambda s: s or "empty",
)
def test_odd_sources_are_refused_with_the_reason(store, source):
    with pytest.raises(WeightSourceError):
        store.resolve(source)


def test_a_url_path_never_leaves_the_weights_dir(store):
    path = store.path_for("https://example.com/../../../etc/passwd")
    assert path.parent == store.weights_dir
    assert path.name.endswith("-passwd")
    with pytest.raises(WeightSourceError):
        store.path_for("/models/x.gguf")


def test_a_bad_sha256_is_refused_before_any_request(server, store):
    with pytest.raises(WeightSourceError, match="not a hex SHA-256"):
        store.fetch(server.url, sha256="abc")
    assert server.requests == []


# -- what the directory holds -----------------------------------------------------------


def test_the_listing_holds_weights_and_never_a_partial(server, store, tmp_path):
    fetched = store.fetch(server.url)
    weights = store.weights_dir
    (weights / "operator.gguf").write_bytes(b"x" * 10)
    (weights / "0123456789abcdef-other.gguf.partial").write_bytes(b"half")
    (weights / "empty-dir").mkdir()
    (weights / "qwen").mkdir()
    (weights / "qwen" / "config.json").write_text("{}")
    (weights / "qwen" / "model.safetensors").write_bytes(b"x" * 8)
    (weights / ".hidden").write_text("x")

    assert store.list_weights() == [
        {"source": server.url, "path": str(fetched), "size": SIZE, "fetched": True},
        {"source": str(weights / "operator.gguf"), "path": str(weights / "operator.gguf"),
         "size": 10, "fetched": False},
        {"source": str(weights / "qwen"), "path": str(weights / "qwen"), "size": 10,
         "fetched": False},
    ]  # fmt: skip


def test_a_directory_is_weights_only_when_it_holds_a_model(store):
    # The look directories' rule: a config.json beside a .safetensors, or a GGUF file. A
    # half-copied model would send placement to a node that cannot serve it.
    weights = store.weights_dir
    for name, files in {
        "config-only": ["config.json"],
        "half-copied": ["config.json", "tokenizer.json", "model.safetensors.index.json"],
        "no-config": ["model-00001-of-00002.safetensors"],
        "whole": ["config.json", "model.safetensors"],
        "gguf": ["qwen-q4.gguf"],
    }.items():
        (weights / name).mkdir(parents=True)
        for file in files:
            (weights / name / file).write_bytes(b"x" * 4)

    assert [Path(weight["path"]).name for weight in store.list_weights()] == ["gguf", "whole"]


def write_model(directory: Path, parts: list[str], index: list[str] | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    for part in parts:
        (directory / part).write_bytes(b"x" * 4)
    if index is not None:
        weight_map = {f"layer.{n}.weight": name for n, name in enumerate(index)}
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 8}, "weight_map": weight_map})
        )
    return directory


PARTS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


@pytest.mark.parametrize(
    ("present", "index", "credited"),
    [
        pytest.param(PARTS, PARTS, True, id="every-file-its-index-names"),
        pytest.param(PARTS[:1], PARTS, False, id="one-of-two-by-its-index"),
        pytest.param(PARTS[:1], None, False, id="one-of-two-by-their-names-before-the-index"),
        pytest.param(PARTS, None, True, id="both-parts-before-the-index"),
        pytest.param(
            ["a.safetensors", "b.safetensors"],
            ["a.safetensors", "b.safetensors"],
            True,
            id="parts-named-freely-all-there",
        ),  # fmt: skip
        pytest.param(
            ["a.safetensors"],
            ["a.safetensors", "b.safetensors"],
            False,
            id="parts-named-freely-one-missing",
        ),  # fmt: skip
    ],
)
def test_half_a_model_is_never_credited_as_weights(store, tmp_path, present, index, credited):
    """A partial download (some of the safetensors its index maps) is no model, in the
    weights directory and in a look directory alike."""
    held = write_model(store.weights_dir / "llama", present, index)
    looked = write_model(tmp_path / "look" / "llama", present, index)

    assert [w["path"] for w in store.list_weights()] == ([str(held)] if credited else [])
    found = [w["path"] for w in list_look_dirs(LookDirs(look=(tmp_path / "look",)))]
    assert found == ([str(looked)] if credited else [])


def test_an_index_that_does_not_read_or_an_empty_part_is_no_model(store):
    unreadable = write_model(store.weights_dir / "copying-index", PARTS, PARTS)
    (unreadable / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-')
    empty_part = write_model(store.weights_dir / "allocated", PARTS, PARTS)
    (empty_part / PARTS[1]).write_bytes(b"")  # created, not yet written

    assert store.list_weights() == []


def test_the_fingerprint_changes_only_when_the_listing_does(server, store):
    empty = store.fingerprint()
    assert store.fingerprint() == empty
    store.fetch(server.url)
    holding = store.fingerprint()
    assert holding != empty
    (store.weights_dir / "x.gguf.partial").write_bytes(b"half")
    assert store.fingerprint() == holding
    (store.weights_dir / "operator.gguf").write_bytes(b"x")
    assert store.fingerprint() != holding


def test_a_missing_weights_dir_holds_nothing(tmp_path):
    assert WeightStore(tmp_path / "absent").list_weights() == []


# -- reclaiming -------------------------------------------------------------------------


def test_reclaim_deletes_only_fetched_files_no_model_needs(server, store, tmp_path):
    kept = store.fetch(server.url)
    other_url = server.url + "?v=2"
    unused = store.fetch(other_url)
    weights = store.weights_dir
    operator = weights / "operator.gguf"
    operator.write_bytes(b"mine")
    lookalike = weights / "0123456789abcdef-looks-fetched.gguf"  # a cache name, no record
    lookalike.write_bytes(b"mine too")
    stale_partial = weights / "fedcba9876543210-gone.gguf.partial"
    stale_partial.write_bytes(b"half")
    outside = tmp_path / "precious.gguf"
    outside.write_bytes(b"precious")
    link = weights / "00000000000000aa-link.gguf"
    link.symlink_to(outside)

    deleted = store.reclaim_unused_weights({server.url})

    assert sorted(deleted) == sorted([unused, stale_partial])
    assert not unused.exists() and not unused.with_name(unused.name + ".source.json").exists()
    assert kept.exists() and operator.exists() and lookalike.exists()
    assert link.is_symlink() and outside.read_bytes() == b"precious"
    assert not store.is_fetched(link) and not store.is_fetched(lookalike)
    assert not store.is_fetched(outside)
    assert store.reclaim_unused_weights({server.url}) == []


def test_reclaim_spares_a_download_in_progress(server, store):
    server.gate = threading.Event()
    thread = threading.Thread(target=store.fetch, args=(server.url,))
    thread.start()
    wait_until(lambda: store.active() == {server.url: 1})
    wait_until(lambda: server.requests != [])

    assert store.reclaim_unused_weights(set()) == []
    server.gate.set()
    thread.join(10)
    assert store.path_for(server.url).read_bytes() == server.data
