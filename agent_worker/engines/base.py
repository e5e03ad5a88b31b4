"""What every engine adapter offers the agent: checks, command lines, and which ranks serve."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from agent_worker.engines.command import LaunchCommand, Listener
from agent_worker.engines.validation import (
    common_problems,
    owned_env_problems,
    owned_flag_problems,
    parse_rendezvous,
)
from protocol.engine_args import COMMON_OWNED_FLAGS
from protocol.engine_serves import serve_flags, serve_problems, serve_setting_problems
from protocol.serving import DEFAULT_SERVES
from protocol.shard import EngineRanks, ListeningSide, ShardSpec, ranks_of


class EngineAdapter(ABC):
    """Turn a shard spec into the processes one engine needs, refusing what it cannot run.

    ``validate`` runs in milliseconds and before anything is started; ``commands``
    assumes a spec ``validate`` accepted. A shard is the list ``commands`` returns:
    every command but the last is a sidecar, the last one's exit is the shard's.
    """

    name: ClassVar[str]
    health_path: ClassVar[str] = "/health"
    launch_modes: ClassVar[tuple[str, ...]] = ("native",)
    launch_mode_note: ClassVar[str] = ""  # why the other launch modes do not apply
    # flag -> why it is llmgw's (completes "args sets --port, which ...; remove it")
    owned_flags: ClassVar[Mapping[str, str]] = COMMON_OWNED_FLAGS
    # env name -> why it is llmgw's, beyond the CUDA/NCCL ones every engine has
    owned_env: ClassVar[Mapping[str, str]] = {}
    # What a profile that names no ``serves:`` serves (protocol.engine_serves says the rest:
    # the flags of each kind, and which kinds one process cannot serve together).
    serves_by_default: ClassVar[tuple[str, ...]] = DEFAULT_SERVES

    def validate(self, spec: ShardSpec) -> list[str]:
        """Return every problem with this spec for this engine; empty means launch it."""
        problems = common_problems(spec, self.name, self.launch_modes, self.launch_mode_note)
        problems += owned_flag_problems(spec.args, self.owned_flags)
        problems += owned_env_problems(spec.env, self.owned_env)
        problems += self.serve_problems(spec)
        problems += self.engine_problems(spec)
        return problems

    @property
    def ranks(self) -> EngineRanks:
        """How this engine's ranks across nodes stand to each other (``protocol``'s table,
        shared with the control plane): who listens for whom, and which read the weights.
        The side that connects starts only once the other listens."""
        return ranks_of(self.name)

    @property
    def listening_side(self) -> ListeningSide:
        return self.ranks.listening_side

    def needs_weights(self, rank: int) -> bool:
        """Say whether ``rank`` opens the weights: a rank that does not is never made to
        fetch them, nor refused for lacking them."""
        return self.ranks.reads_weights(rank)

    def serve_flags(self, serves: list[str]) -> list[str]:
        """Return the flags that make this engine serve ``serves`` (none for its default)."""
        return serve_flags(self.name, serves or list(self.serves_by_default))

    def serve_problems(self, spec: ShardSpec) -> list[str]:
        """Return the kinds of ``spec.serves`` this engine cannot serve, or not together,
        and the args that would undo what they need; each said with its fix."""
        serves = spec.serves or list(self.serves_by_default)
        problems = serve_problems(self.name, serves)
        return problems + serve_setting_problems(self.name, serves, spec.args, spec.env)

    def engine_problems(self, spec: ShardSpec) -> list[str]:
        """Return what only this engine refuses; the common checks have already run."""
        return []

    def binary_problems(self, spec: ShardSpec, binary: str) -> list[str]:
        """Return what the installed build at ``binary`` cannot do for this spec."""
        return []

    @abstractmethod
    def commands(self, spec: ShardSpec, binary: str) -> list[LaunchCommand]:
        """Return this rank's processes, in start order, with the environment each adds."""

    def serves_http(self, rank: int) -> bool:
        """Say whether this rank answers HTTP; the others are judged by staying alive."""
        return rank == 0

    def ready_when_listening(self, rank: int) -> bool:
        """Say whether a rank that serves no HTTP is ready once its port accepts (rather
        than once it has stayed alive a while): true of the side that listens."""
        return rank > 0 and self.listening_side == "workers"

    def start_after(self, spec: ShardSpec) -> list[Listener]:
        """What must accept connections before this rank's first process starts.

        The one start-order rule for every engine: the connecting side waits for the
        listening side, bounded by the shard's startup timeout.
        """
        if spec.world_size == 1:
            return []
        if self.listening_side == "rank0":
            if spec.rank == 0:
                return []
            host, port = parse_rendezvous(spec.rendezvous)
            return [Listener("rank 0's rendezvous", host, port)]
        if spec.rank > 0:
            return []
        listeners = []
        for rank, worker in enumerate(spec.workers, start=1):
            host, port = parse_rendezvous(worker)
            listeners.append(Listener(f"rank {rank}'s worker", host, port))
        return listeners

    @abstractmethod
    def version_command(self, binary: str) -> list[str]:
        """Return the command that prints the version; run only by an explicit engine check."""


def engine_env(spec: ShardSpec, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment a shard's processes add to the agent's: profile's, then llmgw's.

    llmgw's keys are applied last so a profile can never point an engine at GPUs or
    adapters placement did not give it, even if validation was skipped.
    """
    env = dict(spec.env)
    # An empty CUDA_VISIBLE_DEVICES hides every GPU, so a CPU shard cannot wander onto
    # a card another replica was given. PCI bus order makes CUDA's indices NVML's.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in spec.gpus)
    fabric = spec.fabric
    if fabric is not None and fabric.adapters:
        # NCCL matches these as prefixes unless the list starts with "=": without it
        # mlx5_1 also selects mlx5_10..mlx5_19, adapters the fabric never named.
        env["NCCL_IB_HCA"] = "=" + ",".join(fabric.adapters)
    if fabric is not None and fabric.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = "=" + fabric.socket_ifname
        # torch.distributed's CPU side (Gloo) picks its own interface otherwise, and
        # takes a plain name rather than NCCL's match syntax.
        env["GLOO_SOCKET_IFNAME"] = fabric.socket_ifname
    env.update(extra or {})
    return env
