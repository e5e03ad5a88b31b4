"""How `make test` spreads the process tests over its xdist workers.

A module's tests go to one worker together (its module-scoped engines start once), and
every simulated-fleet test to one worker: they share the machine's network namespaces
(lsim-*), so they must take turns, and a worker waiting for its turn does nothing.

xdist's own ``loadgroup`` marks a group by appending it to each test's node id, which
pytest 9 no longer lets a plugin change: every test went out alone, and the simulated
fleets' tests waited for each other's lock on two workers. This scheduler groups by the
module's name instead, and hands the groups out in the collection's order, which
tests/processes/conftest.py sorts with the longest first (so that none starts last).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadScopeScheduling

SIMULATED_FLEET = "simulated-fleet"
SIMULATED_FLEET_MODULES = frozenset(
    {"test_sim", "test_sim_impair", "test_partitions", "test_walls"}
)
# Modules of a minute or more on two cores, longest first; the rest follow in file order.
LONGEST_FIRST = (
    SIMULATED_FLEET, "test_faults", "test_up_restarts", "test_restarts", "test_live_pages",
    "test_autoscale", "test_default_engine", "test_leadership", "test_rollout",
)  # fmt: skip


def group_of(module: str) -> str:
    """The unit a module's tests go out in: its own, or the simulated fleets' one."""
    return SIMULATED_FLEET if module in SIMULATED_FLEET_MODULES else module


def longest_first(module: str) -> int:
    """A sort key: where the module's group goes out."""
    group = group_of(module)
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


class ModulesTogether(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        path = PurePosixPath(nodeid.split("::", 1)[0])
        group = group_of(path.stem)
        return group if group == SIMULATED_FLEET else str(path)

    def schedule(self) -> None:
        # In the collection's order (longest first), not xdist's most-tests-first.
        self.config.option.loadscopereorder = False
        super().schedule()
