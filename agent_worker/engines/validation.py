"""Checks an engine adapter runs on a profile before anything is launched.

Every check returns sentences an operator can act on, and every check runs in
microseconds: an engine that refuses a profile does so after minutes of loading,
so whatever can be refused here is refused here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from protocol.shard import ShardSpec

# Environment variables llmgw sets itself, and what to do instead of setting them.
OWNED_ENV: Mapping[str, str] = {
    "CUDA_VISIBLE_DEVICES": "llmgw sets it from the GPUs placement chose",
    "CUDA_DEVICE_ORDER": "llmgw pins it so GPU indices match what discovery reported",
    "NCCL_IB_HCA": "llmgw sets it from the fabric's active adapters; fix the fabric instead",
    "NCCL_SOCKET_IFNAME": "llmgw sets it from the fabric's socket_ifname; set that instead",
    "GLOO_SOCKET_IFNAME": "llmgw sets it from the fabric's socket_ifname; set that instead",
}

# The dynamic loader's own variables: what they name is loaded into the engine, as root.
# Refused from any profile, whoever signed the command (a control plane can be tampered
# with), unless this node's own agent file lists them under allow_env:.
LOADER_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT")


def flag_name(arg: str) -> str:
    """Return the flag an argument sets: ``--port=8080`` and ``--port`` are both ``--port``."""
    return arg.split("=", 1)[0] if arg.startswith("-") else ""


def validate_args(args: object) -> list[str]:
    """Return every way a profile's args list is malformed, before looking at what it says."""
    if not isinstance(args, list | tuple):
        return [f"args must be a list of strings, not {type(args).__name__}"]
    problems = []
    for index, arg in enumerate(args):
        where = f"args item {index + 1}"
        if not isinstance(arg, str):
            problems.append(
                f"{where} is {arg!r} ({type(arg).__name__}); quote it so it is a string"
            )
        elif not arg.strip():
            problems.append(f"{where} is empty; remove it")
        elif "\x00" in arg:
            problems.append(f"{where} holds a NUL byte, which no command line can carry")
        elif arg != arg.strip():
            problems.append(f"{where} {arg!r} has spaces around it; remove them")
        elif arg.startswith("-") and any(c.isspace() for c in flag_name(arg)):
            flag, _, value = arg.partition(" ")
            problems.append(
                f"{where} {arg!r} is a flag and its value in one item; "
                f"write them as two: [{flag!r}, {value.strip()!r}]"
            )
    return problems


def validate_env(env: object) -> list[str]:
    """Return every way a profile's env mapping is malformed."""
    if not isinstance(env, Mapping):
        return [f"env must be a mapping of names to strings, not {type(env).__name__}"]
    problems = []
    for key, value in env.items():
        if not isinstance(key, str) or not key:
            problems.append(f"env has a key {key!r}; names must be non-empty strings")
            continue
        if "=" in key or "\x00" in key or any(c.isspace() for c in key):
            problems.append(f"env name {key!r} holds '=', a space or a NUL; no process can get it")
        if not isinstance(value, str):
            problems.append(
                f"env {key} is {value!r} ({type(value).__name__}); quote it so it is a string"
            )
        elif "\x00" in value:
            problems.append(f"env {key} holds a NUL byte, which no environment can carry")
    return problems


def owned_flag_problems(args: Sequence[object], owned: Mapping[str, str]) -> list[str]:
    """Refuse args that set what llmgw sets: the engine would get two answers to one question."""
    problems = []
    seen: set[str] = set()
    for arg in args:
        if not isinstance(arg, str):
            continue
        flag = flag_name(arg)
        if flag in owned and flag not in seen:
            seen.add(flag)
            problems.append(f"args sets {flag}, which {owned[flag]}; remove it")
    return problems


def owned_env_problems(names: Iterable[object], extra: Mapping[str, str]) -> list[str]:
    """Refuse env names llmgw sets, common ones and the engine's own (``extra``)."""
    owned = {**OWNED_ENV, **extra}
    return [
        f"env sets {name}, which {owned[name]}; remove it"
        for name in names
        if isinstance(name, str) and name in owned
    ]


def loader_env_problems(env: Mapping[str, object], allowed: Collection[str]) -> list[str]:
    """Refuse the loader's variables (``LOADER_ENV``) that this node's config does not allow."""
    return [
        f"env sets {name}, which makes the loader run code in the engine as root; this node "
        "takes it only if its agent file lists it under allow_env:"
        for name in LOADER_ENV
        if name in env and name not in allowed
    ]


def parse_rendezvous(value: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too) into its parts, or raise ValueError saying why."""
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"rendezvous {value!r} is not host:port with a port from 1 to 65535")
    return host, int(port)


def common_problems(
    spec: ShardSpec, engine: str, launch_modes: Sequence[str], launch_mode_note: str = ""
) -> list[str]:
    """Check what every engine needs: the right engine, a sane rank, GPUs that fit, clean args."""
    problems = []
    if spec.engine != engine:
        problems.append(f"this shard is for engine {spec.engine!r}, not {engine}")
    if spec.launch_mode not in launch_modes:
        modes = " or ".join(launch_modes)
        note = f" ({launch_mode_note})" if launch_mode_note else ""
        problems.append(
            f"{engine} has no launch_mode {spec.launch_mode!r}{note}; set launch_mode: {modes}"
        )
    if spec.rank >= spec.world_size:
        problems.append(
            f"rank {spec.rank} is outside a replica of {spec.world_size} node(s); "
            f"ranks run from 0 to {spec.world_size - 1}"
        )
    problems += gpu_problems(spec)
    if spec.world_size > 1:
        if not spec.rendezvous:
            problems.append(
                f"a replica across {spec.world_size} nodes needs rank 0's rendezvous "
                "host:port, and this shard has none"
            )
        else:
            try:
                parse_rendezvous(spec.rendezvous)
            except ValueError as error:
                problems.append(str(error))
    problems += validate_args(spec.args)
    problems += validate_env(spec.env)
    return problems


def gpu_problems(spec: ShardSpec) -> list[str]:
    """Check that tensor_parallel fits the GPUs this shard was given."""
    problems = []
    gpus, tp = spec.gpus, spec.tensor_parallel
    duplicates = sorted({g for g in gpus if gpus.count(g) > 1})
    if duplicates:
        listed = ", ".join(str(g) for g in duplicates)
        problems.append(f"gpus lists GPU {listed} more than once; each GPU can be used once")
    if not gpus:
        if tp > 1:
            problems.append(
                f"tensor_parallel is {tp} but this shard was given no GPUs; "
                "set tensor_parallel: 1 for a CPU profile or ask for GPUs"
            )
    elif tp > len(gpus):
        problems.append(
            f"tensor_parallel is {tp} but this shard was given {len(gpus)} GPU(s) "
            f"({_gpu_list(gpus)}); ask for {tp} GPUs or lower tensor_parallel"
        )
    elif len(gpus) % tp:
        fits = ", ".join(str(n) for n in range(1, len(gpus) + 1) if len(gpus) % n == 0)
        problems.append(
            f"tensor_parallel {tp} does not divide the {len(gpus)} GPUs ({_gpu_list(gpus)}); "
            f"use one of {fits}"
        )
    return problems


def nccl_node_problems(spec: ShardSpec, engine: str, each_node_runs: str) -> list[str]:
    """Return what stops an engine that joins its nodes over NCCL (vLLM, SGLang) from
    spanning them: every rank needs GPUs, and ``tensor_parallel`` of them, since each node
    runs one tensor-parallel group (``each_node_runs`` says so in the engine's words)."""
    if spec.world_size == 1:
        return []
    if not spec.gpus:
        return [
            f"{engine} spans nodes over NCCL, which needs GPUs, and rank {spec.rank} was given none"
        ]
    if len(spec.gpus) != spec.tensor_parallel:
        return [
            f"across nodes each {engine} node runs {each_node_runs}: tensor_parallel is "
            f"{spec.tensor_parallel} but rank {spec.rank} was given {len(spec.gpus)} GPUs; "
            "set tensor_parallel to the GPUs per node"
        ]
    return []


def _gpu_list(gpus: Sequence[int]) -> str:
    return "GPU " + ", ".join(str(g) for g in gpus)
