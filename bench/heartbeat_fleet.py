"""The simulated agents of bench/heartbeats.py: their messages, links and phases."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field

from bench.heartbeat_floor import PROBE_FIELD_SUFFIX
from bench.processes import cpu_seconds
from bench.report import percentile
from protocol.inventory import Cpu, Filesystem, Inventory, NodeUsage, ShardUsage
from protocol.messages import Heartbeat, Register

PROBERS = 10
PROBE_PERIOD = 0.1
SATURATING_AGENTS = 1000  # more would only lengthen each closed round, not add load
PER_ROUND = 5  # heartbeats per acknowledgement probe in the saturation run
DRAIN_LIMIT = 1.0


# --- messages ---------------------------------------------------------------------------


def register_text(node_id: str) -> str:
    inventory = Inventory(
        hostname=node_id, address="127.0.0.1", os="Debian GNU/Linux 12", kernel="6.1",
        arch="x86_64", cpu=Cpu(model="Bench CPU", cores=64, arch="x86_64"),
        memory_total=512 << 30,
    )  # fmt: skip
    return Register(inventory=inventory, engines_probed=True).model_dump_json()


def heartbeat_text(index: int) -> str:
    """About 1 KB, as DESIGN.md sizes a heartbeat: 8 GPUs, 3 filesystems, 4 shards."""
    usage = NodeUsage(
        cpu_percent=round(random.uniform(5, 95), 1),
        load=(12.5, 11.25, 10.75),
        memory_total=512 << 30,
        memory_used=(200 << 30) + index,
        memory_available=(312 << 30) - index,
        gpu_memory_used={gpu: (70 << 30) + gpu * 4096 for gpu in range(8)},
        filesystems=[
            Filesystem(path="/var/lib/llmgw/weights", mount="/data", total=7 << 40, free=3 << 40),
            Filesystem(path="/var/lib/llmgw/agent", mount="/", total=1 << 40, free=700 << 30),
            Filesystem(path="/var/lib/llmgw/engines", mount="/", total=1 << 40, free=700 << 30),
        ],
        shards={
            f"{index:08x}{rank:024x}": ShardUsage(cpu_cores=3.25 + rank, rss=(40 << 30) + rank)
            for rank in range(4)
        },
    )
    return Heartbeat(usage=usage).model_dump_json()


# --- links and phases ----------------------------------------------------------------------


class Link:
    """One websocket; answers come back in the order their requests were sent."""

    def __init__(self, node_id: str, ws) -> None:
        self.node_id = node_id
        self.ws = ws
        self.pending: deque[tuple[float, asyncio.Future[float]]] = deque()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            async for _answer in self.ws:
                now = time.perf_counter()
                if self.pending:
                    sent, done = self.pending.popleft()
                    if not done.done():
                        done.set_result(now - sent)

    async def request(self, text: str) -> asyncio.Future[float]:
        """Send and return a future of the round trip in seconds (not awaited here)."""
        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.pending.append((time.perf_counter(), done))
        await self.ws.send(text)
        return done

    def abort(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(Exception):
            self.ws.transport.abort()


async def open_link(port: int, node_id: str, token: str, register: bool) -> Link:
    from websockets.asyncio.client import connect

    # The options agent_worker/link.py uses, so compression and pings match a real agent.
    ws = await connect(
        f"ws://127.0.0.1:{port}/agent/",
        additional_headers={"Authorization": f"Bearer {token}", "X-Llmgw-Node": node_id},
        open_timeout=30, close_timeout=2, max_size=2**22,
    )  # fmt: skip
    if register:
        await ws.send(register_text(node_id))
        answer = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
        if answer.get("type") != "linked":
            raise SystemExit(f"{node_id} was not linked: {answer}")
    return Link(node_id, ws)


async def open_links(
    port: int, node_ids: list[str], tokens: dict[str, str], register: bool
) -> list[Link]:
    gate = asyncio.Semaphore(64)

    async def one(node_id: str) -> Link:
        async with gate:
            return await open_link(port, node_id, tokens[node_id], register)

    return list(await asyncio.gather(*(one(node_id) for node_id in node_ids)))


@dataclass
class Result:
    server: str
    phase: str
    offered: float | None  # None: saturation
    sent: int = 0  # heartbeats known handled
    probes: int = 0  # acknowledgement probes among them (saturation)
    elapsed: float = 0.0
    drain: float = 0.0  # from the end of the window to the last answer
    latencies: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    server_cpu: float = 0.0  # share of one core over the phase, barrier included
    server_cpu_seconds: float = 0.0
    client_cpu: float = 0.0

    @property
    def handled(self) -> float:
        return self.sent / self.elapsed

    @property
    def cpu_per_message(self) -> float:
        """Server CPU seconds per message: steadier than rates on a machine shared with others."""
        return self.server_cpu_seconds / max(1, self.sent + self.probes)

    def p(self, fraction: float, values: list[float] | None = None) -> float:
        """A percentile of the round trips (or of ``values``); 0 when nothing was measured."""
        measured = self.latencies if values is None else values
        return percentile(measured, fraction) if measured else 0.0

    def passes(self, limit: float) -> bool:
        """p99 within ``limit``, and no backlog left to grow: drain within DRAIN_LIMIT (or
        ``limit`` if longer), a fifth of the heartbeat interval. The drain is a backlog
        test, not a latency: its own noise is a few hundred ms at thousands of sockets."""
        return self.p(0.99) <= limit and self.drain <= max(limit, DRAIN_LIMIT)


class Bench:
    """The phases, against one server whose agents and probers are linked."""

    def __init__(
        self, server: str, pids: list[int], agents: list[Link], probers: list[Link]
    ) -> None:
        self.server = server
        self.pids = pids  # the server's processes, whose CPU is summed
        self.agents = agents
        self.probers = probers
        self.heartbeats = {link.node_id: heartbeat_text(i) for i, link in enumerate(agents)}
        self.probe_text = heartbeat_text(0)
        self.barrier_cost = 0.0

    async def _window(self, result: Result, seconds: float, senders) -> None:
        """Run senders(began, stop_at) beside the probers; fill in timing and CPU."""
        began = time.perf_counter()
        server_cpu, client_cpu = cpu_seconds(*self.pids), time.process_time()
        stop_at = began + seconds
        await asyncio.gather(self._probe(stop_at, result), *senders(began, stop_at))
        window_end = time.perf_counter()
        if result.offered is not None:
            await self._barrier()
            result.probes += len(self.agents)
        finished = time.perf_counter()
        # Paced: the backlog left at the window's end, less what the barrier costs when idle.
        result.drain = max(0.0, finished - window_end - self.barrier_cost)
        result.elapsed = seconds + result.drain if result.offered else finished - began
        result.server_cpu_seconds = cpu_seconds(*self.pids) - server_cpu
        result.server_cpu = result.server_cpu_seconds / (finished - began)
        result.client_cpu = (time.process_time() - client_cpu) / (finished - began)

    async def _probe(self, stop_at: float, result: Result) -> None:
        """Open loop: each prober sends on its schedule whether or not answers are back."""

        async def prober(link: Link, due: float) -> None:
            waits = []
            while due < stop_at:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                result.lag.append(time.perf_counter() - due)
                waits.append(await link.request(self.probe_text))
                due += PROBE_PERIOD
            for done in waits:
                with contextlib.suppress(TimeoutError):
                    result.latencies.append(await asyncio.wait_for(done, timeout=30))

        now = time.perf_counter()
        spread = PROBE_PERIOD / len(self.probers)
        await asyncio.gather(
            *(prober(link, now + i * spread) for i, link in enumerate(self.probers))
        )

    async def calibrate(self) -> None:
        """Time the barrier on an idle server, so a phase's drain counts only its backlog."""
        costs = []
        for _ in range(2):
            began = time.perf_counter()
            await self._barrier()
            costs.append(time.perf_counter() - began)
        self.barrier_cost = min(costs)

    async def _barrier(self) -> None:
        """Every agent's acknowledgement answered: all it sent before has been handled."""
        waits = [await link.request(self.ack(link)) for link in self.agents]
        await asyncio.wait_for(asyncio.gather(*waits), timeout=60)

    def ack(self, link: Link) -> str:
        return self.heartbeats[link.node_id][:-1] + PROBE_FIELD_SUFFIX

    async def paced(self, rate: float, seconds: float, phase: str) -> Result:
        """Every agent sends one heartbeat per interval, randomly phased, then a barrier."""
        result = Result(self.server, phase, rate)
        interval = len(self.agents) / rate

        async def agent(link: Link, began: float, stop_at: float) -> None:
            due = began + random.uniform(0, interval)
            while due < stop_at:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                result.lag.append(time.perf_counter() - due)
                await link.ws.send(self.heartbeats[link.node_id])
                result.sent += 1
                due += interval

        await self._window(result, seconds, lambda b, s: [agent(x, b, s) for x in self.agents])
        return result

    async def saturate(self, seconds: float) -> Result:
        """Closed rounds of PER_ROUND heartbeats and one acknowledgement, as fast as answered."""
        result = Result(self.server, "saturation", None)

        async def agent(link: Link, _began: float, stop_at: float) -> None:
            while time.perf_counter() < stop_at:
                for _ in range(PER_ROUND):
                    await link.ws.send(self.heartbeats[link.node_id])
                await asyncio.wait_for(await link.request(self.ack(link)), timeout=60)
                result.sent += PER_ROUND
                result.probes += 1

        saturating = self.agents[:SATURATING_AGENTS]
        await self._window(result, seconds, lambda b, s: [agent(x, b, s) for x in saturating])
        return result
