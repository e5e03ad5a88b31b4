"""Each command obeyed once, and the commands refused told as a count.

A signed command could be read off the broker and put back on the queue before its
deadline (two minutes for a start, ten for a stop), and be obeyed again: an engine
started after its stop. Every command carries an id the control plane signs, and the
agent obeys each id once. The ids are kept until their deadlines pass, in memory and in
``commands-done.json`` in the agent directory, so a restarted agent refuses a replay too.

A refused command (unsigned, altered, another node's, late, replayed) is told to the
control plane, which records an Event on the node; anything that can write to the broker
could queue thousands. The first refusal is told at once, the rest are counted and told
when the minute since is over, as one message saying how many and the last one's reason.
A command that comes before the agent learned its command key (a power-on, a restart
while the control plane is away) cannot be checked at all: it is dropped, said once in
the agent log, and not told, since most are llmgw's own and are sent again on link.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from core.files import write_atomically
from protocol.messages import CommandRefused

log = logging.getLogger("llmgw.agent.commands")

# At most one report of refused commands in this many seconds.
REPORT_EVERY = 60.0

Schedule = Callable[[float, Callable[[], None]], None]


def _later(delay: float, callback: Callable[[], None]) -> None:
    timer = threading.Timer(delay, callback)
    timer.daemon = True  # a count not yet told is not worth holding a stopping agent for
    timer.start()


class CommandGuard:
    """The ids of commands obeyed (until their deadlines), and refusals not yet told."""

    def __init__(
        self,
        path: Path,
        send: Callable[[CommandRefused], None],
        *,
        schedule: Schedule = _later,
        clock: Callable[[], float] = time.time,
        every: float = REPORT_EVERY,
    ) -> None:
        self.path = Path(path)
        self.send = send
        self.schedule = schedule
        self.clock = clock
        self.every = every
        self._lock = threading.Lock()
        self._done = self._read()
        self._counted = 0
        self._last = ("", "")  # the last refused command's task and reason
        self._told_at: float | None = None
        self._report_waiting = False
        self._dropped_before_key = 0  # since the last command checked with a key

    def first_time(self, command_id: str, deadline: float, now: float | None = None) -> bool:
        """Remember ``command_id`` until ``deadline``; False if it was obeyed already."""
        now = self.clock() if now is None else now
        with self._lock:
            self._done = {known: until for known, until in self._done.items() if until >= now}
            if command_id in self._done:
                return False
            self._done[command_id] = deadline
            self._save()
            return True

    def remembered(self) -> list[str]:
        with self._lock:
            return list(self._done)

    def dropped_before_key(self, task: str) -> None:
        """Drop a command that came before this agent learned its command key: one line in
        the agent log for the first since the last key, nothing for the rest."""
        with self._lock:
            self._dropped_before_key += 1
            first = self._dropped_before_key == 1
        if first:
            log.warning("dropping %s and the other commands that arrive before this agent "
                        "learned its command key (on linking): the control plane sends what "
                        "still stands again once the node links", task)  # fmt: skip

    def key_in_hand(self) -> None:
        """A command was checked with the key: a later spell without one is said anew."""
        with self._lock:
            dropped, self._dropped_before_key = self._dropped_before_key, 0
        if dropped:
            log.debug("%d command(s) were dropped before this agent learned its key", dropped)

    def refused(self, task: str, reason: str) -> None:
        """Count a refused command: told at once if nothing was told this minute, else
        with the others once the minute is over."""
        now = self.clock()
        with self._lock:
            self._counted += 1
            self._last = (task, reason)
            if self._told_at is None or now - self._told_at >= self.every:
                message = self._take(now)
            elif self._report_waiting:
                return
            else:
                self._report_waiting, message = True, None
                wait = self._told_at + self.every - now
        if message is not None:
            self.send(message)
        else:
            self.schedule(wait, self.report)

    def report(self) -> None:
        """Tell what was counted since the last report, if anything."""
        with self._lock:
            self._report_waiting = False
            message = self._take(self.clock()) if self._counted else None
        if message is not None:
            self.send(message)

    def _take(self, now: float) -> CommandRefused:
        (task, reason), count = self._last, self._counted
        self._counted, self._told_at = 0, now
        return CommandRefused(task=task[:200], reason=reason[:2000], count=count)

    def _read(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text())
            now = self.clock()
            return {str(k): float(v) for k, v in data.items() if float(v) >= now}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as err:
            # Commands obeyed in the last ten minutes could be obeyed once more; say so.
            log.error("%s is unreadable (%s); replays of recent commands are not refused",
                      self.path, err)  # fmt: skip
            return {}

    def _save(self) -> None:
        write_atomically(self.path, json.dumps(self._done))
