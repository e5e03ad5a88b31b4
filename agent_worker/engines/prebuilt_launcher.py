"""llmgw's ``llama-server`` for a prebuilt llama.cpp wheel (xllamacpp): the flags llmgw
passes, turned into the wheel's ``CommonParams``, and llama.cpp's own HTTP server run in
this process until SIGTERM.

The installer writes this file as ``bin/llama-server`` into the wheel's virtualenv, so
it imports nothing but the standard library and xllamacpp (llmgw is not installed
there). A flag it does not know is refused by name, never passed over: a profile's
``--flash-attn on`` silently ignored would be a replica that is not what the catalog says.
The agent runs ``refusals()`` before launch as well (``LlamaCppAdapter.binary_problems``),
so the refusal is the shard's reason, not only a line in its log.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The line the installer writes under the shebang: how the agent tells this launcher from
# a compiled llama-server without running it.
TAG = "llmgw-prebuilt-llama-server"
ENGINE = "the prebuilt llama.cpp (xllamacpp)"
ELSEWHERE = (
    "llama-server from a llama.cpp release or source build takes it: name one in the "
    "catalog's engines: and pin it with engine_version:, or remove the flag"
)
POOLING = ("none", "mean", "cls", "last", "rank")
# What llama-server does without -np: four slots sharing one KV cache.
AUTO_PARALLEL = 4


@dataclass
class Launch:
    """What the flags asked for, in CommonParams' terms."""

    values: dict[str, Any] = field(default_factory=dict)  # CommonParams attribute -> value
    threads: int | None = None
    threads_batch: int | None = None
    pooling: str = ""
    lora: list[tuple[str, float]] = field(default_factory=list)
    version: bool = False
    read_files: bool = True  # False: only check the flags (the agent, before launch)


class Refused(ValueError):
    """Flags or values this launcher does not take, each said with what to do instead."""

    def __init__(self, *problems: str) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def _set(name: str, convert: Callable[[str], Any] = str) -> Callable[[Launch, str], None]:
    def apply(launch: Launch, value: str) -> None:
        launch.values[name] = convert(value)

    return apply


def _switch(name: str, value: Any) -> Callable[[Launch], None]:
    def apply(launch: Launch) -> None:
        launch.values[name] = value

    return apply


def _listed(value: str) -> list[str]:
    return [item for item in value.split(",") if item]


def _threads(launch: Launch, value: str) -> None:
    launch.threads = int(value)


def _threads_batch(launch: Launch, value: str) -> None:
    launch.threads_batch = int(value)


def _pooling(launch: Launch, value: str) -> None:
    if value not in POOLING:
        raise Refused(f"--pooling {value}: use one of {', '.join(POOLING)}")
    launch.pooling = value


def _reranking(launch: Launch) -> None:
    launch.values["embedding"] = True
    launch.pooling = "rank"


def _lora(launch: Launch, value: str) -> None:
    launch.lora += [(path, 1.0) for path in _listed(value)]


def _lora_scaled(launch: Launch, value: str) -> None:
    # llama-server's own form: FILE:SCALE, several separated by commas.
    for item in _listed(value):
        path, _, scale = item.rpartition(":")
        if not path:
            raise Refused(f"--lora-scaled {value}: write FILE:SCALE (several with commas)")
        launch.lora.append((path, float(scale)))


def _api_key_file(launch: Launch, value: str) -> None:
    if launch.read_files:
        with open(value, encoding="utf-8") as keys:
            launch.values["api_keys"] = [line.strip() for line in keys if line.strip()]


def _version(launch: Launch) -> None:
    launch.version = True


# flag spellings -> what its value sets
WITH_VALUE: dict[tuple[str, ...], Callable[[Launch, str], None]] = {
    ("-m", "--model"): _set("model.path"),
    ("-a", "--alias"): _set("model_alias", lambda value: set(_listed(value))),
    ("--host",): _set("hostnames", lambda value: [value]),
    ("--port",): _set("port", int),
    ("--api-key",): _set("api_keys", _listed),
    ("--api-key-file",): _api_key_file,
    ("-c", "--ctx-size"): _set("n_ctx", int),
    ("-np", "--parallel"): _set("n_parallel", int),
    ("-t", "--threads"): _threads,
    ("-tb", "--threads-batch"): _threads_batch,
    ("-ngl", "--gpu-layers", "--n-gpu-layers"): _set("n_gpu_layers", int),
    ("-b", "--batch-size"): _set("n_batch", int),
    ("-ub", "--ubatch-size"): _set("n_ubatch", int),
    ("--cache-reuse",): _set("n_cache_reuse", int),
    ("--pooling",): _pooling,
    ("--lora",): _lora,
    ("--lora-scaled",): _lora_scaled,
}
# flag spellings -> what it switches (flags without a value)
SWITCHES: dict[tuple[str, ...], Callable[[Launch], None]] = {
    ("--metrics",): _switch("endpoint_metrics", True),
    ("--slots",): _switch("endpoint_slots", True),
    ("--no-slots",): _switch("endpoint_slots", False),
    ("--props",): _switch("endpoint_props", True),
    ("--no-warmup",): _switch("warmup", False),
    ("--embedding", "--embeddings"): _switch("embedding", True),
    ("--reranking", "--rerank"): _reranking,
    ("--cache-prompt",): _switch("cache_prompt", True),
    ("--no-cache-prompt",): _switch("cache_prompt", False),
    ("--jinja",): _switch("use_jinja", True),
    ("--no-jinja",): _switch("use_jinja", False),
    ("--lora-init-without-apply",): _switch("lora_init_without_apply", True),
    ("--version",): _version,
}
# Flags llama-server takes that name something this build lacks, with why.
LACKS = {
    "--rpc": f"{ENGINE} has no RPC backend, so its replicas cannot span nodes; give the "
    "profile nodes: 1, or pin engine_version: to a llama.cpp build with rpc-server",
}


def is_launcher(binary: str) -> bool:
    """Whether ``binary`` is this launcher as the installer wrote it (read, never run)."""
    try:
        with open(binary, "rb") as file:
            lines = file.read(512).split(b"\n")
    except OSError:
        return False
    return len(lines) > 1 and lines[0].startswith(b"#!") and lines[1] == f"# {TAG}".encode()


def parse(
    argv: list[str], environ: dict[str, str] | None = None, read_files: bool = True
) -> Launch:
    """Read llama-server's flags into a Launch; raise Refused naming every flag or
    environment variable it does not take."""
    launch, problems = Launch(read_files=read_files), []
    environ = dict(os.environ if environ is None else environ)
    problems += [
        f"{name} is set: {ENGINE} reads no LLAMA_ARG_* variables; write the flag in args:"
        for name in sorted(environ)
        if name.startswith("LLAMA_ARG_")
    ]
    index = 0
    while index < len(argv):
        written = argv[index]
        flag, has_value, value = written.partition("=")
        index += 1
        setter = next((f for names, f in WITH_VALUE.items() if flag in names), None)
        switch = next((f for names, f in SWITCHES.items() if flag in names), None)
        try:
            if setter is not None:
                if not has_value:
                    if index >= len(argv):
                        raise Refused(f"{flag} needs a value")
                    value, index = argv[index], index + 1
                setter(launch, value)
            elif switch is not None and not has_value:
                switch(launch)
            else:
                # Its values are not flags of their own: skip them with it.
                while index < len(argv) and not _is_flag(argv[index]):
                    index += 1
                if flag in LACKS:
                    raise Refused(f"{flag}: {LACKS[flag]}")
                raise Refused(f"{written}: {ENGINE} does not take this flag; {ELSEWHERE}")
        except Refused as refused:
            problems += refused.problems
        except (ValueError, OSError) as error:
            problems.append(f"{flag} {value}: {error}")
    if problems:
        raise Refused(*problems)
    return launch


def _is_flag(arg: str) -> bool:
    try:
        float(arg)  # -1 is a value
    except ValueError:
        return arg.startswith("-")
    return False


def refusals(argv: list[str], environ: dict[str, str]) -> list[str]:
    """Each thing ``parse`` refuses in ``argv`` and ``environ`` (empty: it launches); the
    files flags name are not read."""
    try:
        parse(argv, environ, read_files=False)
    except Refused as refused:
        return refused.problems
    return []


def params_of(launch: Launch, xllamacpp: Any) -> Any:
    """The wheel's CommonParams for ``launch``, with llama-server's defaults where the
    wheel's differ (its four slots, threads-batch following threads)."""
    params = xllamacpp.CommonParams()
    values = dict(launch.values)
    if "n_parallel" not in values:
        values.update(n_parallel=AUTO_PARALLEL, kv_unified=True)
    for name, value in values.items():
        target, _, attribute = name.rpartition(".")
        setattr(params.model if target == "model" else params, attribute, value)
    if launch.threads is not None:
        params.cpuparams.n_threads = launch.threads
        params.cpuparams_batch.n_threads = launch.threads
    if launch.threads_batch is not None:
        params.cpuparams_batch.n_threads = launch.threads_batch
    if launch.pooling:
        name = f"LLAMA_POOLING_TYPE_{launch.pooling.upper()}"
        params.pooling_type = getattr(xllamacpp.llama_pooling_type, name)
    if launch.lora:
        params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(p, s) for p, s in launch.lora]
    return params


def main(argv: list[str] | None = None) -> int:
    try:
        launch = parse(sys.argv[1:] if argv is None else argv)
    except Refused as refused:
        for problem in refused.problems:
            print(f"llama-server (llmgw's launcher for {ENGINE}): {problem}", file=sys.stderr)
        return 2
    import xllamacpp

    if launch.version:
        print(f"version: xllamacpp {xllamacpp.__version__} (llmgw's llama-server launcher)")
        return 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    server = xllamacpp.Server(params_of(launch, xllamacpp))  # returns once it listens
    stop.wait()
    del server  # its destructor stops the HTTP server and frees the model
    return 0


if __name__ == "__main__":
    sys.exit(main())
