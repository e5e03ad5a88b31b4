"""What one reconcile pass did, as the reconciler and its steps (the rollout) fill it in.

A leaf module the steps share without importing the reconciler. The verbs never see it:
each says what it did (the replica it made, whether it changed anything), and the step
that called it counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReconcileReport:
    created: list[str] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)
    unplaceable: list[str] = field(default_factory=list)
    stopping: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    draining: list[str] = field(default_factory=list)
    # Autoscaled profiles whose wanted count changed, with why.
    scaled: list[str] = field(default_factory=list)
    # Nodes told which engines to have (on link, on a catalog change, every 10 minutes).
    told_engines: list[str] = field(default_factory=list)
    # Walled nodes running engines told who their HTTP ports admit (a router joined...).
    told_callers: list[str] = field(default_factory=list)
    # Why the pass did not run (or stopped early), if it did not run whole.
    skipped: str = ""

    def did_anything(self) -> bool:
        return any(getattr(self, name) for name in self.counted())

    def counted(self) -> list[str]:
        return [name for name in self.__dataclass_fields__ if name != "skipped"]

    def summary(self) -> dict[str, object]:
        counts: dict[str, object] = {name: len(getattr(self, name)) for name in self.counted()}
        if self.skipped:
            counts["skipped"] = self.skipped
        return counts
