"""How much memory a model needs where it runs, estimated from its file's own metadata.

Pure arithmetic: a ``ModelShape`` (what the file says: tensor bytes, layers, heads, head
sizes, vocabulary, trained context) and a profile's numbers in, a ``MemoryEstimate`` out:
the memory of each device of one rank, in three parts. The figures are llama.cpp's, checked
against llama-fit-params and a running llama-server's RSS (tests/processes/test_fit_llama.py):

- weights: the file's tensor data, split over every GPU of the replica (tensor parallel
  splits each layer, pipeline stages and llama.cpp's layer split share the layers out; either
  way each GPU holds its share), or over the nodes of a CPU replica;
- KV cache: keys and values of every layer in f16, for the tokens the engine holds:
  llama-server's ``-c`` is the total its slots share, vLLM and SGLang hold a full context
  for each sequence they serve at once;
- buffers: one batch's activations, logits and attention mask (the compute buffers
  llama.cpp reserves), its output buffer, and on a CPU rank the engine process itself.

Reading the files is ``catalog.fit.model_files``'s; this module never touches one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from core.humanize import format_bytes

# llama.cpp's physical batch (-ub) and the slots llama-server opens when not told (-np -1).
LLAMA_BATCH = 512
LLAMA_AUTO_SLOTS = 4
# llama.cpp rounds its context up to a multiple of this many tokens.
LLAMA_CONTEXT_STEP = 256
# vLLM's and SGLang's tokens per forward pass and most sequences sampled at once (their
# defaults); their buffers are the same arithmetic at that batch, not yet measured on them.
PYTHON_ENGINE_BATCH = 2048
PYTHON_ENGINE_OUTPUTS = 256
# Activations of one token that live at once at a batch's peak, in floats per embedding
# width: llama.cpp's compute buffer is 5 x n_embd x 4 bytes per token of the batch plus
# the logits (measured on three shapes with llama-fit-params, within 0.1%).
ACTIVATIONS_PER_TOKEN = 5
F32, F16 = 4, 2
# What llama-server holds on a CPU beyond llama.cpp's own buffers: the binary and its
# libraries, the tokenizer's tables, its threads and HTTP server (RSS of the demo model's
# server less weights, KV cache and buffers: 46 MiB).
LLAMA_SERVER_PROCESS = 48 << 20
# Serving these kinds asks the engine for every token's output, not one per sequence.
POOLED_SERVES = frozenset({"embeddings", "rerank"})


@dataclass(frozen=True)
class ModelShape:
    """What a model's file says about the memory it takes; kept on its catalog row."""

    file_format: str  # gguf | safetensors
    architecture: str
    parameters: int
    weight_bytes: int
    layers: int
    embedding: int
    heads: int
    kv_heads: int
    key_size: int  # per attention head
    value_size: int
    vocab: int
    trained_context: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelShape | None:
        """The shape stored on a row; None for one written in another layout."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            return None
        return cls(**data)

    def describe(self) -> str:
        """The shape in one line: "134.5M parameters, 30 layers, 9 heads (3 for keys and
        values) of 64, vocabulary 49152, trained on 8192 tokens"."""
        heads = f"{self.heads} heads"
        if self.kv_heads != self.heads:
            heads += f" ({self.kv_heads} for keys and values)"
        return (
            f"{_count(self.parameters)} parameters in {format_bytes(self.weight_bytes)}, "
            f"{self.layers} layers, {heads} of {self.key_size}, vocabulary {self.vocab}, "
            f"trained on {self.trained_context} tokens"
        )


@dataclass(frozen=True)
class MemoryEstimate:
    """The memory each device of one rank needs: each GPU, or the host of a CPU rank."""

    weights: int
    kv_cache: int
    buffers: int
    tokens: int  # the KV cache holds
    on_gpu: bool
    trained_context: bool = False  # tokens is the model's trained context: none was set
    adapters: int = 0  # the LoRA adapters it holds, as far as their files are known

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.buffers + self.adapters

    def describe(self) -> str:
        """ "needs 6.1 GiB per GPU: weights 4.4, KV cache at 8192 tokens 1.3, buffers 0.4"."""
        name, unit, digits = _unit(self.total)
        device = "GPU" if self.on_gpu else "rank"
        return f"needs {self.total / unit:.{digits}f} {name} per {device}: {self.parts()}"

    def parts(self) -> str:
        """The parts in the unit of the total, which the sentence around them names."""
        _name, unit, digits = _unit(self.total)

        def amount(size: int) -> str:
            return f"{size / unit:.{digits}f}"

        tokens = f"{self.tokens} tokens"
        if self.trained_context:
            tokens += " (the model's trained context)"
        parts = (
            f"weights {amount(self.weights)}, KV cache at {tokens} {amount(self.kv_cache)}, "
            f"buffers {amount(self.buffers)}"
        )
        return parts + (f", LoRA adapters {amount(self.adapters)}" if self.adapters else "")


def estimate(
    shape: ModelShape,
    *,
    engine: str,
    context: int = 0,
    concurrency: int = 0,
    gpus_per_rank: int = 0,
    nodes: int = 1,
    serves: list[str] | tuple[str, ...] = (),
    adapters: int = 0,
) -> MemoryEstimate:
    """What each device of one rank of a profile needs for ``shape``.

    The weights and KV cache are shared out over ``gpus_per_rank`` x ``nodes`` GPUs (or
    ``nodes`` hosts): tensor parallel splits every layer over its group, and the rest of a
    rank's GPUs, the nodes, or llama.cpp's layer split take whole layers each, so however
    ``tensor_parallel`` divides a rank's GPUs, each holds its share.
    """
    llama = engine == "llama.cpp"
    trained = not context
    tokens = context or shape.trained_context
    if llama:
        tokens = -(-tokens // LLAMA_CONTEXT_STEP) * LLAMA_CONTEXT_STEP
        slots = LLAMA_AUTO_SLOTS  # llmgw passes no -np; the routers hold what is beyond
    else:
        slots = max(1, concurrency)
        tokens *= slots
    devices = max(1, gpus_per_rank) * max(1, nodes)
    kv_per_token = shape.layers * shape.kv_heads * (shape.key_size + shape.value_size) * F16
    on_gpu = gpus_per_rank > 0
    pooled = bool(POOLED_SERVES.intersection(serves))
    batch = LLAMA_BATCH if llama else PYTHON_ENGINE_BATCH
    # Rows of logits reserved: llama.cpp one per token of a batch, vLLM and SGLang one per
    # sequence sampled. A GPU's buffers are committed when reserved, and pooled serving
    # writes every row; a chat on a CPU writes one per slot, and untouched pages take no RAM.
    reserved_outputs = batch if llama else PYTHON_ENGINE_OUTPUTS
    outputs = reserved_outputs if on_gpu or pooled else slots
    buffers = compute_buffer(shape, tokens=tokens, batch=batch, outputs=outputs)
    if not on_gpu:
        # The output buffer (the logits, and embeddings when pooled, handed back) lives in
        # the host's memory whatever runs the layers; it counts where the host is the device.
        buffers += outputs * (shape.vocab + (shape.embedding if pooled else 0)) * F32
        buffers += LLAMA_SERVER_PROCESS if llama else 0
    return MemoryEstimate(
        weights=-(-shape.weight_bytes // devices),
        kv_cache=-(-kv_per_token * tokens // devices),
        buffers=buffers,
        tokens=tokens,
        on_gpu=on_gpu,
        trained_context=trained,
        adapters=adapters,  # bytes of the LoRA adapters it holds (adapter_bytes)
    )


def compute_buffer(shape: ModelShape, *, tokens: int, batch: int, outputs: int) -> int:
    """llama.cpp's compute buffer for one batch: its activations at their peak, the logits
    of ``outputs`` tokens and the f16 attention mask over the ``tokens`` cached."""
    activations = batch * ACTIVATIONS_PER_TOKEN * shape.embedding * F32
    return activations + outputs * shape.vocab * F32 + tokens * batch * F16


@dataclass(frozen=True)
class Needs:
    """What placement asks of a node for one rank: the declared sizes, else the estimate.

    ``*_basis`` says where an estimated figure came from (for refusals and pages);
    ``warnings`` name a declared size below the estimate; ``unknown`` is why placement must
    wait (the estimate is on its way and nothing was declared in its stead).
    """

    memory: int
    gpu_memory: int
    memory_basis: str = ""
    gpu_memory_basis: str = ""
    warnings: list[str] = field(default_factory=list)
    unknown: str = ""


def needs(
    fit: MemoryEstimate | None,
    *,
    memory: int,
    gpu_memory: int,
    gpus_per_rank: int,
    pending: str = "",
) -> Needs:
    """Combine a profile's declared ``memory``/``gpu_memory`` with the estimate ``fit``.

    The estimate covers the device the model runs on: each GPU of a GPU profile, the host
    of a CPU one; the other stays as declared. ``pending`` says why the estimate is not
    there yet when it is coming (a URL's header being read); "" when none will come.
    """
    key = "gpu_memory" if gpus_per_rank else "memory"
    declared = gpu_memory if gpus_per_rank else memory
    values = {"memory": memory, "gpu_memory": gpu_memory}
    bases = {"memory": "", "gpu_memory": ""}
    warnings, unknown = [], ""
    if fit is not None and not declared:
        values[key], bases[key] = fit.total, f"estimated from its file: {fit.parts()}"
    elif fit is not None and declared < fit.total:
        warnings.append(
            f"{key}: {format_bytes(declared)} is less than the estimate, {fit.describe()}; "
            "applied as declared, but the engine may not start"
        )
    elif fit is None and not declared and pending:
        unknown = (
            f"the memory it needs is not known yet ({pending}); set {key}: to place it "
            "before the estimate comes"
        )
    return Needs(
        memory=values["memory"],
        gpu_memory=values["gpu_memory"],
        memory_basis=bases["memory"],
        gpu_memory_basis=bases["gpu_memory"],
        warnings=warnings,
        unknown=unknown,
    )


def _unit(size: int) -> tuple[str, int, int]:
    """The unit a total and its parts are written in, and the digits after the point."""
    for name, unit, digits in (("GiB", 1 << 30, 1), ("MiB", 1 << 20, 0), ("KiB", 1 << 10, 0)):
        if size >= unit:
            return name, unit, digits
    return "B", 1, 0


def _count(parameters: int) -> str:
    for suffix, unit in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if parameters >= unit:
            return f"{parameters / unit:.1f}{suffix}"
    return str(parameters)
