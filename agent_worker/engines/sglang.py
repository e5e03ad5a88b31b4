"""SGLang's ``python -m sglang.launch_server``: one node, or several joined at rank 0.

SGLang's ``--tp-size`` counts GPUs across every node, so a replica of N nodes with
tensor_parallel T per node runs ``--tp-size N*T``. Every rank runs the same
command with its own ``--node-rank``; only rank 0 serves HTTP.
"""

from __future__ import annotations

import json
from typing import ClassVar

from agent_worker.engines.base import EngineAdapter, engine_env
from agent_worker.engines.command import LaunchCommand, SecretFile
from agent_worker.engines.validation import nccl_node_problems
from protocol.engine_args import COMMON_OWNED_FLAGS
from protocol.engine_serves import serve_owned_flags
from protocol.shard import ShardSpec

_PARALLEL = "llmgw sets from the profile's tensor_parallel and nodes"
_MULTI_NODE = "llmgw sets for a replica across nodes"
_MODEL = "llmgw sets to the weights it placed on this node"
_GPUS = "llmgw picks GPUs through CUDA_VISIBLE_DEVICES"


class SglangAdapter(EngineAdapter):
    """Run SGLang's launcher with ``binary`` as the Python that has SGLang installed."""

    name: ClassVar[str] = "sglang"
    launch_modes = ("native",)
    launch_mode_note = "SGLang joins its nodes itself, without Ray"
    owned_flags = {
        **COMMON_OWNED_FLAGS,
        "--model-path": _MODEL,
        "--model": _MODEL,
        "--served-model-name": "llmgw sets to the model's name, which clients send",
        "--tp-size": _PARALLEL,
        "--tp": _PARALLEL,
        "--tensor-parallel-size": _PARALLEL,
        "--pp-size": _PARALLEL,
        "--pipeline-parallel-size": _PARALLEL,
        "--dp-size": "would use GPUs placement did not give; run more replicas",
        "--data-parallel-size": "would use GPUs placement did not give; run more replicas",
        "--nnodes": _MULTI_NODE,
        "--node-rank": _MULTI_NODE,
        "--dist-init-addr": _MULTI_NODE,
        "--nccl-init-addr": _MULTI_NODE,
        "--base-gpu-id": _GPUS,
        "--context-length": "llmgw sets from the profile's context; set context: there instead",
        "--config": "llmgw passes the replica's secret in a config file of its own; "
        "set the options in args instead",
        **serve_owned_flags(name),  # --is-embedding
    }

    def engine_problems(self, spec: ShardSpec) -> list[str]:
        return nccl_node_problems(spec, "SGLang", "tensor_parallel GPUs")

    def commands(self, spec: ShardSpec, binary: str) -> list[LaunchCommand]:
        model = spec.model_path or spec.source
        tp = spec.tensor_parallel
        argv = [binary, "-m", "sglang.launch_server", "--model-path", model]
        argv += ["--served-model-name", spec.model, "--host", spec.host, "--port", str(spec.port)]
        argv += ["--tp-size", str(tp * spec.world_size)]
        stages = len(spec.gpus) // tp if spec.world_size == 1 else 1
        if stages > 1:
            argv += ["--pp-size", str(stages)]
        if spec.context:
            argv += ["--context-length", str(spec.context)]
        if spec.world_size > 1:
            argv += ["--nnodes", str(spec.world_size), "--node-rank", str(spec.rank)]
            argv += ["--dist-init-addr", spec.rendezvous]
        # Every rank: workers load the model as rank 0 does, an embedder or a generator.
        argv += self.serve_flags(spec.serves)
        argv += spec.args
        name = "sglang" if spec.rank == 0 else "sglang-worker"
        # SGLang reads no key from its environment; its --config file (YAML, by suffix)
        # takes any flag, so the secret goes there rather than on the command line.
        secrets: tuple[SecretFile, ...] = ()
        if spec.api_key:
            secrets = (SecretFile("--config", "sglang-secret.yaml", _yaml_secret(spec.api_key)),)
        return [
            LaunchCommand(argv=tuple(argv), env=engine_env(spec), name=name, secret_files=secrets)
        ]

    def version_command(self, binary: str) -> list[str]:
        return [binary, "-c", "import sglang; print(sglang.__version__)"]


def _yaml_secret(api_key: str) -> str:
    # A JSON string is a YAML scalar, whatever characters the secret holds.
    return f"api-key: {json.dumps(api_key)}\n"
