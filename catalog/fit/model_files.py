"""Read a model's shape (``catalog.fit.estimate.ModelShape``) from its files: a GGUF header, or a
safetensors directory's ``config.json`` and the files' sizes; for a URL the first megabytes
of the file (a ranged GET), for a hub id the repository's ``config.json`` and file list.

Local reads are quick (a header, a few stats) and only under the model roots
(``catalog.fit.roots``); the downloads are for a Celery task (``catalog.tasks``), never a
request. Every failure is a ``ModelFileError`` naming the source. Also the LoRA adapters'
sizes a rank holds (``adapter_bytes``), from their local files.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings

from catalog.fit.estimate import ModelShape
from catalog.fit.roots import OutsideModelRoots, from_a_download_host, under_a_model_root
from core.gguf import GgufError, GgufHeader, GgufIncomplete, read_header, read_header_bytes
from core.http import outbound_client
from protocol.sources import HUB_ID

# A GGUF header is the tokenizer's tables and one line per tensor: a few MiB for most
# models; fetch this much first, then twice as much until the header ends, up to the cap.
FIRST_BYTES = 8 << 20
MOST_BYTES = 128 << 20
TIMEOUT = 30.0
# Redirects a download follows (Hugging Face's resolve URL: one, to its CDN).
MOST_REDIRECTS = 3
# Bytes per parameter of a safetensors checkpoint, by the dtype its config names.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}
CONTENT_RANGE_TOTAL = re.compile(r"/(\d+)\s*$")


class ModelFileError(ValueError):
    """A source whose shape cannot be read; the message names it and why."""


def is_local(source: str) -> bool:
    return source.startswith("/")


def is_remote(source: str) -> bool:
    """A URL or a hub id: its shape comes from a download, in a task."""
    return source.startswith(("https://", "http://")) or bool(HUB_ID.match(source))


def read_local_shape(source: str) -> ModelShape:
    """The shape of a GGUF file or a safetensors directory under a model root here."""
    try:
        path = under_a_model_root(source)
    except OutsideModelRoots as err:
        raise ModelFileError(str(err)) from None
    try:
        if path.is_dir():
            return _safetensors_dir(path)
        size = path.stat().st_size
        return shape_of_gguf(read_header(path), size, source)
    except GgufError as err:
        raise ModelFileError(str(err)) from None
    except OSError as err:
        raise ModelFileError(f"cannot read {source} here: {err.strerror or err}") from None


def fetch_shape(source: str) -> ModelShape:
    """The shape of a GGUF at a URL, or of a hub repository's safetensors."""
    try:
        if source.startswith(("https://", "http://")):
            return _gguf_url(source)
        return _hub_repository(source)
    except httpx.HTTPError as err:
        raise ModelFileError(f"cannot read {source}: {err}") from None


def shape_of_gguf(header: GgufHeader, file_size: int, name: str) -> ModelShape:
    """What a GGUF header says; its tensor data is the file from ``data_start`` on."""
    layers, embedding = header.number("block_count"), header.number("embedding_length")
    heads = header.number("attention.head_count")
    if not (layers and embedding and heads):
        raise ModelFileError(
            f"{name} does not say its layers, width and attention heads (architecture "
            f"{header.architecture or 'unnamed'}); declare memory: or gpu_memory: for it"
        )
    head_size = embedding // heads
    embeddings = header.tensor("token_embd.weight")
    vocab = (
        header.number("vocab_size")
        or header.array_lengths.get("tokenizer.ggml.tokens", 0)
        or (embeddings.shape[1] if embeddings and len(embeddings.shape) > 1 else 0)
    )
    return ModelShape(
        file_format="gguf",
        architecture=header.architecture,
        parameters=sum(tensor.elements for tensor in header.tensors),
        weight_bytes=max(0, file_size - header.data_start),
        layers=layers,
        embedding=embedding,
        heads=heads,
        kv_heads=header.number("attention.head_count_kv") or heads,
        key_size=header.number("attention.key_length") or head_size,
        value_size=header.number("attention.value_length") or head_size,
        vocab=vocab,
        trained_context=header.number("context_length"),
    )


def shape_of_config(config: dict[str, Any], weight_bytes: int, name: str) -> ModelShape:
    """What a Hugging Face ``config.json`` says, with the checkpoint's size in bytes."""
    text = config.get("text_config")
    # A multimodal model's language half holds the numbers.
    merged = {**config, **(text if isinstance(text, dict) else {})}

    def number(*keys: str) -> int:
        for key in keys:
            value = merged.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return 0

    layers, embedding = number("num_hidden_layers", "n_layer"), number("hidden_size", "n_embd")
    heads = number("num_attention_heads", "n_head")
    if not (layers and embedding and heads):
        raise ModelFileError(
            f"the config.json of {name} does not say its layers, width and attention heads; "
            "declare memory: or gpu_memory: for it"
        )
    head_size = number("head_dim") or embedding // heads
    architectures = merged.get("architectures") or [merged.get("model_type", "")]
    dtype = str(merged.get("torch_dtype") or merged.get("dtype") or "bfloat16")
    return ModelShape(
        file_format="safetensors",
        architecture=str(architectures[0]),
        parameters=weight_bytes // DTYPE_BYTES.get(dtype, 2),
        weight_bytes=weight_bytes,
        layers=layers,
        embedding=embedding,
        heads=heads,
        kv_heads=number("num_key_value_heads") or heads,
        key_size=head_size,
        value_size=head_size,
        vocab=number("vocab_size"),
        trained_context=number("max_position_embeddings", "max_sequence_length", "n_positions"),
    )


def _safetensors_dir(path: Path) -> ModelShape:
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as err:
        raise ModelFileError(f"cannot read {config_path}: {err}") from None
    files = list(path.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{path} holds no .safetensors files")
    return shape_of_config(config, sum(file.stat().st_size for file in files), str(path))


def _gguf_url(url: str) -> ModelShape:
    try:
        from_a_download_host(url)
    except OutsideModelRoots as err:
        raise ModelFileError(str(err)) from None
    wanted = FIRST_BYTES
    with outbound_client("", TIMEOUT) as client:
        while True:
            data, total = _first_bytes(client, url, wanted)
            try:
                header = read_header_bytes(data, url)
            except GgufIncomplete:
                if len(data) < wanted or wanted >= MOST_BYTES:
                    raise ModelFileError(
                        f"the header of {url} does not end within its first "
                        f"{len(data) >> 20} MiB; declare memory: or gpu_memory: for it"
                    ) from None
                wanted *= 2
                continue
            except GgufError as err:
                raise ModelFileError(str(err)) from None
            return shape_of_gguf(header, total, url)


def _first_bytes(client: httpx.Client, url: str, count: int) -> tuple[bytes, int]:
    """The first ``count`` bytes of ``url`` and the file's whole size, reading no more even
    from a server that ignores the range; a redirect followed (a hub's ``resolve`` URL goes
    to its CDN) only to a download host, each hop checked before it is asked."""
    for _hop in range(MOST_REDIRECTS + 1):
        with client.stream("GET", url, headers={"Range": f"bytes=0-{count - 1}"}) as response:
            if not response.is_redirect:
                return _read_first(response, url, count)
            url = str(response.url.join(response.headers["location"]))
        try:
            from_a_download_host(url)
        except OutsideModelRoots as err:
            raise ModelFileError(f"a redirect led to {err}") from None
    raise ModelFileError(f"{url}: more than {MOST_REDIRECTS} redirects")


def _read_first(response: httpx.Response, url: str, count: int) -> tuple[bytes, int]:
    response.raise_for_status()
    match = CONTENT_RANGE_TOTAL.search(response.headers.get("content-range", ""))
    total = int(match.group(1)) if match else int(response.headers.get("content-length", 0))
    data = bytearray()
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) >= count:
            break
    if not total:
        raise ModelFileError(f"{url} does not say how large it is (no Content-Range or length)")
    return bytes(data[:count]), total


def _hub_repository(repo: str) -> ModelShape:
    hub = settings.MODEL_HUB_URL.rstrip("/")
    token = settings.MODEL_HUB_TOKEN
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with outbound_client(hub, TIMEOUT, headers) as client:
        config = client.get(f"/{repo}/resolve/main/config.json", follow_redirects=True)
        config.raise_for_status()
        listing = client.get(f"/api/models/{repo}/tree/main")
        listing.raise_for_status()
    sizes = [
        int(entry.get("lfs", {}).get("size") or entry.get("size") or 0)
        for entry in listing.json()
        if isinstance(entry, dict) and str(entry.get("path", "")).endswith(".safetensors")
    ]
    if not sizes:
        raise ModelFileError(f"{repo} on {hub} holds no .safetensors files at its top level")
    try:
        config_data = config.json()
    except ValueError as err:
        raise ModelFileError(f"the config.json of {repo} is not JSON: {err}") from None
    return shape_of_config(config_data, sum(sizes), repo)


def shape_facts(source: str) -> dict[str, Any]:
    """What a model row keeps of its file (``Model.file_shape``): the shape read, or why
    not. Downloads for a URL or hub id: call it from a task."""
    try:
        shape = fetch_shape(source) if is_remote(source) else read_local_shape(source)
    except ModelFileError as err:
        return {"source": source, "unreadable": str(err)}
    return {"source": source, "shape": shape.as_dict()}


def adapter_bytes(adapters: list[dict], max_loras: int) -> int:
    """What a rank's LoRA adapters hold, as their local files' sizes say (a URL's or a hub
    id's is not known here): every one on llama.cpp, which loads them all at start;
    ``max_loras`` of the largest on vLLM. 0 without adapters."""
    sizes = []
    for adapter in adapters:
        with contextlib.suppress(OSError, OutsideModelRoots):  # unknown here, as a URL's
            if adapter["source"].startswith("/"):
                sizes.append(under_a_model_root(adapter["source"]).stat().st_size)
    return max_loras * max(sizes, default=0) if max_loras else sum(sizes)
