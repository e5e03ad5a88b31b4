"""Who a request is counted against (its key, then its key's team), what it may cost at
most, and what a client is told of its limits: OpenAI's ``x-ratelimit-*`` headers, and the
429 that names the limit reached, whose it is (the key's, its team's cap per key, its
team's) and how long to wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from protocol.rate_limits import CounterKeys, Limits, day_ends, month_ends, team_counter_name
from router.errors import RouterError
from router.intake.counters import Tally
from router.table.keys import Caller


@dataclass
class Admission:
    """An admitted request: what to charge it to, and the headers its answer carries."""

    request_id: str
    keys: CounterKeys
    headers: list[tuple[bytes, bytes]]
    shared: bool  # counted in Redis, not only in this process
    limits: Limits = field(default_factory=Limits)
    reserved: int = 0  # tokens reserved for it until it is settled
    # The same request's admissions by the other subjects it is counted against (its team).
    also: list[Admission] = field(default_factory=list)
    leased: bool = False  # its place is one of a block (places.py): request_id names it


@dataclass(frozen=True, slots=True)
class Subject:
    """Whose counters a request is held to: its key's, or its team's (all its keys)."""

    counted_as: str  # the key's prefix, or the team's counter name
    limits: Limits
    team: str = ""  # the team's name, for the team's counters


def counted_subjects(caller: Caller) -> list[Subject]:
    """The key, then its team, each where it has limits: a key or team without any costs
    no Redis round trip."""
    subjects = [Subject(caller.prefix, caller.limits)] if caller.limits else []
    if caller.team and caller.team_limits:
        subjects.append(Subject(team_counter_name(caller.team), caller.team_limits, caller.team))
    return subjects


def limit_headers(limits: Limits, tally: Tally) -> list[tuple[bytes, bytes]]:
    """OpenAI's ``x-ratelimit-*`` headers for the per-minute limits the key has."""
    headers = []
    for kind, limit, used, reset_ms in (
        ("requests", limits.requests_per_minute, tally.requests, tally.requests_reset_ms),
        ("tokens", limits.tokens_per_minute, tally.tokens, tally.tokens_reset_ms),
    ):
        if limit:
            headers += [
                (f"x-ratelimit-limit-{kind}".encode(), str(limit).encode()),
                (f"x-ratelimit-remaining-{kind}".encode(), str(max(0, limit - used)).encode()),
                (f"x-ratelimit-reset-{kind}".encode(), reset_text(reset_ms).encode()),
            ]
    return headers


def reset_text(ms: int) -> str:
    """A wait as OpenAI writes it in ``x-ratelimit-reset-*``: 20ms, 1s, 6m0s."""
    if ms < 1000:
        return f"{max(0, ms)}ms"
    seconds = math.ceil(ms / 1000)
    return f"{seconds // 60}m{seconds % 60}s" if seconds >= 60 else f"{seconds}s"


def refusal(
    caller: Caller, tally: Tally, now: float, headers: list[tuple[bytes, bytes]],
    subject: Subject | None = None,
) -> RouterError:  # fmt: skip
    """The 429 for the limit ``tally`` says was reached, with how long to wait: the key's
    own, its team's cap per key, or its team's (all its keys together)."""
    team = subject.team if subject is not None else ""
    limits = subject.limits if subject is not None else caller.limits
    kind = tally.refused
    field_name = REFUSED_FIELDS.get(kind, "concurrency")
    if team:
        who, its = f"Team {team} (key {caller.name})", "its"
        fix, limited_by = f"ask an operator to raise it (`llmgw_ctl teams update {team}`)", "team"
    elif field_name in caller.capped:
        who, its = f"Key {caller.name}", f"team {caller.team}'s cap per key,"
        fix, limited_by = "ask an operator to raise the team's cap", "team-key-cap"
    else:
        who, its = f"Key {caller.name}", "its"
        fix, limited_by = "ask an operator to raise it (`llmgw_ctl keys update`)", "key"
    if kind == "requests":
        wait = tally.requests_reset_ms / 1000
        message = f"{its} limit of {limits.requests_per_minute} requests per minute"
    elif kind == "tokens":
        wait = tally.tokens_reset_ms / 1000
        message = (
            f"{its} limit of {limits.tokens_per_minute} tokens per minute "
            f"({tally.tokens} used in the last minute)"
        )
    elif kind == "day":
        wait = day_ends(now) - now
        message = f"{its} budget of {limits.tokens_per_day} tokens for today (UTC)"
    elif kind == "month":
        wait = month_ends(now) - now
        message = f"{its} budget of {limits.tokens_per_month} tokens for this month (UTC)"
    else:
        wait = 1.0
        message = f"{its} limit of {limits.concurrency} requests in flight at once"
    retry_after = max(1, math.ceil(wait))
    budget = kind in ("day", "month")
    error = "insufficient_quota" if budget else "rate_limit_exceeded"
    return RouterError(
        429,
        f"{who} reached {message}; try again in {retry_after} s"
        + (f", or {fix}." if budget else "."),
        error,
        error,
        headers=[*headers, (b"retry-after", str(retry_after).encode()),
                 (b"x-llmgw-limited-by", limited_by.encode())],
    )  # fmt: skip


# The limit field each refusal names.
REFUSED_FIELDS = {"requests": "requests_per_minute", "tokens": "tokens_per_minute",
                  "day": "tokens_per_day", "month": "tokens_per_month"}  # fmt: skip


def has_budget(limits: Limits) -> bool:
    """Whether a day's or month's tokens are held to a budget."""
    return bool(limits.tokens_per_day or limits.tokens_per_month)


# What a request may generate at most, by the field its API names it with.
BUDGET_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
GENERATING_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses",
                              "/v1/messages"})  # fmt: skip


def worst_case(path: str, payload: dict[str, Any], body: bytes, default: int) -> int:
    """The tokens a request may cost at most, reserved when it is admitted: its prompt's
    size (a token per four bytes of body, which tokenizers beat) and its ``max_tokens``
    (``default`` where it names none), times its choices."""
    prompt = math.ceil(len(body) / 4)
    if path not in GENERATING_PATHS:
        return prompt
    budget: int = next((payload[f] for f in BUDGET_FIELDS if _is_count(payload.get(f))), default)
    choices: int = payload["n"] if _is_count(payload.get("n")) else 1
    return prompt + budget * max(1, choices)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
