"""The fit estimate: a model's shape and a profile's numbers in, the memory each device of a
rank needs out, part by part. Pure arithmetic: the figures are llama.cpp's own (its KV cache
and compute buffers as llama-fit-params reports them; tests/processes/test_fit_llama.py
checks them against the real engine)."""

from __future__ import annotations

import pytest

from catalog.fit.estimate import MemoryEstimate, ModelShape, estimate, needs

MIB, GIB = 1 << 20, 1 << 30

# SmolLM2-135M as its GGUF header says (the demo model).
SMOLLM2 = ModelShape(
    file_format="gguf",
    architecture="llama",
    parameters=134_515_008,
    weight_bytes=96_576_768,
    layers=30,
    embedding=576,
    heads=9,
    kv_heads=3,
    key_size=64,
    value_size=64,
    vocab=49152,
    trained_context=8192,
)
# An 8B model with grouped-query attention, in 4.6 GiB of quantized weights.
LLAMA_8B = ModelShape(
    file_format="gguf",
    architecture="llama",
    parameters=8_030_261_248,
    weight_bytes=4_920_000_000,
    layers=32,
    embedding=4096,
    heads=32,
    kv_heads=8,
    key_size=128,
    value_size=128,
    vocab=128256,
    trained_context=131072,
)


def cpu(shape: ModelShape = SMOLLM2, **profile) -> MemoryEstimate:
    return estimate(shape, **{"engine": "llama.cpp", "context": 2048, **profile})


def test_the_kv_cache_holds_every_layers_keys_and_values_in_f16():
    # 30 layers x 2048 tokens x 3 KV heads x (64 + 64) x 2 bytes: llama.cpp's 45.00 MiB.
    assert cpu().kv_cache == 45 * MIB
    assert cpu().tokens == 2048


def test_the_weights_are_the_tensor_data_of_the_file():
    assert cpu().weights == SMOLLM2.weight_bytes


def test_llama_cpp_compute_buffers_are_one_batch_of_logits_activations_and_mask():
    # llama-fit-params on the demo file at -c 2048: compute 104.77 MiB; the estimate is a
    # formula of the shape, so within a few MiB of it, not byte for byte.
    fit = cpu(gpus_per_rank=1)
    assert fit.buffers == pytest.approx(105 * MIB, rel=0.03)


def test_a_cpu_rank_counts_only_the_buffers_a_chat_touches_and_the_process_itself():
    chat, embeddings = cpu(), cpu(serves=["embeddings"])
    # One logit row per slot, not per token of the batch: llama.cpp reserves the batch's
    # rows, but a chat never writes them, and untouched pages take no RAM.
    assert chat.buffers < cpu(gpus_per_rank=1).buffers
    # Pooled embeddings ask for every token's output: the whole batch is written.
    assert embeddings.buffers > cpu(gpus_per_rank=1).buffers


def test_no_context_means_the_trained_context():
    fit = cpu(context=0)
    assert fit.tokens == 8192
    assert "the model's trained context" in fit.describe()


def test_llama_cpp_rounds_its_context_up_to_256_tokens():
    assert cpu(context=1000).tokens == 1024


def test_llama_cpp_slots_share_one_context_and_python_engines_give_each_one_its_own():
    assert cpu(concurrency=8).kv_cache == cpu().kv_cache
    vllm = estimate(SMOLLM2, engine="vllm", context=2048, concurrency=8, gpus_per_rank=1)
    assert vllm.tokens == 8 * 2048
    assert vllm.kv_cache == 8 * cpu().kv_cache


@pytest.mark.parametrize(
    ("gpus_per_rank", "nodes", "share"),
    [(1, 1, 1), (2, 1, 2), (4, 1, 4), (2, 2, 4), (8, 2, 16)],
    ids=["one-gpu", "two-gpus", "four-gpus", "two-nodes-of-two", "two-nodes-of-eight"],
)
def test_weights_and_kv_cache_split_over_every_gpu_of_the_replica(gpus_per_rank, nodes, share):
    one = estimate(LLAMA_8B, engine="vllm", context=8192, gpus_per_rank=1)
    split = estimate(LLAMA_8B, engine="vllm", context=8192, gpus_per_rank=gpus_per_rank,
                     nodes=nodes)  # fmt: skip
    assert split.weights == -(-one.weights // share)
    assert split.kv_cache == -(-one.kv_cache // share)
    assert split.buffers == one.buffers  # each GPU holds a whole batch's buffers


def test_a_cpu_replica_across_nodes_splits_its_layers_over_them():
    assert cpu(nodes=2).weights == -(-SMOLLM2.weight_bytes // 2)


def test_the_description_gives_the_total_and_its_parts_in_one_unit():
    fit = MemoryEstimate(weights=int(4.4 * GIB), kv_cache=int(1.3 * GIB), buffers=int(0.4 * GIB),
              tokens=8192, on_gpu=True)  # fmt: skip
    assert fit.describe() == (
        "needs 6.1 GiB per GPU: weights 4.4, KV cache at 8192 tokens 1.3, buffers 0.4"
    )
    small = MemoryEstimate(
        weights=92 * MIB, kv_cache=45 * MIB, buffers=57 * MIB, tokens=2048, on_gpu=False
    )
    assert small.describe() == (
        "needs 194 MiB per rank: weights 92, KV cache at 2048 tokens 45, buffers 57"
    )


def test_an_undeclared_memory_takes_the_estimate_and_says_so():
    need = needs(cpu(), memory=0, gpu_memory=0, gpus_per_rank=0)
    assert need.memory == cpu().total
    assert need.memory_basis == "estimated from its file: " + cpu().parts()
    assert need.gpu_memory == 0 and not need.warnings and not need.unknown


def test_a_declared_memory_wins_and_one_below_the_estimate_is_warned_about():
    declared = needs(cpu(), memory=100 * MIB, gpu_memory=0, gpus_per_rank=0)
    assert declared.memory == 100 * MIB
    assert declared.memory_basis == ""
    assert declared.warnings == [
        f"memory: 100 MiB is less than the estimate, {cpu().describe()}; "
        "applied as declared, but the engine may not start"
    ]
    assert not needs(cpu(), memory=GIB, gpu_memory=0, gpus_per_rank=0).warnings


def test_a_gpu_profile_takes_the_estimate_for_each_gpu_and_its_host_memory_as_declared():
    fit = estimate(LLAMA_8B, engine="llama.cpp", context=8192, gpus_per_rank=1)
    need = needs(fit, memory=0, gpu_memory=0, gpus_per_rank=1)
    assert (need.gpu_memory, need.memory) == (fit.total, 0)
    assert need.gpu_memory_basis.startswith("estimated from its file: weights")
    short = needs(fit, memory=0, gpu_memory=4 * GIB, gpus_per_rank=1)
    assert short.warnings[0].startswith("gpu_memory: 4 GiB is less than the estimate")


def test_without_an_estimate_the_declared_values_stand_or_placement_waits_for_one():
    assert needs(None, memory=GIB, gpu_memory=0, gpus_per_rank=0).memory == GIB
    undeclared = needs(None, memory=0, gpu_memory=0, gpus_per_rank=0)
    assert (undeclared.memory, undeclared.unknown) == (0, "")
    waiting = needs(None, memory=0, gpu_memory=0, gpus_per_rank=0, pending="reading the header")
    assert waiting.unknown == (
        "the memory it needs is not known yet (reading the header); set memory: to place it "
        "before the estimate comes"
    )
    # A declared value needs no estimate to be placed.
    assert not needs(None, memory=GIB, gpu_memory=0, gpus_per_rank=0, pending="reading").unknown
