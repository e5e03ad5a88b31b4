"""The scenarios of bench/partitions.py: faults on a simulated fleet under a streaming
load, and what each must not break.

Each scenario waits for the fleet to settle, starts the load from the services host,
does its fault, measures how long the fleet took to see it (detect) and to be whole
again after the heal (recover), and checks its own invariants; every scenario is then
held to the common ones: no request hung, no engine restarted that should have kept
running, no node marked lost that was alive, and no database row that the agents'
own state files contradict once the fleet has settled again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

import httpx
import psutil

from agent_worker.supervision.statedir import recorded_shards
from bench import sim
from bench.fault_load import Load
from llmgw_cli.demo import DEMO_MODEL
from llmgw_cli.sim import cleanup, fabric, hosts, impair, network
from llmgw_cli.sim.fleet import Tuning
from llmgw_cli.sim.state import Fleet
from protocol.shard import SHARD_LIVE, SHARD_READY

CLIENTS = 8
MAX_REQUESTS = 5000  # per scenario: the load is bounded in requests as well as in time
REPLICAS = 2  # so that traffic has somewhere to move
SETTLE_TIMEOUT = 240.0
# A request still unanswered after this long is hung. A demo answer takes about a second;
# the router's worst case with every replica's host dead is about 20 s (keepalive gives
# up on a reused connection in ~10 s, then a 5 s connect timeout on each host).
HANG_AFTER = 30.0
# How long P2 keeps the router cut from a node: longer than HANG_AFTER, so that a request
# stuck on the cut link is seen hung, not rescued by the heal.
ROUTER_CUT = HANG_AFTER + 5


@dataclass(frozen=True)
class Timers:
    """The liveness timers a run uses, in seconds, as the settings' environment sets them."""

    unreachable: int = 15
    lost: int = 60
    hold: int = 300  # the mass-silence hold
    heartbeat: float = 5.0
    # Whether an upper bound on time is an invariant. On the short clock a busy machine
    # (make test's workers) delays a pass by more than the whole bound: there it is a
    # note, and the invariant is that the dead nodes are lost at all.
    timed: bool = True

    def tuning(self, nodes: int) -> Tuning:
        names = [f"node{i}" for i in range(1, nodes + 1)]
        return Tuning(
            replicas=REPLICAS,
            control_env={
                "LLMGW_NODE_UNREACHABLE_AFTER": str(self.unreachable),
                "LLMGW_NODE_LOST_AFTER": str(self.lost),
                "LLMGW_NODE_MASS_SILENCE_HOLD": str(self.hold),
            },
            agent_env={"LLMGW_HEARTBEAT_INTERVAL": str(self.heartbeat)},
            # P6: every node on one fabric declares the filer, and all but the last mount it.
            shared_on=tuple(names[:-1]),
            fabrics=tuple("ib-a" for _ in names),
        )


DEFAULT_TIMERS = Timers()
# make test's short run: the same rules on a shorter clock (heartbeats every second).
SHORT_TIMERS = Timers(unreachable=4, lost=20, hold=10, heartbeat=1.0, timed=False)


@dataclass
class Row:
    scenario: str
    sent: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    longest: float = 0.0
    detect: float | None = None  # seconds from the fault to the fleet seeing it
    recover: float | None = None  # seconds from the heal to the fleet being whole
    wrongly_restarted: int = 0
    wrongly_lost: int = 0
    disagreeing: int = 0
    violations: list[str] = field(default_factory=list)  # broken invariants, in words
    notes: list[str] = field(default_factory=list)
    skipped: str = ""


class Unsettled(Exception):
    """A wait that timed out: the scenario says what it waited for and stops there."""


class Skipped(Exception):
    """A scenario this machine cannot run, with the reason."""


# What the fleet says, read where it lives: the database and Redis on the services host,
# the agents' state files and engine processes on the node hosts.


class Observer:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        return sim.query(self.fleet, sql, params)

    def node_states(self) -> dict[str, str]:
        return dict(self.query("SELECT id, state FROM fleet_node"))

    def live_replicas(self) -> dict[str, tuple[str, str | None]]:
        """Replica id -> (state, its rank 0 node) of every replica not stopped."""
        rows = self.query(
            "SELECT r.id::text, r.state, s.node_id FROM fleet_replica r LEFT JOIN fleet_shard s"
            " ON s.replica_id = r.id AND s.rank = 0 WHERE r.state <> 'stopped'"
        )
        return {replica: (state, node) for replica, state, node in rows}

    def ready_replicas(self) -> dict[str, str]:
        """Replica id -> node, of the ready ones."""
        live = self.live_replicas().items()
        return {replica: node for replica, (state, node) in live if state == "ready" and node}

    def ready_shards(self) -> dict[str, tuple[str, int]]:
        rows = self.query(
            "SELECT id, node_id, pid FROM fleet_shard WHERE state = %s", (SHARD_READY,)
        )
        return {shard: (node, pid) for shard, node, pid in rows}

    def shards_on(self, node: str) -> list[str]:
        rows = self.query(
            "SELECT id FROM fleet_shard WHERE node_id = %s AND state = ANY(%s)",
            (node, list(SHARD_LIVE)),
        )
        return [shard for (shard,) in rows]

    def lost_since(self, since: datetime) -> list[str]:
        rows = self.query(
            "SELECT subject FROM audit_event WHERE kind = 'node' AND to_state = 'lost' "
            "AND at >= %s",
            (since,),
        )
        return [subject for (subject,) in rows]

    def lease(self) -> tuple[str, int]:
        """(the leader's name, its epoch), read from Redis on the services host."""
        import redis

        def read() -> tuple[str, int]:
            conn = redis.Redis.from_url(
                self.fleet.env[hosts.SERVICES]["REDIS_URL"], socket_timeout=2
            )
            raw = conn.get("llmgw:leader")
            holder, _, epoch = (raw.decode() if raw else "").rpartition("|")
            name = holder.removeprefix("ws://").split(":")[0]
            return name, int(epoch or 0)

        return network.in_host(hosts.SERVICES, read)

    def engines(self) -> dict[str, tuple[str, int]]:
        """Shard id -> (node, engine pid) of every engine running, from the agents' own
        state files (the last process launched is the one serving)."""
        found = {}
        for node in self.fleet.nodes:
            agent_dir = self.fleet.directory / "nodes" / node.name / "agent"
            for shard, record in recorded_shards(agent_dir).items():
                if record.serving and running(record.serving.pid):
                    found[shard] = (node.name, record.serving.pid)
        return found

    def agent_epoch(self, node: str) -> int:
        path = self.fleet.directory / "nodes" / node / "agent" / "agent-state.json"
        try:
            return int(json.loads(path.read_text()).get("highest_epoch", 0))
        except (OSError, ValueError):
            return 0

    def breaker_open(self, replica: str) -> bool:
        """Whether the router has taken ``replica`` out, by its own /metrics."""

        auth = sim.router_metrics_auth(self.fleet)

        def scrape() -> str:
            return httpx.get(f"{self.fleet.router_url}/metrics", headers=auth, timeout=5).text

        for line in network.in_host(hosts.SERVICES, scrape).splitlines():
            if line.startswith("llmgw_router_breaker_open{") and f'replica="{replica}"' in line:
                return float(line.rsplit(" ", 1)[1]) > 0
        return False

    def disagreements(self) -> list[str]:
        """Ready rows the agents' state files do not bear out, and engines no row knows."""
        engines = self.engines()
        rows = self.ready_shards()
        problems = []
        for shard, (node, pid) in rows.items():
            if shard not in engines:
                problems.append(f"{shard} ready on {node} in the database; no engine runs it")
            elif engines[shard] != (node, pid):
                problems.append(
                    f"{shard} is {node} pid {pid} in the database, "
                    f"{engines[shard][0]} pid {engines[shard][1]} on the node"
                )
        for shard, (node, pid) in engines.items():
            if shard not in rows:
                problems.append(f"{shard} runs on {node} (pid {pid}); not ready in the database")
        return problems

    def answers(self, key: str) -> bool:
        """One small completion through the router, from the services host."""
        return sim.answers(self.fleet, key, DEMO_MODEL, timeout=30)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# A scenario's context: the fleet, the clock, what it expects to be stopped or lost.


@dataclass
class Scenario:
    fleet: Fleet
    timers: Timers
    key: str
    row: Row
    expected_lost: set[str] = field(default_factory=set)
    expected_stopped: set[str] = field(default_factory=set)  # shard ids
    started_wall: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __post_init__(self) -> None:
        self.see = Observer(self.fleet)

    def address(self, host: str) -> str:
        return self.fleet.host(host).address

    def wait(self, condition: Callable[[], object], what: str, timeout: float) -> float:
        """Poll ``condition`` until true; return when (monotonic). Unsettled on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                met = bool(condition())
            except Exception:  # noqa: BLE001 (a database or Redis cut off for now)
                met = False
            if met:
                return time.monotonic()
            if time.monotonic() > deadline:
                raise Unsettled(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.25)

    def state_of(self, node: str) -> str:
        return self.see.node_states().get(node, "")

    def node_with_replica(self, other_than: str = "") -> str:
        nodes = sorted(set(self.see.ready_replicas().values()) - {other_than})
        if not nodes:
            raise Unsettled("no node has a ready replica")
        return nodes[0]

    def settle(self, why: str) -> None:
        """Every node connected, the wanted replicas ready and answering, and the rows
        agreeing with the agents: the state a scenario starts from and must return to."""

        def settled() -> bool:
            states = self.see.node_states()
            if any(states.get(n.name) != "connected" for n in self.fleet.nodes):
                return False
            live = self.see.live_replicas()
            ready = [r for r, (state, _node) in live.items() if state == "ready"]
            if len(ready) != REPLICAS or len(live) != REPLICAS:
                return False
            return not self.see.disagreements() and self.see.answers(self.key)

        try:
            self.wait(settled, f"the fleet to settle {why}", SETTLE_TIMEOUT)
        except Unsettled as exc:
            states = self.see.node_states()
            raise Unsettled(
                f"{exc}: nodes {states}, replicas {self.see.live_replicas()}, "
                f"disagreeing {self.see.disagreements()}"
            ) from None

    def expect(self, ok: bool, violation: str) -> None:
        if not ok:
            self.row.violations.append(violation)

    # Faults

    def cut_from_control(self, node: str) -> None:
        """``node`` reaches neither control plane nor the services (Redis, PostgreSQL)."""
        for peer in (hosts.SERVICES, *hosts.CONTROL_PLANES):
            network.block(node, self.address(peer))

    def heal_control(self, node: str) -> None:
        for peer in (hosts.SERVICES, *hosts.CONTROL_PLANES):
            network.unblock(node, self.address(peer))

    def kill_agent(self, node: str) -> None:
        os.kill(self.fleet.pid(node, "agent"), signal.SIGKILL)

    def power_off(self, node: str) -> None:
        """Everything on the host dies at once (agent and engines), and its link goes."""
        inode = network.namespace_inode(network.namespace(node))
        for pid in cleanup.processes_in_our_namespaces():
            try:
                if os.readlink(f"/proc/{pid}/ns/net") == f"net:[{inode}]":
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        network.cut(node)

    def power_on(self, node: str) -> None:
        network.heal(node)
        self.fleet.restart(node, "agent")


# The scenarios


def p1_node_cut_from_control_planes(s: Scenario) -> None:
    """A node cut from both control planes (and Redis, PostgreSQL) but not the router."""
    t, victim = s.timers, s.node_with_replica()
    s.expected_lost.add(victim)
    s.expected_stopped.update(s.see.shards_on(victim))
    cut_at = time.monotonic()
    s.cut_from_control(victim)
    try:
        # Unreachable, or straight to lost when a liveness pass falls after both limits.
        seen_at = s.wait(
            lambda: s.state_of(victim) != "connected", f"{victim} to go silent", t.lost + 30
        )
        s.row.detect = seen_at - cut_at
        lost_at = s.wait(lambda: s.state_of(victim) == "lost", f"{victim} to be lost", t.lost + 30)
        # Its last heartbeat came up to one interval before the cut.
        s.expect(
            s.row.detect >= t.unreachable - t.heartbeat - 1,
            f"{victim} marked {s.row.detect:.1f}s after the cut, before "
            f"{t.unreachable}s of silence",
        )
        s.expect(
            lost_at - cut_at >= t.lost - t.heartbeat - 1,
            f"{victim} lost {lost_at - cut_at:.1f}s after the cut, before {t.lost}s",
        )

        def moved() -> bool:  # the replacement ready, the old one drained and stopped
            ready = s.see.ready_replicas()
            return len(ready) == REPLICAS and victim not in ready.values()

        s.wait(moved, f"{victim}'s replica to be ready elsewhere", SETTLE_TIMEOUT)
    finally:
        healed_at = time.monotonic()
        s.heal_control(victim)

    def rejoined() -> bool:
        on_victim = [shard for shard, (node, _pid) in s.see.engines().items() if node == victim]
        return s.state_of(victim) == "connected" and not on_victim

    s.wait(rejoined, f"{victim} to re-register and stop its moved replica's engine", 120)
    s.row.recover = time.monotonic() - healed_at
    ready = len(s.see.ready_replicas())
    s.expect(ready == REPLICAS, f"{ready} replicas ready after the heal, {REPLICAS} wanted")


def p2_node_cut_from_router(s: Scenario) -> None:
    """A node the router cannot reach, though the control planes still can."""
    victim = s.node_with_replica()
    replica = next(r for r, node in s.see.ready_replicas().items() if node == victim)
    router = s.address(hosts.ROUTER)
    cut_at = time.monotonic()
    network.block(victim, router)  # its answers to the router vanish: a silent cut
    try:
        opened = s.wait(
            lambda: s.see.breaker_open(replica), f"the router to take {victim}'s replica out", 60
        )
        s.row.detect = opened - cut_at
        time.sleep(max(0.0, ROUTER_CUT - (time.monotonic() - cut_at)))  # traffic moves
        s.expect(
            s.state_of(victim) == "connected",
            f"{victim} is {s.state_of(victim)}: a cut from the router alone says "
            "nothing of the node",
        )
    finally:
        healed_at = time.monotonic()
        network.unblock(victim, router)
    s.wait(lambda: not s.see.breaker_open(replica), f"{victim}'s replica back in the router", 60)
    s.row.recover = time.monotonic() - healed_at


def p3_leader_cut_from_services(s: Scenario) -> None:
    """The leader loses Redis and PostgreSQL; the standby must lead, the nodes carry on."""
    old_leader, old_epoch = s.see.lease()
    standby = next(cp for cp in hosts.CONTROL_PLANES if cp != old_leader)
    engines_before = s.see.engines()
    cut_at = time.monotonic()
    network.block(old_leader, s.address(hosts.SERVICES))
    try:
        led = s.wait(lambda: s.see.lease()[0] == standby, f"{standby} to lead", 60)
        s.row.detect = led - cut_at
        new_epoch = s.see.lease()[1]
        s.expect(
            new_epoch > old_epoch,
            f"{standby} leads with epoch {new_epoch}, not above {old_leader}'s {old_epoch}",
        )
        # Long enough for liveness to have marked any node it wrongly thinks silent.
        time.sleep(s.timers.unreachable + 2 * s.timers.heartbeat)
    finally:
        healed_at = time.monotonic()
        network.unblock(old_leader, s.address(hosts.SERVICES))
    s.settle(f"after {old_leader} is healed")
    s.row.recover = time.monotonic() - healed_at
    s.expect(s.see.lease()[0] == standby, f"{old_leader} took the lead back after the heal")
    # Every agent has learned the new epoch, so a command the old leader still sends is
    # refused: send one, as a deposed reconciler pass would, and see the engine stay.
    stale = [n.name for n in s.fleet.nodes if s.see.agent_epoch(n.name) < new_epoch]
    s.expect(
        not stale,
        f"{', '.join(stale)} still accept epoch {old_epoch} after the "
        f"failover to epoch {new_epoch}",
    )
    shard, (node, pid) = sorted(s.see.engines().items())[0]
    sent = s.fleet.run(
        old_leader,
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from fleet.commands import send_stop_shard; "
            f"send_stop_shard({node!r}, {shard!r}, epoch={old_epoch})",
        ],
    )
    s.expect(sent.returncode == 0, f"sending the stale stop failed: {sent.stderr[-500:]}")
    time.sleep(3 * s.timers.heartbeat)
    s.expect(running(pid), f"{node} obeyed a stop from {old_leader}'s deposed epoch {old_epoch}")
    lost_engines = set(engines_before) - set(s.see.engines())
    s.expect(not lost_engines, f"engines stopped by the failover: {sorted(lost_engines)}")


def p4_two_of_three_nodes_powered_off(s: Scenario) -> None:
    """Two of three nodes die, the two the replicas are on (no router reaches either, and
    the survivor has room: a stand-in serves until they are back or replaced); then, all
    alive, the control planes alone lose every node."""
    t = s.timers
    names = [n.name for n in s.fleet.nodes]
    holding = sorted(set(s.see.ready_replicas().values()))
    dead = (holding + [n for n in names if n not in holding])[:2]
    [survivor] = [n for n in names if n not in dead]
    s.expected_lost.update(dead)
    for node in dead:
        s.expected_stopped.update(s.see.shards_on(node))
    off_at = time.monotonic()
    for node in dead:
        s.power_off(node)
    bound = t.unreachable + t.hold + 15  # the silence, the guard's hold, a few passes
    lost_at = s.wait(
        lambda: all(s.state_of(n) == "lost" for n in dead),
        f"{' and '.join(dead)} to be lost",
        bound + 60,
    )
    s.row.detect = lost_at - off_at
    s.expect(
        s.row.detect <= bound or not t.timed,
        f"the dead nodes were lost after {s.row.detect:.0f}s, past the bound of {bound}s",
    )
    s.expect(s.state_of(survivor) == "connected", f"{survivor} is {s.state_of(survivor)}")
    for node in dead:
        s.power_on(node)
    s.settle("after the dead nodes are powered on")
    s.row.notes.append(f"dead nodes lost after {s.row.detect:.0f}s (bound {bound}s)")

    # The control planes alone cut from every node: the guard holds, nobody is lost.
    nodes = [n.name for n in s.fleet.nodes]
    cut_at = time.monotonic()
    for cp in hosts.CONTROL_PLANES:
        for node in nodes:
            network.block(cp, s.address(node))
    try:
        time.sleep(t.lost + t.unreachable + 3 * t.heartbeat)
        states = s.see.node_states()
        wrongly = [n for n in nodes if states.get(n) == "lost"]
        s.expect(
            not wrongly, f"{', '.join(wrongly)} lost while the control planes were the ones cut off"
        )
    finally:
        healed_at = time.monotonic()
        for cp in hosts.CONTROL_PLANES:
            for node in nodes:
                network.unblock(cp, s.address(node))
    s.wait(lambda: all(s.state_of(n) == "connected" for n in nodes), "every node to reconnect", 120)
    s.row.recover = time.monotonic() - healed_at
    s.row.notes.append(f"control planes cut from every node for {healed_at - cut_at:.0f}s")


def p5_delay_and_loss(s: Scenario) -> None:
    """50 ms each way and 1% loss on every node's link for the whole scenario."""
    t = s.timers
    nodes = [n.name for n in s.fleet.nodes]
    impaired = []
    try:
        for node in nodes:
            try:
                impair.impair(node, "delay 50ms loss 1%")
            except network.SimError as exc:
                raise Skipped(str(exc)) from None
            impaired.append(node)
        started = time.monotonic()
        flaps: Counter[str] = Counter()
        answered = 0
        checks = 0
        while time.monotonic() - started < t.lost + t.unreachable:
            states = s.see.node_states()
            flaps.update(n for n in nodes if states.get(n) != "connected")
            for node in nodes:  # a command each node must answer over the impaired link
                checks += 1
                answered += engine_check_answered(s.fleet, node)
        s.expect(not flaps, f"nodes not connected under delay and loss: {dict(flaps)}")
        s.expect(answered == checks, f"{checks - answered} of {checks} commands unanswered")
        s.row.notes.append(f"{answered} of {checks} commands answered")
    finally:
        for node in impaired:
            impair.unimpair(node)


def engine_check_answered(fleet: Fleet, node: str) -> bool:
    asked = fleet.run(
        hosts.CONTROL_PLANES[0],
        [sys.executable, "manage.py", "llmgw_ctl", "engine-check", node, "llama.cpp"],
        timeout=60,
    )
    return asked.returncode == 0


def p6_shared_directory_on_some_nodes(s: Scenario) -> None:
    """A shared directory every node of the fabric declares, mounted on all but one."""
    mounted = [n.name for n in s.fleet.nodes[:-1]]
    source = str(s.fleet.directory / "shared-models" / fabric.FILER_MODEL)
    code = (
        "import json; from fleet.weights_map import weights_map; "
        f"print(json.dumps(sorted(weights_map().holders({source!r}))))"
    )
    asked = s.fleet.run(hosts.CONTROL_PLANES[0], [sys.executable, "manage.py", "shell", "-c", code])
    if asked.returncode != 0:
        raise Unsettled(f"reading the weights map failed: {asked.stderr[-800:]}")
    holders = json.loads(asked.stdout.strip().splitlines()[-1])
    s.expect(holders == mounted, f"the share is credited to {holders}; only {mounted} mount it")
    s.row.notes.append(f"held by {', '.join(holders) or 'nobody'}")


def p7_agent_restarted_while_cut(s: Scenario) -> None:
    """A node's agent killed and started again while the node is cut from the control."""
    t, victim = s.timers, s.node_with_replica()
    engines_before = {
        shard: pid for shard, (node, pid) in s.see.engines().items() if node == victim
    }
    cut_at = time.monotonic()
    s.cut_from_control(victim)
    try:
        s.kill_agent(victim)
        s.fleet.restart(victim, "agent")
        # Healed once it is unreachable, early enough that the agent's reconnect backoff
        # (at most 15 s) still brings it back before it is lost: its engines must stay.
        heal_at = cut_at + t.unreachable + 2 * t.heartbeat
        while time.monotonic() < heal_at:
            if s.row.detect is None and s.state_of(victim) != "connected":
                s.row.detect = time.monotonic() - cut_at
            time.sleep(0.25)
    finally:
        healed_at = time.monotonic()
        s.heal_control(victim)
    s.wait(lambda: s.state_of(victim) == "connected", f"{victim} to re-register", 60)
    s.row.recover = time.monotonic() - healed_at
    engines_after = {shard: pid for shard, (node, pid) in s.see.engines().items() if node == victim}
    s.expect(
        engines_after == engines_before,
        f"{victim}'s engines were {engines_before} and are {engines_after}",
    )


SCENARIOS: dict[str, Callable[[Scenario], None]] = {
    "P1 node cut from control": p1_node_cut_from_control_planes,
    "P2 node cut from router": p2_node_cut_from_router,
    "P3 leader cut from services": p3_leader_cut_from_services,
    "P5 delay and loss": p5_delay_and_loss,
    "P6 share on 2 of 3": p6_shared_directory_on_some_nodes,
    "P7 agent restart while cut": p7_agent_restarted_while_cut,
    # Last: it powers two nodes off and on, and holds the control planes apart longest.
    "P4 2 of 3 powered off": p4_two_of_three_nodes_powered_off,
}
# Scenarios where every request must succeed (the goals); elsewhere failures
# are counted and explained, never hung.
NO_FAILURES = ("P1", "P3", "P5", "P7")


def run(
    fleet: Fleet, name: str, timers: Timers, key: str, clients: int = CLIENTS, pause: float = 0.0
) -> Row:
    row = Row(name)
    scenario = Scenario(fleet, timers, key, row)
    try:
        scenario.settle("before the scenario")
    except Unsettled as exc:
        row.violations.append(str(exc))
        return row
    engines_before = scenario.see.engines()
    scenario.started_wall = datetime.now(UTC)
    load = Load(
        fleet.router_url,
        key,
        clients,
        MAX_REQUESTS,
        enter=partial(network.enter, hosts.SERVICES),
        hang_after=HANG_AFTER,
        pause=pause,
    )
    load.start()
    try:
        SCENARIOS[name](scenario)
    except Unsettled as exc:
        row.violations.append(str(exc))
    except Skipped as exc:
        row.skipped = str(exc)
        return row
    finally:
        load.stop()
    try:
        scenario.settle("after the scenario")
    except Unsettled as exc:
        row.violations.append(str(exc))
    count(row, load, name)
    judge(scenario, engines_before)
    return row


def count(row: Row, load: Load, name: str) -> None:
    requests = list(load.requests)
    row.sent = len(requests)
    failed = [r for r in requests if r.error]
    row.failed = len(failed)
    row.reasons = dict(Counter(r.error for r in failed))
    row.longest = max((r.ended - r.started for r in requests if r.ended), default=0.0)
    if name.split()[0] in NO_FAILURES and failed:
        row.violations.append(f"{len(failed)} failed requests: {row.reasons}")
    hung = [r for r in requests if r.error.startswith("hung") or not r.ended]
    if hung:
        row.violations.append(f"{len(hung)} requests hung")


def judge(s: Scenario, engines_before: dict[str, tuple[str, int]]) -> None:
    """The invariants every scenario keeps."""
    row = s.row
    try:
        after = s.see.engines()
        restarted = [
            shard
            for shard, engine in engines_before.items()
            if after.get(shard) != engine and shard not in s.expected_stopped
        ]
        row.wrongly_restarted = len(restarted)
        if restarted:
            row.violations.append(f"engines restarted or stopped: {sorted(restarted)}")
        wrongly = sorted(set(s.see.lost_since(s.started_wall)) - s.expected_lost)
        row.wrongly_lost = len(wrongly)
        if wrongly:
            row.violations.append(f"nodes wrongly marked lost: {wrongly}")
        disagreeing = s.see.disagreements()
        row.disagreeing = len(disagreeing)
        row.violations.extend(disagreeing)
    except Exception as exc:  # noqa: BLE001 (reported as the row's failure, not a crash)
        row.violations.append(f"could not judge the scenario: {exc!r}")
