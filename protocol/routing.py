"""What routers are told about the fleet, and what they tell it back (DESIGN.md, "Apps").

The control plane publishes on ``ROUTING_CHANNEL`` whenever what routers serve changed
(a replica became ready or went away, a key was created or revoked); each router then
reloads a ``RoutingSnapshot`` (``fleet.routing_table.routing_snapshot``), with a periodic
full reload as the safety net for a lost message. The same model is what a static file
(router-only mode) is read into and what a router saves to disk after each load.

The other way, each router process writes what it routes and carries under
``INFLIGHT_KEY_PREFIX`` + its id, so a rolling restart knows when a drained replica is idle.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from protocol.serving import DEFAULT_SERVES

ROUTING_CHANNEL = "llmgw:routing"

# A key expired this long ago leaves what routers load (``catalog.keys.active_keys``, and
# the router's own cache whatever table the key came in): until then a router still tells
# its client that the key expired, rather than that it is unknown; after it, the expired
# keys the playground leaves behind no longer grow every router's table.
EXPIRED_KEYS_KEPT_SECONDS: Final = 3600

# How a router spreads one model's requests over its replicas (a profile's ``routing:``):
# to the one with the fewest in flight, or by the prompt's leading bytes, so requests that
# share a prefix (a system prompt) meet the engine cache that already holds it.
RoutingPolicy = Literal["least_outstanding", "prefix"]
LEAST_OUTSTANDING: Final = "least_outstanding"
PREFIX: Final = "prefix"
ROUTING_POLICIES: tuple[RoutingPolicy, ...] = (LEAST_OUTSTANDING, PREFIX)

# One key per router process: JSON {"at": unix time, "routed": [replica ids in its table],
# "inflight": {replica id: requests in flight}}; it expires when the router stops writing.
INFLIGHT_KEY_PREFIX = "llmgw:inflight:"
# Also {"models": {name: {"inflight": n, "queued": n}}}: the demand autoscaling follows;
# and "failing": [replica ids its breakers took out], which stand-ins follow.
INFLIGHT_REPORT_SECONDS = 1.0
# A few missed reports before a router counts as gone, so one slow write is not a stop.
INFLIGHT_REPORT_TTL = 5


class _Snapshot(BaseModel):
    # Not frozen: the producer fills a model's lists as it reads replicas one by one.
    model_config = ConfigDict(extra="forbid")


class ReplicaEndpoint(_Snapshot):
    """Rank 0 of one ready replica: where its requests go, and the secret its engine wants."""

    replica: str = Field(description="the replica's id; a static file uses the URL")
    url: str = Field(description="http://<node address>:<rank 0's port>")
    secret: str = Field(default="", description="sent as a bearer token; empty: none wanted")
    engine: str = Field(
        default="", description="the replica's engine (llama.cpp, vllm, sglang); empty: unknown"
    )
    serves: list[str] = Field(
        default_factory=lambda: list[str](DEFAULT_SERVES),
        description="what its profile serves (protocol.serving kinds)",
    )
    native: list[str] = Field(
        default_factory=list,
        description="the chat APIs its engine serves itself (messages, responses); the "
        "router translates the others onto its chat completions",
    )
    adapters: list[str] = Field(
        default_factory=list,
        description="the LoRA adapters (names in its model's adapters:) it was started with, "
        "in load order: llama.cpp's adapter ids",
    )
    max_loras: int = Field(
        default=0, ge=0, description="adapters it holds at once when it loads them while it "
        "runs (vLLM); 0: only those it was started with"
    )  # fmt: skip


class RoutableModel(_Snapshot):
    """One model as routers serve it: its ready endpoints, and why others are not ready."""

    name: str = Field(description="the catalog name, which is also the name the engine serves")
    aliases: list[str] = Field(default_factory=list)
    wanted: int = Field(default=0, ge=0, description="replicas its profiles ask for")
    endpoints: list[ReplicaEndpoint] = Field(default_factory=list)
    states: dict[str, int] = Field(
        default_factory=dict, description='replicas by state, with "draining" for ready ones '
        "being replaced"
    )  # fmt: skip
    reasons: list[str] = Field(
        default_factory=list, description="why replicas are not routable, in an operator's words"
    )
    routing: RoutingPolicy = Field(
        default=LEAST_OUTSTANDING, description="how its requests are spread over its endpoints"
    )
    concurrency: int = Field(
        default=0, ge=0, description="requests one replica serves at once, more wait in the "
        "router by priority; 0: no limit"
    )  # fmt: skip
    serves: list[str] = Field(
        default_factory=lambda: list[str](DEFAULT_SERVES),
        description="what its profiles serve together (protocol.serving kinds)",
    )
    autoscaled: bool = Field(
        default=False, description="its replicas follow demand: with none ready, requests wait "
        "for one instead of being refused"
    )  # fmt: skip
    parent: str = Field(
        default="", description="for a LoRA adapter, its base model, whose replicas serve it"
    )
    adapter: str = Field(default="", description="the adapter's name in its parent's adapters:")
    scale: float = Field(default=1.0, description="how strongly the adapter is applied")
    source: str = Field(
        default="", description="where a replica that loads adapters while it runs finds it"
    )


class RoutingSnapshot(_Snapshot):
    """Every model a router may be asked for, including those with nothing ready."""

    models: list[RoutableModel] = Field(default_factory=list)


# What each router served, per model: every second each router adds its counts since the
# last report into one Redis hash per model and TRAFFIC_BUCKET_SECONDS (so the hash holds
# every router's sum), kept a little over an hour. Fields: "requests", "prompt" and
# "completion" tokens, "error:<status or failure>", "ttft:<i>" (answers whose first byte
# came within TTFT_EDGES[i] seconds and after the edge before; "ttft:inf" past the last),
# and "inflight"/"waiting", the requests in flight and waiting, added once a second (so a
# bucket's sum over its seconds is their mean).
TRAFFIC_KEY_PREFIX = "llmgw:traffic:"
TRAFFIC_BUCKET_SECONDS = 10
TRAFFIC_KEEP_SECONDS = 3600 + 120
TTFT_EDGES: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


def traffic_key(model: str, at: float) -> str:
    """The hash of ``model``'s traffic in the bucket holding unix time ``at``."""
    start = int(at) // TRAFFIC_BUCKET_SECONDS * TRAFFIC_BUCKET_SECONDS
    return f"{TRAFFIC_KEY_PREFIX}{model}:{start}"
