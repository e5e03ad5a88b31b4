"""Judge what a previous agent left running, from its state file.

An engine is taken over only if every process the file describes is still that process:
the pid exists, started when the file says, and runs the command line the file says.
A pid alone is not enough — it may have been handed to something else since.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_worker.supervision.process import ShardProcess, identify
from agent_worker.supervision.statedir import ShardRecord
from protocol.shard import ShardState


@dataclass(frozen=True)
class Verdict:
    """The processes still ours, and, for a shard that cannot go on, how it ends and why."""

    live: list[ShardProcess]
    ending: tuple[ShardState, str] | None

    @property
    def adoptable(self) -> bool:
        return self.ending is None


def judge(record: ShardRecord) -> Verdict:
    """Decide whether the shard in ``record`` can be adopted as it stands."""
    live, missing = [], []
    for proc in record.processes:
        problem = identify(proc)
        if problem is None:
            live.append(ShardProcess.adopt(proc))
        else:
            missing.append(problem)
    if record.stopping:
        # The previous agent was stopping it: finish that rather than revive it.
        return Verdict(live, ("stopped", "finished a stop the previous agent had begun"))
    if len(record.processes) < record.commands:
        reason = (
            f"the agent stopped while launching it: {len(record.processes)} of "
            f"{record.commands} commands had started"
        )
        return Verdict(live, ("failed", reason))
    if missing:
        return Verdict(live, ("failed", "; ".join(missing) + " (while no agent was watching)"))
    return Verdict(live, None)
