"""llama.cpp's ``llama-server``: one process on one node, serving a GGUF file over HTTP."""

from __future__ import annotations

from typing import ClassVar

from agent_worker.engines.base import COMMON_OWNED_FLAGS, EngineAdapter, engine_env
from agent_worker.engines.command import LaunchCommand
from protocol.shard import ShardSpec

_SET_CONTEXT = "llmgw sets from the profile's context; set context: there instead"
_MODEL = "llmgw sets to the weights it placed on this node"

# Offload every layer: llama-server stops at the model's real layer count.
ALL_LAYERS = "999"


class LlamaCppAdapter(EngineAdapter):
    """Run ``llama-server`` on the GPUs given, or on the CPU when given none."""

    name: ClassVar[str] = "llama.cpp"
    launch_mode_note = "llama-server is one process on one node"
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
    }

    def engine_problems(self, spec: ShardSpec) -> list[str]:
        problems = []
        if spec.world_size > 1:
            problems.append(
                f"llama.cpp cannot span nodes; set nodes: 1 (this replica has {spec.world_size})"
            )
        if not spec.model_path:
            problems.append(
                f"llama.cpp needs a GGUF file on this node, and {spec.source!r} was not "
                "resolved to one (model_path is empty); give the model a path or URL to a .gguf"
            )
        return problems

    def commands(self, spec: ShardSpec, binary: str) -> list[LaunchCommand]:
        argv = [binary, "-m", spec.model_path, "--alias", spec.model]
        argv += ["--host", spec.host, "--port", str(spec.port)]
        if spec.context:
            argv += ["-c", str(spec.context)]
        argv.append("--metrics")
        # CPU shards also say -ngl 0: CUDA_VISIBLE_DEVICES="" hides NVIDIA cards, not a
        # Vulkan or ROCm build's, and a CPU profile must stay on the CPU.
        argv += ["-ngl", ALL_LAYERS if spec.gpus else "0"]
        if spec.api_key:
            argv += ["--api-key", spec.api_key]
        argv += spec.args
        return [LaunchCommand(argv=tuple(argv), env=engine_env(spec), name="llama-server")]

    def version_command(self, binary: str) -> list[str]:
        return [binary, "--version"]
