"""What owned hardware cost each team: each replica's node-seconds at the operator's price,
split across the keys that used its model in each hour by tokens served.

Node-seconds are GPU-seconds (a shard's GPUs) or, for a shard on no GPU, CPU core-seconds
(its node's logical CPUs: a CPU engine takes the whole node). A replica holds its nodes
from each transition into starting, ready or stopping to the next one out of them, read
from the audit log. An hour of a model with no tokens served is idle: it goes to the
model's owning team (the one team it is open to) or to ``unassigned``. Sums are exact
fractions until the end, then rounded to the cent so that the parts add up to the fleet's
rounded total (largest remainders get the odd cents).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from django.conf import settings
from django.db.models import Prefetch, Sum

from audit.models import Event, EventKind
from catalog.models import Model
from fleet.models import Node, Replica, ReplicaState
from router.models import Usage
from router.usage.report import UNASSIGNED, key_teams

CENT = Decimal("0.01")
HOUR = timedelta(hours=1)
MICROSECOND = timedelta(microseconds=1)
# The states in which a replica's shards hold their nodes' GPUs (or cores).
HOLDING = frozenset({ReplicaState.STARTING, ReplicaState.READY, ReplicaState.STOPPING})


@dataclass(frozen=True)
class Prices:
    """What an hour of one GPU, or of one CPU core, costs (the operator's own figure)."""

    gpu_hour: Decimal = Decimal(0)
    cpu_core_hour: Decimal = Decimal(0)

    @classmethod
    def configured(cls) -> Prices:
        return cls(settings.COST_PER_GPU_HOUR, settings.COST_PER_CPU_CORE_HOUR)

    @property
    def unset(self) -> bool:
        return not self.gpu_hour and not self.cpu_core_hour


@dataclass(frozen=True)
class Held:
    """One stretch of time a replica held its nodes."""

    model: str
    start: datetime
    end: datetime
    gpus: int
    cpu_cores: int


@dataclass
class Share:
    """A team's part: tokens, node-seconds and cost, served and idle apart."""

    tokens: int = 0
    gpu_seconds: Fraction = Fraction(0)
    core_seconds: Fraction = Fraction(0)
    served: Fraction = Fraction(0)
    idle: Fraction = Fraction(0)


@dataclass(frozen=True)
class TeamCost:
    team: str
    tokens: int
    gpu_seconds: int
    core_seconds: int
    served: Decimal  # to the cent
    idle: Decimal

    @property
    def cost(self) -> Decimal:
        return self.served + self.idle


@dataclass(frozen=True)
class CostReport:
    since: datetime
    until: datetime
    prices: Prices
    teams: list[TeamCost] = field(default_factory=list)
    fleet: Decimal = Decimal(0)  # what every replica's node-seconds cost, to the cent

    @property
    def adds_up(self) -> bool:
        return sum((t.cost for t in self.teams), Decimal(0)) == self.fleet


def held_stretches(since: datetime, until: datetime) -> list[Held]:
    """Every stretch of [since, until) some replica held nodes, cut to the window."""
    # One that last changed state before the window into a state holding nothing held
    # nothing in it; what is left is the window's replicas and the live ones.
    nodes = Node.objects.only("id", "inventory")
    replicas = list(
        Replica.objects.exclude(
            state__in=set(ReplicaState) - HOLDING, state_changed_at__lte=since
        ).prefetch_related("shards", Prefetch("shards__node", queryset=nodes))
    )
    events = defaultdict(list)
    rows = Event.objects.filter(
        kind=EventKind.REPLICA, subject__in=[str(r.id) for r in replicas], at__lt=until
    ).order_by("at", "id")
    for subject, at, state in rows.values_list("subject", "at", "to_state"):
        events[subject].append((at, state))
    found = []
    for replica in replicas:
        gpus = sum(len(shard.gpus) for shard in replica.shards.all())
        cores = sum(
            _cores(shard.node.inventory) if shard.node is not None else 0
            for shard in replica.shards.all()
            if not shard.gpus
        )
        for start, end in _holding(events[str(replica.id)], replica, until):
            start, end = max(start, since), min(end, until)
            if start < end:
                found.append(Held(replica.model_name, start, end, gpus, cores))
    return found


def _holding(events, replica: Replica, until: datetime) -> Iterator[tuple[datetime, datetime]]:
    opened = None
    for at, state in events:
        if state in HOLDING and opened is None:
            opened = at
        elif state not in HOLDING and opened is not None:
            yield opened, at
            opened = None
    if not events and replica.state in HOLDING:  # its events are gone: since it last started
        opened = replica.starting_since or replica.created_at
    if opened is None:
        return
    # The row says it holds nothing now, though no Event closed the stretch: it ended at
    # the row's last change at the latest.
    yield opened, until if replica.state in HOLDING else min(until, replica.state_changed_at)


def _cores(inventory: Mapping) -> int:
    return int((inventory.get("cpu") or {}).get("cores") or 0)


def hourly_node_seconds(
    stretches: Iterable[Held],
) -> dict[tuple[str, datetime], tuple[Fraction, Fraction]]:
    """GPU-seconds and core-seconds per model and hour (the hour's start, as usage rows)."""
    # Whole microseconds while adding up (a month of a thousand replicas is millions of
    # steps: fractions there cost seconds), exact fractions of a second at the end.
    micro: dict[tuple[str, datetime], list[int]] = defaultdict(lambda: [0, 0])
    for held in stretches:
        hour = held.start.replace(minute=0, second=0, microsecond=0)
        while hour < held.end:
            overlap = (min(hour + HOUR, held.end) - max(hour, held.start)) // MICROSECOND
            sums = micro[held.model, hour]
            sums[0] += overlap * held.gpus
            sums[1] += overlap * held.cpu_cores
            hour += HOUR
    return {
        slot: (Fraction(gpu, 1_000_000), Fraction(core, 1_000_000))
        for slot, (gpu, core) in micro.items()
    }


def hourly_tokens(since: datetime, until: datetime) -> dict[tuple[str, datetime], dict[str, int]]:
    """Tokens per team per model and hour; an adapter's count toward its base model."""
    base = {aid: m.name for m in Model.objects.all() for aid in m.adapter_ids()}
    teams = key_teams()
    first_hour = since.replace(minute=0, second=0, microsecond=0)
    rows = (
        Usage.objects.filter(hour__gte=first_hour, hour__lt=until)
        .values("model", "hour", "key_prefix")
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    tokens: dict[tuple[str, datetime], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        team = teams.get(row["key_prefix"], UNASSIGNED)
        tokens[base.get(row["model"], row["model"]), row["hour"]][team] += (
            row["prompt"] + row["completion"]
        )
    return tokens


def owners() -> dict[str, str]:
    """Each model open to exactly one team, and that team."""
    open_to = defaultdict(list)
    for model, team in Model.teams.through.objects.values_list("model__name", "team__name"):
        open_to[model].append(team)
    return {model: teams[0] for model, teams in open_to.items() if len(teams) == 1}


def split(
    node_seconds: Mapping[tuple[str, datetime], tuple[Fraction, Fraction]],
    tokens: Mapping[tuple[str, datetime], Mapping[str, int]],
    owned_by: Mapping[str, str],
    prices: Prices,
) -> dict[str, Share]:
    """Each team's exact share: an hour's node-seconds (and their cost) by tokens served
    in it; an hour without tokens to the model's owner as idle."""
    gpu_rate = Fraction(prices.gpu_hour) / 3600
    core_rate = Fraction(prices.cpu_core_hour) / 3600
    shares: dict[str, Share] = defaultdict(Share)
    for used in tokens.values():
        for team, count in used.items():
            shares[team].tokens += count
    for (model, hour), (gpu, core) in node_seconds.items():
        cost = gpu * gpu_rate + core * core_rate
        used = {team: count for team, count in tokens.get((model, hour), {}).items() if count}
        total = sum(used.values())
        if not total:
            share = shares[owned_by.get(model, UNASSIGNED)]
            share.gpu_seconds += gpu
            share.core_seconds += core
            share.idle += cost
            continue
        for team, count in used.items():
            part = Fraction(count, total)
            shares[team].gpu_seconds += gpu * part
            shares[team].core_seconds += core * part
            shares[team].served += cost * part
    return dict(shares)


def to_cents(exact: Mapping[str, Fraction]) -> dict[str, Decimal]:
    """Each part to the cent, so that the parts add up to the total's rounding (largest
    remainders take the cents floors left over; ties by name)."""
    total_cents = int(_decimal(sum(exact.values(), Fraction(0)) * 100).quantize(
        Decimal(1), rounding=ROUND_HALF_UP))  # fmt: skip
    floors = {name: value * 100 // 1 for name, value in exact.items()}
    left = total_cents - int(sum(floors.values()))
    by_remainder = sorted(exact, key=lambda name: (-(exact[name] * 100 - floors[name]), name))
    for name in by_remainder[:left]:
        floors[name] += 1
    return {name: Decimal(int(cents)) * CENT for name, cents in floors.items()}


def _decimal(value: Fraction) -> Decimal:
    return Decimal(value.numerator) / Decimal(value.denominator)


def team_costs(since: datetime, until: datetime, prices: Prices | None = None) -> CostReport:
    """Per team tokens, node-seconds and cost over [since, until), and the fleet's cost."""
    prices = prices or Prices.configured()
    node_seconds = hourly_node_seconds(held_stretches(since, until))
    shares = split(node_seconds, hourly_tokens(since, until), owners(), prices)
    parts = {(team, kind): getattr(share, kind) for team, share in shares.items()
             for kind in ("served", "idle")}  # fmt: skip
    cents = to_cents({f"{team}\0{kind}": value for (team, kind), value in parts.items()})
    teams = [
        TeamCost(team, share.tokens, round(share.gpu_seconds), round(share.core_seconds),
                 cents[f"{team}\0served"], cents[f"{team}\0idle"])
        for team, share in shares.items()
    ]  # fmt: skip
    teams.sort(key=lambda t: (-t.cost, -t.tokens, t.team))
    return CostReport(since, until, prices, teams, fleet_cost(node_seconds, prices))


def fleet_cost(
    node_seconds: Mapping[tuple[str, datetime], tuple[Fraction, Fraction]], prices: Prices
) -> Decimal:
    """What all the node-seconds cost, to the cent: what the teams' parts must add up to."""
    gpu, core = Fraction(0), Fraction(0)
    for g, c in node_seconds.values():
        gpu, core = gpu + g, core + c
    exact = (gpu * Fraction(prices.gpu_hour) + core * Fraction(prices.cpu_core_hour)) / 3600
    return _decimal(exact).quantize(CENT, rounding=ROUND_HALF_UP)
