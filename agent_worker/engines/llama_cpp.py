"""llama.cpp's ``llama-server`` serving a GGUF file over HTTP, on one node or across several.

Across nodes llama.cpp's RPC backend splits the model's layers: ranks 1.. each run
``rpc-server`` on their engine port and rank 0 runs ``llama-server --rpc`` naming them all,
so here the workers listen and rank 0 connects (the reverse of vLLM and SGLang), and only
rank 0 opens the GGUF: rank 0 sends the workers their tensors, so they neither fetch the
weights nor need disk for them (``protocol.shard.ENGINE_RANKS``).
``rpc-server`` has no authentication and runs whatever tensor operations it is sent: it is
bound only to the address placement gave the rank, never to every interface.
"""

from __future__ import annotations

import logging
import os
from typing import ClassVar

from agent_worker.engines import prebuilt_launcher
from agent_worker.engines.base import EngineAdapter, engine_env
from agent_worker.engines.command import LaunchCommand, SecretFile
from core.gguf import GgufError, block_count
from protocol.engine_args import COMMON_OWNED_FLAGS
from protocol.engine_serves import serve_owned_env, serve_owned_flags
from protocol.shard import ShardSpec

log = logging.getLogger(__name__)

_SET_CONTEXT = "llmgw sets from the profile's context; set context: there instead"
_MODEL = "llmgw sets to the weights it placed on this node"
_LORA = "llmgw sets from the model's adapters:; list the adapter there instead"

# Offload every layer: llama-server stops at the model's real layer count.
ALL_LAYERS = "999"
# rpc-server's names beside llama-server: before llama.cpp renamed it, and after.
RPC_SERVERS = ("rpc-server", "ggml-rpc-server")
# Addresses that would open rpc-server to every network the node is on.
_EVERY_INTERFACE = {"", "0.0.0.0", "::", "[::]"}


class LlamaCppAdapter(EngineAdapter):
    """Run ``llama-server`` on the GPUs given, or on the CPU when given none."""

    name: ClassVar[str] = "llama.cpp"
    launch_mode_note = "llama.cpp runs its own processes, across nodes over its RPC backend"
    owned_flags = {
        **COMMON_OWNED_FLAGS,
        "--api-key-file": COMMON_OWNED_FLAGS["--api-key"],
        "-m": _MODEL,
        "--model": _MODEL,
        "-mu": _MODEL,
        "--model-url": _MODEL,
        "-hf": _MODEL,
        "-hfr": _MODEL,
        "--hf-repo": _MODEL,
        "-a": "llmgw sets to the model's name, which clients send",
        "--alias": "llmgw sets to the model's name, which clients send",
        "-c": _SET_CONTEXT,
        "--ctx-size": _SET_CONTEXT,
        "--rpc": "llmgw sets to the worker ranks placement chose; set nodes: instead",
        "--lora": _LORA,
        "--lora-scaled": _LORA,
        "--lora-init-without-apply": _LORA,
        **serve_owned_flags(name),  # --embeddings, --reranking
    }
    owned_env = serve_owned_env(name)

    def engine_problems(self, spec: ShardSpec) -> list[str]:
        problems = []
        if spec.rank == 0 and not spec.model_path:
            problems.append(
                f"llama.cpp needs a GGUF file on this node, and {spec.source!r} was not "
                "resolved to one (model_path is empty); give the model a path or URL to a .gguf"
            )
        if spec.world_size > 1 and spec.host in _EVERY_INTERFACE:
            problems.append(
                f"rank {spec.rank} was told to listen on {spec.host or 'no address'!r}, which "
                "would open rpc-server (no authentication, runs any tensor operation it is "
                "sent) to every network; set the node's own address in its agent file"
            )
        for adapter in spec.adapters if spec.rank == 0 else []:
            if not adapter.path:
                problems.append(
                    f"llama.cpp loads a LoRA GGUF file, and adapter {adapter.name}'s source "
                    f"{adapter.source!r} was not resolved to one on this node; give it a path "
                    "or URL of a .gguf adapter"
                )
            elif "," in adapter.path:
                problems.append(
                    f"adapter {adapter.name}'s path {adapter.path} has a comma, which "
                    "llama-server's --lora reads as two files; move it to a path without one"
                )
        if spec.world_size > 1 and spec.rank == 0 and len(spec.workers) != spec.world_size - 1:
            problems.append(
                f"rank 0 of a replica across {spec.world_size} nodes needs the address of "
                f"each of its {spec.world_size - 1} workers, and was given {len(spec.workers)}"
            )
        return problems

    def binary_problems(self, spec: ShardSpec, binary: str) -> list[str]:
        if prebuilt_launcher.is_launcher(binary):
            # The launcher's own refusals, before anything starts: every flag the command
            # line would carry, the profile's args among them, and --rpc across nodes.
            argv = self.commands(spec, binary)[0].argv[1:] if spec.rank == 0 else ["--rpc"]
            return prebuilt_launcher.refusals(list(argv), dict(spec.env))
        if spec.world_size > 1 and rpc_server_beside(binary) is None:
            return [
                f"this llama.cpp build ({binary}) has no rpc-server beside llama-server, so "
                "it cannot span nodes; install a build made with -DGGML_RPC=ON, or set nodes: 1"
            ]
        return []

    def commands(self, spec: ShardSpec, binary: str) -> list[LaunchCommand]:
        if spec.rank > 0:
            return [self._rpc_worker(spec, binary)]
        argv = [binary, "-m", spec.model_path, "--alias", spec.model]
        argv += ["--host", spec.host, "--port", str(spec.port)]
        if spec.context:
            argv += ["-c", str(spec.context)]
        argv.append("--metrics")
        argv += self.serve_flags(spec.serves)
        if spec.world_size > 1:
            argv += ["--rpc", ",".join(spec.workers)]
        # CPU shards also say -ngl 0: CUDA_VISIBLE_DEVICES="" hides NVIDIA cards, not a
        # Vulkan or ROCm build's, and a CPU profile must stay on the CPU.
        argv += ["-ngl", _offloaded_layers(spec)]
        argv += _lora_flags(spec)
        argv += spec.args
        # By file: --api-key would show the replica's secret to anyone who runs ps.
        secrets = (SecretFile("--api-key-file", "api-key", spec.api_key),) if spec.api_key else ()
        return [
            LaunchCommand(
                argv=tuple(argv), env=engine_env(spec), name="llama-server", secret_files=secrets
            )
        ]

    def _rpc_worker(self, spec: ShardSpec, binary: str) -> LaunchCommand:
        # Only llmgw's flags: the profile's args are llama-server's, and none of them may
        # move rpc-server off the address placement gave this rank.
        argv = [rpc_server_beside(binary) or RPC_SERVERS[0]]
        argv += ["--host", spec.host, "--port", str(spec.port)]
        threads = _threads(spec.args)
        if threads:
            argv += ["--threads", threads]
        return LaunchCommand(argv=tuple(argv), env=engine_env(spec), name="rpc-server")

    def version_command(self, binary: str) -> list[str]:
        return [binary, "--version"]


def _lora_flags(spec: ShardSpec) -> list[str]:
    """Each adapter loaded, in the spec's order (its id in requests' ``lora`` field), and
    applied to none until a request asks: the router names every one in every request."""
    if not spec.adapters:
        return []
    flags = [arg for adapter in spec.adapters for arg in ("--lora", adapter.path)]
    return [*flags, "--lora-init-without-apply"]


def rpc_server_beside(binary: str) -> str | None:
    """The rpc-server of the same build as ``binary`` (llama-server), if it has one."""
    directory = os.path.dirname(binary)
    for name in RPC_SERVERS:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _offloaded_layers(spec: ShardSpec) -> str:
    """-ngl for rank 0: layers go to GPUs and to the RPC workers, the rest stay on its CPU.

    A CPU rank 0 keeps its 1/N share of the blocks: llama.cpp offloads the output layer
    and then the last blocks, -ngl counting both. GPUs and workers together take every layer.
    """
    if spec.gpus:
        return ALL_LAYERS
    if spec.world_size == 1:
        return "0"
    try:
        blocks = block_count(spec.model_path)
    except GgufError as err:
        log.warning("shard %s: %s; the workers take every layer", spec.shard_id, err)
        blocks = None
    if blocks is None:
        return ALL_LAYERS
    return str(blocks - blocks // spec.world_size + 1)


def _threads(args: list[str]) -> str:
    """The profile's thread count (llama-server's -t), which its workers run with too."""
    for index, arg in enumerate(args):
        if arg in ("-t", "--threads") and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return ""
