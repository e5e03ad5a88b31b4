"""The walls this agent keeps: one per shard, added before its engine starts and removed
once it has stopped, and the routers' and control planes' addresses they admit.

What decides whether a node keeps walls at all (``status``):

- ``off`` (``LLMGW_AGENT_FIREWALL=off``, or ``firewall: off`` in the agent file): the
  operator accepts engine ports open to the network; multi-node replicas still run;
- ``loopback``: the node's address is a loopback one (``llmgw up``, agents side by side on
  one machine), so engines listen where no other host reaches: no rule is needed, and the
  host's nftables are never touched;
- ``nftables``: ``nft`` is here and may change the node's rules: every shard is walled;
- ``unavailable``: the rules cannot be kept (no ``nft``, no right to change them, a kernel
  without nf_tables); one-node shards run open, with a warning on the node's page, and
  multi-node shards are refused (placement does not send them either).

The routers' and control planes' addresses (``callers``) come from the control plane: in
each StartShard, and in ``engine_callers`` commands when they change. The newest told is
kept on disk, so an agent that restarts walls what it adopts as it was told last.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from agent_worker.engines import get_adapter
from agent_worker.walls import nftables
from agent_worker.walls.openings import shard_wall
from agent_worker.walls.rules import ShardWall, WallError, check_source, ruleset
from core.files import write_atomically
from protocol.shard import ShardSpec

log = logging.getLogger("llmgw.agent.walls")

Status = Literal["nftables", "loopback", "off", "unavailable"]
SETTINGS = ("nftables", "off")


class Walls:
    """Thread-safe: commands, the supervisor's transitions and adoption all call in."""

    def __init__(self, setting: str, callers_file: Path) -> None:
        if setting not in SETTINGS:
            raise ValueError(f"firewall {setting!r}: use one of {', '.join(SETTINGS)}")
        self.setting = setting
        self.callers_file = callers_file
        self._callers = self._read_callers()
        self._specs: dict[str, ShardSpec] = {}  # the shards walled now
        self._applied: list[ShardWall] | None = None  # None: this agent applied nothing yet
        self._problem: str | None = None  # why nft cannot be used; checked once
        self._checked = False
        self._lock = threading.Lock()

    # -- what this node can do ---------------------------------------------------------

    def status(self, address: str) -> tuple[Status, str]:
        """Whether this node's engine ports are walled, and in words why not."""
        if self.setting == "off":
            return "off", "LLMGW_AGENT_FIREWALL=off: the operator accepted engine ports open"
        if is_loopback(address):
            return "loopback", f"engines listen on {address}, which no other host reaches"
        problem = self._nft_problem()
        if problem:
            return "unavailable", problem
        return "nftables", ""

    def _nft_problem(self) -> str | None:
        if not self._checked:
            self._problem = nftables.unavailable_reason()
            self._checked = True
            if self._problem:
                log.warning("engine ports cannot be walled on this node: %s", self._problem)
        return self._problem

    # -- shards ------------------------------------------------------------------------

    def wall(self, spec: ShardSpec) -> None:
        """Wall one shard before its engine starts; WallError when it must not start."""
        if not self._walled(spec):
            return
        with self._lock:
            self._apply({**self._specs, spec.shard_id: spec})

    def unwall(self, shard_id: str) -> None:
        """Remove a shard's wall once nothing of it runs (a no-op for one never walled)."""
        with self._lock:
            if shard_id not in self._specs:
                return
            try:
                self._apply({k: v for k, v in self._specs.items() if k != shard_id})
            except WallError as exc:
                log.error("shard %s stopped, and its wall could not be removed: %s", shard_id, exc)

    def keep_only(self, specs: Iterable[ShardSpec], node_address: str) -> None:
        """After adoption: exactly the walls of ``specs`` (the shards that still run), and
        nothing stale that an earlier agent left behind. A node that keeps no walls
        (``status`` of its ``node_address``) is not touched at all."""
        kept = {}
        for spec in specs:
            try:
                if self._walled(spec):
                    kept[spec.shard_id] = spec
            except WallError as exc:  # running already: say so, it is not stopped here
                log.error("shard %s runs unwalled: %s", spec.shard_id, exc)
        if not kept and self.status(node_address)[0] != "nftables":
            return  # nothing to wall, and no table an earlier agent could have left
        with self._lock:
            try:
                self._apply(kept, force=True)
            except WallError as exc:
                log.error("walling the %d adopted shard(s) again failed: %s", len(kept), exc)

    def set_callers(self, addresses: list[str]) -> list[str]:
        """The routers' and control planes' addresses, told by the control plane: kept on
        disk, and every HTTP port walled to them. Returns those refused as not addresses."""
        good, bad = [], []
        for address in addresses:
            try:
                check_source(address)
                good.append(address)
            except WallError:
                bad.append(address)
        with self._lock:
            if good == self._callers:
                return bad
            self._callers = good
            write_atomically(self.callers_file, json.dumps({"callers": good}) + "\n")
            try:
                self._apply(self._specs)
            except WallError as exc:
                log.error("engine HTTP ports could not be walled to the new callers: %s", exc)
        log.info("engine HTTP ports admit: %s", ", ".join(good) or "loopback only")
        return bad

    def walled_shards(self) -> list[str]:
        with self._lock:
            return sorted(self._specs)

    # -- inside ------------------------------------------------------------------------

    def _walled(self, spec: ShardSpec) -> bool:
        """Whether ``spec`` gets a wall; WallError when it may not run unwalled."""
        status, why = self.status(spec.host)
        if status == "nftables":
            return True
        if status == "unavailable" and spec.world_size > 1:
            raise WallError(
                f"a replica across nodes needs its ports walled, and this node cannot: {why}; "
                "install nftables on the node, or set LLMGW_AGENT_FIREWALL=off in the agent's "
                "environment to accept rpc-server and rendezvous ports open to the network"
            )
        return False

    def _apply(self, specs: dict[str, ShardSpec], force: bool = False) -> None:
        """Make the table exactly the walls of ``specs``; on failure nothing changed (one
        transaction) and WallError says why."""
        walls = [self._wall_of(spec) for spec in specs.values()]
        if walls == (self._applied or []) and not force:
            self._specs = dict(specs)  # nothing to change (nor anything ever applied)
            return
        nftables.run_script(ruleset(walls))
        self._specs, self._applied = dict(specs), walls

    def _wall_of(self, spec: ShardSpec) -> ShardWall:
        # The newest callers told to this node win over those its start carried.
        callers = self._callers if self._callers is not None else spec.callers
        try:
            return shard_wall(spec, get_adapter(spec.engine), callers)
        except (ValueError, LookupError) as exc:  # an engine this agent does not know
            raise WallError(f"shard {spec.shard_id}: {exc}") from None

    def _read_callers(self) -> list[str] | None:
        try:
            data = json.loads(self.callers_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s cannot be read (%s); walls use each shard's own list",
                        self.callers_file, exc)  # fmt: skip
            return None
        callers = data.get("callers") if isinstance(data, dict) else None
        return [str(c) for c in callers] if isinstance(callers, list) else None


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False
