"""The router's knobs, all from the environment; none of them needs Django settings."""

from __future__ import annotations

from dataclasses import dataclass

from core.env import env_bool, env_float, env_int, env_str, llmgw_home
from core.secret_files import metrics_token


@dataclass(frozen=True)
class RouterConfig:
    # Router-only mode: model -> endpoint URLs (and keys) from this YAML file, no database.
    static_path: str = ""
    # 16 MiB holds a long chat with images as data URLs; larger is almost surely a mistake.
    max_body: int = 16 * 1024 * 1024
    # Uploads (audio to transcribe) stream through to the engine and are never held whole;
    # this bounds what one may send.
    max_upload: int = 1024 * 1024 * 1024
    # How long a request waits for a replica: one starting from zero (a cold start loads a
    # model, minutes on a big one), or a free place when all are at their concurrency.
    cold_start_timeout: float = 600.0
    # Requests that may wait per model in one router; past this, the lowest priority gets 429.
    queue_size: int = 100
    # Choices per request: more than a handful is a mistake or an attack on the engine.
    max_choices: int = 16
    # An engine that does not accept a connection in 5 s is down, not busy.
    connect_timeout: float = 5.0
    # Silence between bytes; prefill of a long prompt on a CPU can take minutes.
    read_timeout: float = 600.0
    # The safety net behind pub/sub: a lost notification costs at most this long.
    refresh_seconds: float = 10.0
    # Accounting rows are written this often, never on a request's path.
    accounting_seconds: float = 1.0  # the ledger of record: written within a second
    # Consecutive failures that take a replica out, and for how long.
    breaker_failures: int = 3
    breaker_cooldown: float = 5.0
    # Session affinity gives way once a replica carries 1.25x the mean load.
    affinity_load_factor: float = 1.25
    # Connections kept to engines; past this, requests wait for one to free up.
    upstream_connections: int = 1024
    # /metrics asks for `Authorization: Bearer <token>` (the control plane's knob, and by
    # default its file: core.secret_files.metrics_token); "" (a router built in a test)
    # leaves it open.
    metrics_token: str = ""
    # The last table loaded from the database, served when a router starts while the
    # database is down; from_env defaults it to $LLMGW_HOME/router/routing-table.json,
    # and "" keeps none.
    table_file: str = ""
    # Serving that saved table, engines are health-checked this often: often enough that
    # a dead one is out within seconds, while a /health costs an engine next to nothing.
    probe_seconds: float = 2.0
    # A /health that takes longer than this counts as no answer.
    probe_timeout: float = 2.0
    # Prefix routing keys a request on at most this many leading bytes of its prompt: 2 KiB
    # (about 500 tokens) tells apart system prompts that open alike, and is the most a key
    # costs to read and hash (microseconds), however long the prompt.
    prefix_bytes: int = 2048
    # Those bytes count in whole blocks of this many (about 64 tokens): a shared part
    # shorter than one saves an engine little prefill, so its request goes by least
    # outstanding instead of being pinned for it.
    prefix_block: int = 256
    # Moves of one request to another replica after its engine broke off the answer: two
    # rides out one dead engine and one more failure, and bounds what a request that
    # kills engines (a prompt that crashes them) can do to the rest of its model's replicas.
    migrations: int = 2
    # Tokens reserved for an answer whose request names no max_tokens (issue 41).
    reserve_tokens: int = 4096
    # Where each router journals its usage before writing it ("" keeps none; journal.py).
    journal_dir: str = ""
    # Browser origins that may call the router (CORS), or "*" for any; none: no CORS
    # headers at all, and a browser on another origin is refused by its own rules.
    cors_origins: tuple[str, ...] = ()
    # Anthropic's Messages and OpenAI's Responses on an engine that lacks them are served
    # on its chat completions ("native": only there); "always" translates everywhere, to
    # test the translation or to get one behaviour from every engine.
    translate: str = "native"
    # Responses conversations the router keeps (router/conversations/): a day, as the
    # routers remember which replica made a response, and 2 MiB each (a long chat; a
    # client with more sends its conversation itself).
    conversation_seconds: float = 24 * 3600
    conversation_bytes: int = 2 * 1024 * 1024
    # Hosts, addresses and networks (CIDR) media URLs may point at although they are inside
    # the fleet (intake/media_urls.py): none, since engines fetch them from inside it.
    allow_private_urls: tuple[str, ...] = ()
    # Requests that need no waiting answered from the sockets' callbacks (forward/express.py);
    # off, every request takes the task path (a way out of a fault in it, and to measure).
    express: bool = True

    @classmethod
    def from_env(cls) -> RouterConfig:
        return cls(
            static_path=env_str("LLMGW_ROUTER_STATIC"),
            max_body=env_int("LLMGW_ROUTER_MAX_BODY", cls.max_body),
            max_upload=env_int("LLMGW_ROUTER_MAX_UPLOAD", cls.max_upload),
            max_choices=env_int("LLMGW_ROUTER_MAX_N", cls.max_choices),
            cold_start_timeout=env_float("LLMGW_ROUTER_COLD_START_TIMEOUT", cls.cold_start_timeout),
            queue_size=env_int("LLMGW_ROUTER_QUEUE_SIZE", cls.queue_size),
            connect_timeout=env_float("LLMGW_ROUTER_CONNECT_TIMEOUT", cls.connect_timeout),
            read_timeout=env_float("LLMGW_ROUTER_READ_TIMEOUT", cls.read_timeout),
            refresh_seconds=env_float("LLMGW_ROUTER_REFRESH_SECONDS", cls.refresh_seconds),
            accounting_seconds=env_float("LLMGW_ROUTER_ACCOUNTING_SECONDS", cls.accounting_seconds),
            breaker_failures=env_int("LLMGW_ROUTER_BREAKER_FAILURES", cls.breaker_failures),
            breaker_cooldown=env_float("LLMGW_ROUTER_BREAKER_COOLDOWN", cls.breaker_cooldown),
            affinity_load_factor=env_float(
                "LLMGW_ROUTER_AFFINITY_LOAD_FACTOR", cls.affinity_load_factor
            ),
            upstream_connections=env_int(
                "LLMGW_ROUTER_UPSTREAM_CONNECTIONS", cls.upstream_connections
            ),
            metrics_token=metrics_token(llmgw_home()),
            table_file=env_str(
                "LLMGW_ROUTER_TABLE_FILE", str(llmgw_home() / "router" / "routing-table.json")
            ),
            probe_seconds=env_float("LLMGW_ROUTER_PROBE_SECONDS", cls.probe_seconds),
            probe_timeout=env_float("LLMGW_ROUTER_PROBE_TIMEOUT", cls.probe_timeout),
            prefix_bytes=env_int("LLMGW_ROUTER_PREFIX_BYTES", cls.prefix_bytes),
            prefix_block=env_int("LLMGW_ROUTER_PREFIX_BLOCK", cls.prefix_block),
            migrations=env_int("LLMGW_ROUTER_MIGRATIONS", cls.migrations),
            reserve_tokens=env_int("LLMGW_ROUTER_RESERVE_TOKENS", cls.reserve_tokens),
            journal_dir=env_str(
                "LLMGW_ROUTER_JOURNAL", str(llmgw_home() / "router" / "usage-journal")
            ),
            cors_origins=tuple(
                origin.strip().rstrip("/")
                for origin in env_str("LLMGW_ROUTER_CORS_ORIGINS").split(",")
                if origin.strip()
            ),
            translate=env_str("LLMGW_ROUTER_TRANSLATE", cls.translate),
            conversation_seconds=env_float(
                "LLMGW_ROUTER_CONVERSATION_SECONDS", cls.conversation_seconds
            ),
            conversation_bytes=env_int("LLMGW_ROUTER_CONVERSATION_BYTES", cls.conversation_bytes),
            allow_private_urls=tuple(
                entry.strip()
                for entry in env_str("LLMGW_ROUTER_ALLOW_PRIVATE_URLS").split(",")
                if entry.strip()
            ),
            express=env_bool("LLMGW_ROUTER_EXPRESS", cls.express),
        )

    def __post_init__(self) -> None:
        if self.translate not in ("native", "always"):
            raise ValueError(
                f"LLMGW_ROUTER_TRANSLATE={self.translate!r}: use native (translate only for "
                "engines without the API) or always"
            )
        if self.migrations < 0:
            raise ValueError(
                f"LLMGW_ROUTER_MIGRATIONS={self.migrations}: moves per request cannot be "
                "negative; 0 ends a broken answer with an error, as without migration"
            )
        if self.prefix_block < 1 or self.prefix_bytes < self.prefix_block:
            raise ValueError(
                f"LLMGW_ROUTER_PREFIX_BLOCK={self.prefix_block} and LLMGW_ROUTER_PREFIX_BYTES="
                f"{self.prefix_bytes}: the block must be at least 1 byte and the prefix at "
                "least one block"
            )
