"""What the agent keeps about itself across restarts: its generation and the newest epoch.

The generation grows by one each time an agent starts on this node, so status sequence
numbers keep growing across restarts (a control plane that holds seq N from the last
agent takes the new agent's statuses as newer). The highest leader epoch seen is kept
so that a deposed leader's commands stay refused after an agent restart, not only until it.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from core.files import write_atomically

log = logging.getLogger("llmgw.agent.state")


class AgentState:
    """The agent's own small state file (``agent-state.json`` in the agent directory)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.generation = 0
        self.highest_epoch = 0
        try:
            data = json.loads(self.path.read_text())
            self.generation = int(data.get("generation", 0))
            self.highest_epoch = int(data.get("highest_epoch", 0))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as err:
            # Starting over is safe for the epoch (the next command raises it again) and,
            # for sequence numbers, only risks statuses read as old until a register.
            log.error("%s is unreadable (%s); starting from generation 0", self.path, err)

    def begin_generation(self) -> int:
        """Count this agent's start and return its generation."""
        with self._lock:
            self.generation += 1
            self._save()
            return self.generation

    def accept_epoch(self, epoch: int) -> bool:
        """False for a command from an epoch older than one already seen; remember newer ones."""
        with self._lock:
            if epoch < self.highest_epoch:
                return False
            if epoch > self.highest_epoch:
                self.highest_epoch = epoch
                self._save()
            return True

    def _save(self) -> None:
        data = {"generation": self.generation, "highest_epoch": self.highest_epoch}
        write_atomically(self.path, json.dumps(data))
