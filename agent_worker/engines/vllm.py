"""vLLM's ``vllm serve``: one node, several under Ray, or several under its own multiprocessing.

Across nodes each node runs one tensor-parallel group and the nodes are pipeline
stages (vLLM's own advice: tensor_parallel per node, pipeline across nodes).

- ``launch_mode: ray``: rank 0 runs a Ray head on the rendezvous port (a sidecar the
  server waits behind), then ``vllm serve`` against it; the other ranks only join
  the Ray cluster and run no vLLM process at all. vLLM's server blocks until Ray
  holds every GPU it needs, so rank 0 can start first and wait on its own.
- ``launch_mode: native`` or ``mp``: every rank runs ``vllm serve`` with
  ``--nnodes/--node-rank/--master-addr/--master-port``; ranks above 0 are
  ``--headless`` and serve no HTTP.
"""

from __future__ import annotations

import os
from typing import ClassVar

from agent_worker.engines.base import EngineAdapter, engine_env
from agent_worker.engines.command import LaunchCommand
from agent_worker.engines.validation import nccl_node_problems, parse_rendezvous
from protocol.engine_args import COMMON_OWNED_FLAGS
from protocol.engine_serves import serve_owned_flags
from protocol.shard import VLLM_DEFAULT_MAX_LORA_RANK, ShardSpec, adapter_id

_PARALLEL = "llmgw sets from the profile's tensor_parallel and nodes"
_MULTI_NODE = "llmgw sets for a replica across nodes"
_SET_CONTEXT = "llmgw sets from the profile's context; set context: there instead"

_LORA = "llmgw sets from the model's adapters: and the profile's max_loras"
# What lets routers load and unload adapters while vLLM runs (/v1/load_lora_adapter).
RUNTIME_LORA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

# Seconds to wait for a Ray head to listen before failing the shard.
RAY_HEAD_TIMEOUT = 60.0


class VllmAdapter(EngineAdapter):
    """Run ``vllm serve`` (``binary`` is the ``vllm`` entry point; ``ray`` sits beside it)."""

    name: ClassVar[str] = "vllm"
    launch_modes = ("native", "mp", "ray")
    owned_flags = {
        **COMMON_OWNED_FLAGS,
        "--model": "llmgw passes the weights it placed as the first argument",
        "--served-model-name": "llmgw sets to the model's name, which clients send",
        "--tensor-parallel-size": _PARALLEL,
        "-tp": _PARALLEL,
        "--pipeline-parallel-size": _PARALLEL,
        "-pp": _PARALLEL,
        "--data-parallel-size": "would use GPUs placement did not give; run more replicas",
        "-dp": "would use GPUs placement did not give; run more replicas",
        "--distributed-executor-backend": "llmgw sets from the profile's launch_mode",
        "--nnodes": _MULTI_NODE,
        "--node-rank": _MULTI_NODE,
        "--master-addr": _MULTI_NODE,
        "--master-port": _MULTI_NODE,
        "--headless": _MULTI_NODE,
        "--max-model-len": _SET_CONTEXT,
        "--enable-lora": _LORA,
        "--max-loras": "llmgw sets from the profile's max_loras",
        "--max-lora-rank": "llmgw sets from the profile's max_lora_rank",
        "--lora-modules": _LORA,
        **serve_owned_flags(name),  # --runner, --convert, and the older --task
    }
    owned_env = {
        "RAY_ADDRESS": "llmgw points it at the replica's own Ray head",
        "VLLM_API_KEY": "llmgw sets to the replica's own secret, which only the router sends",
        RUNTIME_LORA: "llmgw sets when the profile's max_loras turns LoRA on",
    }

    def engine_problems(self, spec: ShardSpec) -> list[str]:
        return nccl_node_problems(spec, "vLLM", "one tensor-parallel group")

    def commands(self, spec: ShardSpec, binary: str) -> list[LaunchCommand]:
        env = engine_env(spec)
        if spec.world_size == 1:
            # native leaves the choice to vLLM, which is multiprocessing on one node
            native = spec.launch_mode == "native"
            flags = [] if native else ["--distributed-executor-backend", spec.launch_mode]
            return [self._serve(spec, binary, env, flags)]
        host, port = parse_rendezvous(spec.rendezvous)
        if spec.launch_mode == "ray":
            return self._ray_commands(spec, binary, env, host, port)
        flags = ["--distributed-executor-backend", "mp"]
        flags += ["--nnodes", str(spec.world_size), "--node-rank", str(spec.rank)]
        flags += ["--master-addr", host, "--master-port", str(port)]
        if spec.rank == 0:
            return [self._serve(spec, binary, env, flags)]
        argv = [binary, "serve", _model(spec), *_parallel(spec), *flags, "--headless"]
        # A worker builds the same model as rank 0, pooling or generating alike.
        argv += self.serve_flags(spec.serves)
        argv += lora_flags(spec)  # the same LoRA layers as rank 0's
        return [LaunchCommand(argv=(*argv, *spec.args), env=env, name="vllm-worker")]

    def _ray_commands(
        self, spec: ShardSpec, binary: str, env: dict[str, str], host: str, port: int
    ) -> list[LaunchCommand]:
        # vLLM's GPU workers are started by the local raylet and inherit its
        # environment, so the Ray processes carry the same CUDA and NCCL variables.
        ray = _beside(binary, "ray")
        if spec.rank > 0:
            argv = (ray, "start", "--address", f"{host}:{port}", "--disable-usage-stats", "--block")
            return [LaunchCommand(argv=argv, env=env, name="ray-worker")]
        listen = ["--node-ip-address", host, "--port", str(port)]
        quiet = ["--include-dashboard", "false", "--disable-usage-stats"]
        head = LaunchCommand(
            argv=(ray, "start", "--head", *listen, *quiet, "--block"),
            env=env,
            name="ray-head",
            wait_for_port=(host, port),
            wait_timeout=RAY_HEAD_TIMEOUT,
        )
        # RAY_ADDRESS names this replica's head: two replicas' heads may share a node,
        # and vLLM would otherwise attach to whichever Ray it finds first.
        server_env = {**env, "RAY_ADDRESS": f"{host}:{port}"}
        serve = self._serve(spec, binary, server_env, ["--distributed-executor-backend", "ray"])
        return [head, serve]

    def _serve(
        self, spec: ShardSpec, binary: str, env: dict[str, str], flags: list[str]
    ) -> LaunchCommand:
        argv = [binary, "serve", _model(spec), "--served-model-name", spec.model]
        argv += ["--host", spec.host, "--port", str(spec.port), *_parallel(spec), *flags]
        argv += self.serve_flags(spec.serves)
        argv += lora_flags(spec)
        if spec.max_loras:
            env = {**env, RUNTIME_LORA: "True"}
        # In its environment (vLLM reads VLLM_API_KEY): --api-key would show it to ps.
        secret = {"VLLM_API_KEY": spec.api_key} if spec.api_key else {}
        return LaunchCommand(argv=(*argv, *spec.args), env=env, name="vllm", secret_env=secret)

    def version_command(self, binary: str) -> list[str]:
        return [binary, "--version"]


def lora_flags(spec: ShardSpec) -> list[str]:
    """LoRA on with the profile's bounds, and the adapters named at start, each served
    under its own model id: routers ask for it by that name."""
    if not spec.max_loras and not spec.adapters:
        return []
    flags = ["--enable-lora", "--max-loras", str(spec.max_loras or max(len(spec.adapters), 1))]
    flags += ["--max-lora-rank", str(spec.max_lora_rank or VLLM_DEFAULT_MAX_LORA_RANK)]
    for adapter in spec.adapters:
        # A hub id has no path here: vLLM fetches it itself, as it does a model's.
        where = adapter.path or adapter.source
        flags += ["--lora-modules", f"{adapter_id(spec.model, adapter.name)}={where}"]
    return flags


def _model(spec: ShardSpec) -> str:
    # A hub id has no model_path: vLLM resolves it itself.
    return spec.model_path or spec.source


def _parallel(spec: ShardSpec) -> list[str]:
    """Tensor parallel within a group; pipeline stages are the nodes, or extra groups on one."""
    tp = spec.tensor_parallel
    stages = spec.world_size if spec.world_size > 1 else max(len(spec.gpus) // tp, 1)
    flags = ["--tensor-parallel-size", str(tp)]
    if stages > 1:
        flags += ["--pipeline-parallel-size", str(stages)]
    if spec.context:
        flags += ["--max-model-len", str(spec.context)]
    return flags


def _beside(binary: str, name: str) -> str:
    """Return ``name`` from the same bin directory as ``binary``, or bare to use PATH."""
    directory = os.path.dirname(binary)
    return os.path.join(directory, name) if directory else name
