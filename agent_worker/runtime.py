"""The agent's runtime: discovery, the link, heartbeats and the supervisor, for the
worker's whole life. Celery tasks call into the one instance (``current()``).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import threading

from agent_worker.agent_state import AgentState
from agent_worker.command_guard import CommandGuard
from agent_worker.config import AgentConfig
from agent_worker.discovery import (
    DiscoveryConfig,
    HostSources,
    UsageSampler,
    discover,
    storage_dirs,
)
from agent_worker.discovery.network import route_address
from agent_worker.discovery.nvidia import discover_gpus, gpu_process_pids
from agent_worker.engines import get_adapter
from agent_worker.engines.install import (
    AptSettings,
    EngineInstaller,
    InstallSettings,
    NodeTarget,
)
from agent_worker.engines.install.python_env import PipSettings
from agent_worker.engines.probe import ProbeConfig
from agent_worker.identity import link_ssl_context, node_identity
from agent_worker.launcher import ShardLauncher
from agent_worker.link import AgentLink, LinkCallbacks
from agent_worker.logbuffer import AGENT_SOURCE, LogBuffer
from agent_worker.node_engines import NodeEngines
from agent_worker.node_weights import NodeWeights
from agent_worker.supervision.engine_user import engine_user
from agent_worker.supervision.shard import StatusSequence
from agent_worker.supervisor import ShardTransition, Supervisor
from agent_worker.walls import Walls
from agent_worker.weights import (
    FetchSettings,
    WeightStore,
)
from agent_worker.weights.look import LookDirs
from protocol import messages
from protocol.engines import WantedEngine
from protocol.gpu_users import UnexpectedGpuUser
from protocol.shard import ShardSpec, ShardState

log = logging.getLogger("llmgw.agent")

AGENT_VERSION = "0.1.0"
# Stopping the worker must end the agent promptly: no hung reads (DESIGN.md).
STOP_TIMEOUT = 5.0
# The register waits this long at most for adoption (bounded itself by the supervisor's
# ADOPTION_CHECK_WAIT): one without the adopted shards would have them failed.
REGISTER_WAITS_FOR_ADOPTION = 10.0

_current: AgentRuntime | None = None


def current() -> AgentRuntime:
    """The runtime of this worker; tasks use it to reach the supervisor and logs."""
    if _current is None:
        raise RuntimeError("the agent runtime is not running in this process")
    return _current


class AgentRuntime:
    """Everything that must live in the worker process for its whole life."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.node_id = config.identity
        # Which engine builds fit: the driver's CUDA version, asked once (discovery asks
        # again on every register, and logs what it finds there).
        cuda_version = discover_gpus().cuda_version
        self.logs = LogBuffer()
        logging.getLogger().addHandler(self.logs.handler())
        for directory in (config.agent_dir, config.state_dir, config.log_dir):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.discovery_config = DiscoveryConfig(
            weights_dir=config.weights_dir,
            control_planes=tuple(config.servers),
            storage_dirs=(config.agent_dir,),
            fabrics={name: tuple(adapters) for name, adapters in config.fabrics.items()},
            hostname=self.node_id,
            address=config.address,
        )
        self.host_sources = HostSources(infiniband=config.infiniband_root)
        self.agent_state = AgentState(config.agent_dir / "agent-state.json")
        self.sequence = StatusSequence(self.agent_state.begin_generation())
        self.walls = Walls(config.firewall, config.agent_dir / "engine-callers.json")
        self.engine_user = engine_user(config.engine_user, config.agent_dir, config.weights_dir)
        self.supervisor = Supervisor(
            config.state_dir, config.log_dir, self._on_transition, logs=self.logs,
            sequence=self.sequence, engine_user=self.engine_user,
        )  # fmt: skip
        self.sampler = UsageSampler(storage_dirs(self.discovery_config))
        self.engines = NodeEngines(
            ProbeConfig(install_dirs=config.install_dirs, engine_paths=config.engines),
            EngineInstaller(
                InstallSettings(
                    root=config.agent_dir / "engines",
                    staging=config.agent_dir / "engines-staging",
                    downloads=config.agent_dir / "engine-downloads",
                    apt=AptSettings(),
                    fetch=FetchSettings(),
                    pip=PipSettings(index_url=config.pip_index_url),
                ),
                NodeTarget.of_this_machine(cuda_version),
                on_change=self._engines_changed,
                in_use=self._engines_in_use,
            ),
        )
        # Set by the control plane's drain: running shards stay, new ones are refused.
        self.draining = False
        self.link = AgentLink(
            config.servers,
            self.node_id,
            config.token,
            LinkCallbacks(
                register=self.register_message,
                heartbeat=self.heartbeat_message,
                epoch=self.learn_epoch,
            ),  # fmt: skip
            heartbeat_interval=config.heartbeat_interval,
            ssl_context=link_ssl_context(config),
            identity=node_identity(config),
        )
        # Ids of the commands obeyed, so that none is obeyed twice; refusals, counted.
        self.commands = CommandGuard(config.agent_dir / "commands-done.json", self.link.send)
        self.weights = WeightStore(config.weights_dir)
        self.look_dirs = LookDirs(look=config.look_dirs, shared=config.shared_dirs,
                                  fabrics=tuple(config.fabrics))  # fmt: skip
        self.held_weights = NodeWeights(self.weights, self.look_dirs, self.link)
        self.launcher = ShardLauncher(
            self.node_id, self.supervisor, self.weights, self.engines.find,
            self._on_transition, self.link.send, self.sequence, allowed_env=config.allow_env,
            walls=self.walls,
        )  # fmt: skip
        self.unexpected_gpu_users: list[UnexpectedGpuUser] = []
        self._thread: threading.Thread | None = None
        self._taking_over: threading.Thread | None = None
        # Clear while start() adopts what a previous agent left: the register waits for it.
        self._adopted = threading.Event()
        self._adopted.set()
        self._stopping = threading.Event()

    # -- life ------------------------------------------------------------------------

    def start(self) -> None:
        """Link at once and take over in the background: beside hung engines, probing,
        adopting and sweeping the GPUs can outlast the 15 s that keep a node reachable."""
        global _current
        _current = self
        self._adopted.clear()
        self._taking_over = threading.Thread(target=self._take_over, name="llmgw-take-over",
                                             daemon=True)  # fmt: skip
        self._taking_over.start()
        self._thread = threading.Thread(target=self._run_loop, name="llmgw-link", daemon=True)
        self._thread.start()

    def _take_over(self) -> None:
        """Adopt what a previous agent left running (the register waits for that alone),
        then tell what is found after it in messages of its own, or a later register."""
        try:
            adopted = self.supervisor.adopt_all()
            if adopted:
                log.info("adopted %d running shard(s) from a previous agent", len(adopted))
        except Exception:
            log.exception("adopting the engines a previous agent left running failed")
        try:
            # Exactly the walls of what runs now, those adopted and none stale; before the
            # register, so no start command walls a shard this would not know of.
            address = self.config.address or route_address(self.config.servers)[0]
            self.walls.keep_only((shard.spec for shard in self.supervisor.running()), address)
        except Exception:
            log.exception("walling the adopted shards again failed")
        finally:
            self._adopted.set()
        try:
            self.engines.probe()
            self._engines_changed()
            self._sweep_gpus()
        except Exception:
            log.exception("looking at this node's engines and GPUs after adoption failed")
        # After adoption: an install pass must see which engine versions adopted shards run.
        if self.engines.installer is not None and not self._stopping.is_set():
            self.engines.installer.start()

    def _sweep_gpus(self) -> None:
        # After adoption, so every engine we can describe is known: a process holding
        # GPUs that nothing can describe would have placement hand those GPUs out again.
        # Only this user's engines are killed; any other holder is reported, never touched.
        sweep = self.supervisor.kill_unidentified_gpu_processes(gpu_process_pids())
        if sweep.unexpected != self.unexpected_gpu_users:
            self.unexpected_gpu_users = sweep.unexpected
            self.link.request_register()  # the protocol carries them in a register alone

    def stop(self) -> None:
        """End the link and watchers within STOP_TIMEOUT; engines keep running."""
        global _current
        self._stopping.set()
        self.link.stop()
        if self._taking_over:
            self._taking_over.join(timeout=STOP_TIMEOUT)
        if self.engines.installer is not None:
            self.engines.installer.stop()
        if self._thread:
            self._thread.join(timeout=STOP_TIMEOUT)
        self.supervisor.shutdown()
        self.weights.close()
        self.sampler.close()
        if _current is self:
            _current = None

    def _run_loop(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        prober = asyncio.create_task(self._probe_periodically())
        log_checker = asyncio.create_task(self._rotate_logs_periodically())
        try:
            await self.link.run()
        finally:
            prober.cancel()
            log_checker.cancel()

    async def _probe_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_interval)
            try:
                await self._probe_once()
            except Exception:
                # One bad probe (a vanished directory, a broken install) must not end them all.
                log.exception("probing engines and weights failed; trying again in %ss",
                              self.config.probe_interval)  # fmt: skip

    async def _rotate_logs_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.log_check_interval)
            try:
                # In a thread: copying 50 MiB must not hold up a heartbeat.
                rotated = await asyncio.to_thread(self.rotate_logs)
            except Exception:
                log.exception("rotating log files failed; trying again in %ss",
                              self.config.log_check_interval)  # fmt: skip
                continue
            for shard_id in rotated:
                log.info("rotated the log of shard %s", shard_id)

    def rotate_logs(self) -> list[str]:
        """Rotate every engine log past its limit; the agent's own log is only in memory."""
        return self.supervisor.rotate_logs(self.config.log_max_bytes, self.config.log_keep)

    async def _probe_once(self) -> None:
        await asyncio.to_thread(self.engines.probe)
        await asyncio.to_thread(self._engines_changed)
        await asyncio.to_thread(self.held_weights.tell_if_changed)

    # -- what the node says ----------------------------------------------------------

    def _engines_changed(self) -> None:
        """Tell the control plane how the engines stand, when that changed (any thread)."""
        self.engines.tell_if_changed(
            lambda statuses: self.link.send_latest("engines", messages.Engines(engines=statuses))
        )

    def _engines_in_use(self) -> set[tuple[str, str]]:
        # A shard started without a version pins every version of its engine: which one
        # it runs is not written down, and removing the wrong one would end it.
        pinned: set[tuple[str, str]] = set()
        installed = self.engines.statuses()
        for shard in self.supervisor.running():
            engine, version = shard.spec.engine, shard.spec.engine_version
            if version:
                pinned.add((engine, version))
            else:
                pinned.update((i.engine, i.version) for i in installed if i.engine == engine)
        return pinned

    def register_message(self) -> messages.Register:
        if not self._adopted.wait(REGISTER_WAITS_FOR_ADOPTION):
            # Registering without them would have the control plane fail running engines.
            raise RuntimeError(
                f"adopting the engines a previous agent left running took over "
                f"{REGISTER_WAITS_FOR_ADOPTION:g}s; registering once it is done"
            )
        inventory = discover(self.discovery_config, host=self.host_sources)
        firewall, problem = self.walls.status(inventory.address)
        warnings = list(inventory.warnings)
        if self.config.plaintext:  # only with insecure: true
            warnings.append(f"plaintext to the network (insecure: true): "
                            f"{', '.join(self.config.plaintext)}")  # fmt: skip
        inventory = inventory.model_copy(
            update={"firewall": firewall, "firewall_problem": problem, "warnings": warnings}
        )
        shards = [
            messages.ReportedShard(
                spec=shard.spec, state=shard.state, pid=shard.pid, reason=shard.detail,
                seq=shard.seq,
            )
            for shard in self.supervisor.running()
        ]  # fmt: skip
        shards += [
            messages.ReportedShard(spec=download.spec, state="fetching", seq=download.seq)
            for download in self.launcher.downloading()
        ]
        probed, engines = self.engines.said_in_register(lambda: self.link.forget("engines"))
        return messages.Register(
            agent_version=AGENT_VERSION,
            inventory=inventory,
            engines_probed=probed,
            engines=engines,
            weights=self.held_weights.for_register(),
            shards=shards,
            problems=self.supervisor.problems,
            log_sources=self.logs.sources(),
            unexpected_gpu_users=self.unexpected_gpu_users,
        )

    def heartbeat_message(self) -> messages.Heartbeat:
        return messages.Heartbeat(usage=self.sampler.sample(self.supervisor.pids()))

    def _on_transition(self, transition: ShardTransition) -> None:
        if transition.state in ("stopped", "failed"):
            self.walls.unwall(transition.shard_id)  # nothing of it runs any more
        self.link.send(
            messages.ShardStatus(
                shard_id=transition.shard_id,
                replica_id=transition.replica_id,
                state=transition.state,
                reason=transition.reason,
                output_tail=transition.output_tail,
                pid=transition.pid,
                fingerprint=transition.fingerprint,
                seq=transition.seq,
            )
        )
        if transition.state in ("stopped", "failed"):
            self.engines.shard_ended()

    # -- commands --------------------------------------------------------------------

    def start_shard(self, spec: ShardSpec) -> ShardState:
        """Validate, then launch; a refused profile fails in a second, not after loading."""
        known = self.supervisor.state_of(spec.shard_id)
        if known is not None:
            return known
        if not self._from_current_leader("start", spec.shard_id, spec.epoch):
            return "pending"
        if self.draining:
            return self.launcher.refuse(
                spec, f"node {self.node_id} is draining: it takes no new shards"
            )
        return self.launcher.start(spec)

    def converge_engines(self, engines: list[WantedEngine]) -> None:
        """Install what the catalog names and this node lacks; remove what it dropped."""
        log.info("told to have engines: %s",
                 ", ".join(f"{e.name} {e.version}" for e in engines) or "none")  # fmt: skip
        self.engines.want(engines)

    def engine_callers(self, addresses: list[str]) -> list[str]:
        """The routers' and control planes' addresses: the walls admit them on engines'
        HTTP ports from now on. Returns those refused as not addresses."""
        refused = self.walls.set_callers(addresses)
        for address in refused:
            log.error("told to admit %r on engine ports, which is not an address", address)
        return refused

    def drain(self, draining: bool) -> None:
        if draining != self.draining:
            log.info("draining: taking no new shards" if draining else "taking new shards again")
        self.draining = draining

    def stop_shard(self, shard_id: str, epoch: int = 0) -> bool:
        """Stop a shard; False when the command came from a deposed leader and is ignored."""
        if not self._from_current_leader("stop", shard_id, epoch):
            return False
        if not self.launcher.stop(shard_id):
            self.supervisor.stop(shard_id)
        return True

    def learn_epoch(self, epoch: int) -> bool:
        """A leader announced its epoch; False when a newer one is already known."""
        if not self.agent_state.accept_epoch(epoch):
            return False
        log.info("epoch %d leads; commands from older epochs are refused from now on", epoch)
        return True

    def _from_current_leader(self, verb: str, shard_id: str, epoch: int) -> bool:
        # A deposed leader's command: the current leader decides what runs here. The
        # highest epoch is kept on disk, so an agent restart does not forget it.
        if self.agent_state.accept_epoch(epoch):
            return True
        log.warning(
            "ignoring %s of shard %s from epoch %d; epoch %d leads",
            verb, shard_id, epoch, self.agent_state.highest_epoch,
        )  # fmt: skip
        return False

    def engine_check(self, engine: str) -> dict:
        # Running an engine is only ever done on request; say so where operators look.
        log.info("engine check of %s requested by the control plane", engine)
        path = self.engines.find(engine)
        if path is None:
            known = ", ".join(self.engines.names()) or "none"
            return {"ok": False, "output": f"{engine} is not installed here (found: {known})"}
        command = get_adapter(engine).version_command(path)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"ok": False, "output": f"{' '.join(command)}: {exc}"}
        return {"ok": done.returncode == 0, "output": (done.stdout + done.stderr).strip()[-4000:]}

    def collect_weights(self, keep: list[str]) -> list[str]:
        """Delete fetched weights no model needs; what runs or downloads is always kept."""
        specs = [shard.spec for shard in self.supervisor.running()]
        specs += [download.spec for download in self.launcher.downloading()]
        # A running engine's LoRA adapters are its weights too.
        held = [s for spec in specs for s in (spec.source, *(a.source for a in spec.adapters))]
        return self.held_weights.collect([*keep, *held])

    def prefetch(self, source: str, sha256: str = "") -> dict:
        """Fetch ``source`` ahead of need (``NodeWeights.prefetch``)."""
        return self.held_weights.prefetch(source, sha256)

    def read_logs(self, source: str, lines: int) -> list[str]:
        """The last lines of ``source``: a shard's from its files on disk, across their
        rotation and from before an agent restart; the agent's own from memory."""
        if source != AGENT_SOURCE:
            found = self.supervisor.read_log(source, lines, self.config.log_keep)
            if found is not None:
                return found
        return self.logs.read(source, lines)
