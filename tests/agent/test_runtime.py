"""The agent runtime's own loops, without a control plane."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from pathlib import Path

import pytest
from stub_engine import Harness

from agent_worker import runtime as runtime_module
from agent_worker.config import AgentConfig
from agent_worker.runtime import AgentRuntime
from agent_worker.supervision.health import HealthProbe, port_open
from agent_worker.supervisor import Supervisor
from protocol import messages
from protocol.shard import ShardSpec
from tests.agent.engine_archives import wanted
from tests.agent.fake_control_plane import FakeControlPlane
from tests.support.polling import wait_until


def runtime(tmp_path, **fields) -> AgentRuntime:
    fields.setdefault("servers", ("ws://127.0.0.1:9",))
    fields.setdefault("token", "token")  # FakeControlPlane's: it proves its answers with it
    # Stand-in engines in this checkout's Python: run as the agent's user (conftest).
    fields.setdefault("engine_user", os.environ["LLMGW_AGENT_ENGINE_USER"])
    config = AgentConfig(
        broker="redis://127.0.0.1:9/0", node_id="node01", agent_dir=tmp_path / "agent",
        weights_dir=tmp_path / "weights", **fields,
    )  # fmt: skip
    return AgentRuntime(config)


def test_a_failed_probe_round_is_logged_and_the_prober_keeps_going(tmp_path, caplog):
    agent = runtime(tmp_path, probe_interval=0.01)
    rounds = []

    async def probe_once() -> None:
        rounds.append(1)
        if len(rounds) == 1:
            raise OSError("the install directory vanished")

    agent._probe_once = probe_once  # type: ignore[method-assign]

    async def scenario() -> None:
        prober = asyncio.create_task(agent._probe_periodically())
        for _ in range(500):
            if len(rounds) >= 3:
                break
            await asyncio.sleep(0.01)
        prober.cancel()

    try:
        asyncio.run(scenario())
    finally:
        agent.stop()
    assert len(rounds) >= 3
    assert "probing engines and weights failed" in caplog.text


class ControlPlaneThread:
    """A FakeControlPlane on a loop of its own, for an agent whose link has its own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.plane = self._call(FakeControlPlane().start())

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    @property
    def url(self) -> str:
        return self.plane.url

    def received(self, kind: str = "") -> list[dict]:
        return [m for m in list(self.plane.received) if not kind or m.get("type") == kind]

    def stop(self) -> None:
        self._call(self.plane.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def control_plane():
    plane = ControlPlaneThread()
    yield plane
    plane.stop()


class Told:
    """What the runtime hands its link; the first message of ``hold`` waits for ``release``
    (or a second), standing for a send that loses the race to another thread."""

    def __init__(self, agent: AgentRuntime, hold: type | None = None) -> None:
        self.messages: list = []
        self.hold = hold
        self.holding = threading.Event()
        self.release = threading.Event()
        agent.link.send = self.record  # type: ignore[method-assign]
        agent.link.send_latest = lambda _kind, message: self.record(message)  # type: ignore[method-assign]

    def record(self, message) -> None:
        if self.hold is not None and isinstance(message, self.hold) and not self.holding.is_set():
            self.holding.set()
            self.release.wait(1.0)
        self.messages.append(message)

    def of(self, kind: type) -> list:
        return [message for message in self.messages if isinstance(message, kind)]


def paths(weights: list) -> list[str]:
    return sorted(Path(weight.path).name for weight in weights)


def test_weights_changes_are_told_once_when_threads_ask_together(tmp_path):
    agent = runtime(tmp_path)
    told = Told(agent)
    agent.register_message()  # what the register said
    (tmp_path / "weights").mkdir(exist_ok=True)
    (tmp_path / "weights" / "model.gguf").write_bytes(b"GGUF" + bytes(16))
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        agent.collect_weights([])

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    agent.stop()
    assert [paths(m.weights) for m in told.of(messages.Weights)] == [["model.gguf"]]


def test_weights_listings_reach_the_link_in_the_order_they_were_made(tmp_path):
    # A collect and a prefetch finishing together: the later listing must be the one the
    # control plane keeps, or the fetched model stays invisible until a reconnect.
    agent = runtime(tmp_path)
    weights = tmp_path / "weights"
    weights.mkdir(exist_ok=True)
    (weights / "a.gguf").write_bytes(b"GGUF" + bytes(16))
    told = Told(agent, hold=messages.Weights)
    first = threading.Thread(target=agent.collect_weights, args=([],))
    first.start()
    assert told.holding.wait(10)
    (weights / "b.gguf").write_bytes(b"GGUF" + bytes(16))
    second = threading.Thread(target=agent.collect_weights, args=([],))
    second.start()
    second.join(0.5)  # it would send now, ahead of the first, if nothing kept them in order
    told.release.set()
    first.join(10)
    second.join(10)
    agent.stop()

    assert [paths(m.weights) for m in told.of(messages.Weights)] == [
        ["a.gguf"], ["a.gguf", "b.gguf"]
    ]  # fmt: skip


def test_engine_statuses_reach_the_link_in_the_order_they_were_read(tmp_path):
    # A late "installing: checking" sent after "installed" would keep placement away from
    # the node until it reconnects: nothing sends the statuses again unless they change.
    agent = runtime(tmp_path)
    agent.engines.probe()  # the engines it was started with are known
    told = Told(agent, hold=messages.Engines)
    one = wanted("http://127.0.0.1:9/llama.tar.gz", "0" * 64, version="b6000")
    two = wanted("http://127.0.0.1:9/llama.tar.gz", "0" * 64, version="b6001")
    first = threading.Thread(target=agent.converge_engines, args=([one],))
    first.start()
    assert told.holding.wait(10)
    second = threading.Thread(target=agent.converge_engines, args=([one, two],))
    second.start()
    second.join(0.5)
    told.release.set()
    first.join(10)
    second.join(10)

    said = [[e.version for e in m.engines] for m in told.of(messages.Engines)]
    agent.stop()
    assert said == [["b6000"], ["b6000", "b6001"]]


def test_the_periodic_probe_tells_the_engines_only_when_they_changed(tmp_path):
    binary = tmp_path / "opt" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    agent = runtime(tmp_path, engines={"llama.cpp": str(binary)})
    told = Told(agent)

    for _ in range(3):
        asyncio.run(agent._probe_once())
    binary.unlink()
    asyncio.run(agent._probe_once())
    asyncio.run(agent._probe_once())
    agent.stop()

    said = [[(e.engine, e.path) for e in m.engines] for m in told.of(messages.Engines)]
    assert said == [[("llama.cpp", str(binary))], []]


def final_weights(received: list[dict]) -> list[str]:
    """The weights the control plane ends up with: the last register or weights message."""
    stated = [m["weights"] for m in received if m["type"] in ("register", "weights")]
    return sorted(Path(weight["path"]).name for weight in stated[-1])


def test_a_listing_older_than_the_register_is_never_sent_after_it(tmp_path, control_plane):
    agent = runtime(tmp_path, servers=(control_plane.url,), heartbeat_interval=60.0)
    weights = tmp_path / "weights"
    weights.mkdir(exist_ok=True)
    (weights / "a.gguf").write_bytes(b"GGUF" + bytes(16))
    agent.collect_weights([])  # the link is down: this listing waits for it
    (weights / "b.gguf").write_bytes(b"GGUF" + bytes(16))  # before the next probe
    agent.link.send(messages.ShardStatus(shard_id="last", state="stopped"))
    agent.start()
    try:
        wait_until(lambda: any(m.get("shard_id") == "last" for m in control_plane.received()))
    finally:
        agent.stop()

    assert final_weights(control_plane.received()) == ["a.gguf", "b.gguf"]


def test_a_draining_agent_refuses_new_shards_and_says_why(tmp_path):
    agent = runtime(tmp_path)
    told = []
    agent.link.send = told.append  # type: ignore[method-assign]
    spec = ShardSpec(shard_id="a" * 32, replica_id="r1", model="m", source="/models/m.gguf",
                     engine="llama.cpp", profile="cpu", port=20000)  # fmt: skip

    agent.drain(True)
    state = agent.start_shard(spec)
    agent.drain(False)

    assert state == "failed"
    [refusal] = [m for m in told if isinstance(m, messages.ShardStatus)]
    assert refusal.reason == "node node01 is draining: it takes no new shards"
    assert agent.start_shard(spec.model_copy(update={"shard_id": "b" * 32})) == "failed"
    assert "draining" not in told[-1].reason  # undrained: refused for another reason


def test_an_announced_epoch_fences_the_deposed_leaders_stops(tmp_path, caplog):
    # A failover the agent was never commanded through: the announcement alone must do.
    agent = runtime(tmp_path)
    agent.link.send = lambda message: None  # type: ignore[method-assign]
    stopped = []
    agent.launcher.stop = lambda shard_id: stopped.append(shard_id) or True  # type: ignore[method-assign]
    assert agent.stop_shard("a" * 32, epoch=1)  # the first leader's stop is obeyed

    assert agent.learn_epoch(2)
    assert not agent.stop_shard("b" * 32, epoch=1)
    assert stopped == ["a" * 32]
    assert "ignoring stop of shard " + "b" * 32 + " from epoch 1; epoch 2 leads" in caplog.text
    assert not agent.learn_epoch(1)  # an older announcement, late: changes nothing
    assert runtime(tmp_path).agent_state.highest_epoch == 2  # kept across a restart


def test_engines_named_in_the_agent_file_are_reported_as_not_managed(tmp_path):
    binary = tmp_path / "opt" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    agent = runtime(tmp_path, engines={"llama.cpp": str(binary)})

    agent.engines.probe()

    [named] = agent.register_message().engines
    assert (named.engine, named.path, named.status, named.managed) == (
        "llama.cpp", str(binary), "installed", False,
    )  # fmt: skip
    assert agent.engines.find("llama.cpp") == str(binary)
    assert agent.engines.find("llama.cpp", "b6000") is None


def test_a_register_before_the_first_probe_says_the_engines_are_not_yet_probed(tmp_path):
    # An agent restarted on a node whose file names SGLang registers before SGLang's import
    # has answered: the register must not read as "this node has no SGLang any more".
    binary = tmp_path / "opt" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    agent = runtime(tmp_path, engines={"llama.cpp": str(binary)})
    told = Told(agent)

    early = agent.register_message()
    agent._engines_changed()  # an install's news before the probe: half the list, not told
    nothing_told = told.of(messages.Engines) == []
    asyncio.run(agent._probe_once())
    agent.stop()

    assert (early.engines_probed, early.engines) == (False, [])
    assert nothing_told
    [engines] = told.of(messages.Engines)
    assert engines.probed and [(e.engine, e.path) for e in engines.engines] == [
        ("llama.cpp", str(binary))
    ]


def test_the_first_probe_after_an_early_register_is_told_even_when_it_finds_nothing(tmp_path):
    # The control plane kept the list from before the restart; an engine removed meanwhile
    # must not stay on it until something else changes.
    agent = runtime(tmp_path)
    told = Told(agent)

    assert not agent.register_message().engines_probed
    asyncio.run(agent._probe_once())
    asyncio.run(agent._probe_once())
    agent.stop()

    assert [m.engines for m in told.of(messages.Engines)] == [[]]


def leave_running(agent: AgentRuntime, harness: Harness, shard_id: str, *flags: str) -> ShardSpec:
    """An engine a previous agent started in this agent's directories, then left running."""
    previous = Supervisor(agent.config.state_dir, agent.config.log_dir, lambda _: None,
                          poll_interval=0.1)  # fmt: skip
    spec = harness.spec(shard_id)
    previous.start(spec, [harness.command(spec.port, *flags)], True, "/health")
    wait_until(lambda: port_open(spec.host, spec.port), what="the engine to listen")
    previous.shutdown()
    return spec


@pytest.mark.process
def test_the_agent_registers_while_an_adopted_engine_hangs(tmp_path, control_plane):
    # Restarting beside a wedged engine: its health check may take as long as it likes;
    # the node must register within the 15 s that keep it reachable, the engine with it.
    agent = runtime(tmp_path, servers=(control_plane.url,))
    harness = Harness(tmp_path / "engines")
    try:
        spec = leave_running(agent, harness, "hung-1", "--hang")
        agent.supervisor._probe = HealthProbe(timeout=600.0)
        threading.Thread(target=agent.start, daemon=True).start()
        [register] = wait_until(lambda: control_plane.received("register"), timeout=15,
                                what="a register")  # fmt: skip
    finally:
        agent.stop()
        harness.cleanup()

    assert [(s["spec"]["shard_id"], s["state"]) for s in register["shards"]] == [
        (spec.shard_id, "starting")
    ]


def test_gpu_users_found_after_registering_are_sent_in_a_later_register(
    tmp_path, control_plane, monkeypatch
):
    # The GPU sweep waits out kills; the node registers first and says what it found after.
    # Not an engine, in a session of its own: reported, never killed.
    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True)
    registered_first = []

    def gpu_process_pids() -> list[int]:  # NVML, the one part that cannot exist here
        registered_first.append(_eventually(lambda: control_plane.received("register")))
        return [stranger.pid]

    monkeypatch.setattr(runtime_module, "gpu_process_pids", gpu_process_pids)
    agent = runtime(tmp_path, servers=(control_plane.url,))
    try:
        agent.start()
        wait_until(lambda: len(control_plane.received("register")) == 2, timeout=30,
                   what="a second register")  # fmt: skip
        left_alone = stranger.poll() is None
    finally:
        agent.stop()
        stranger.kill()
        stranger.wait()

    first, later = control_plane.received("register")
    assert registered_first == [True]
    assert first["unexpected_gpu_users"] == []
    assert [user["pid"] for user in later["unexpected_gpu_users"]] == [stranger.pid]
    assert left_alone


def _eventually(condition, timeout: float = 20.0) -> bool:
    try:
        wait_until(condition, timeout)
    except AssertionError:
        return False
    return True


def test_the_register_reads_infiniband_from_the_configured_root(tmp_path):
    from fakes.sysfs import add_adapter

    add_adapter(tmp_path / "ib", "mlx5_0", {1: ("ACTIVE", 200)})
    agent = runtime(tmp_path, fabrics={"ib-a": ["mlx5_0"]}, infiniband_root=tmp_path / "ib")
    [fabric] = agent.register_message().inventory.fabrics
    assert (fabric.name, fabric.adapters, fabric.rate_gbps) == ("ib-a", ["mlx5_0"], 200.0)
