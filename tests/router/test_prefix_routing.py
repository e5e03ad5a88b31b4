"""Prefix routing: the key a request's shared prompt prefix gives, the replica it keeps to,
and ``routing: prefix`` from the catalog (file and API) through the snapshot to the table."""

from __future__ import annotations

import textwrap

import httpx
import pytest
import yaml

from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from catalog.plan import export_catalog
from catalog.schema import CatalogError, parse_catalog
from fleet.models import ReplicaState
from fleet.routing_table import routing_snapshot
from protocol.engine_serves import prefix_cache_switched_off
from protocol.routing import RoutableModel, RoutingSnapshot
from router.balance.balancer import Balancer
from router.balance.prefix import affinity_for, prefix_key
from router.config import RouterConfig
from router.table.routes import Endpoint, RoutingTable, StaticFileError, load_static
from tests.factories import SETUP, make_model, make_node, make_profile, make_replica, make_shard

CHAT = "/v1/chat/completions"
SIZE, BLOCK = 2048, 256
# Two system prompts of over a block that open alike, as a company's prompts do.
SUPPORT = "You are the support assistant of Example Corp. " + "Answer from the manual. " * 40
BILLING = "You are the support assistant of Example Corp. " + "Answer about invoices. " * 40


def chat(*messages: tuple[str, object]) -> dict:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}


def key(payload: dict, path: str = CHAT) -> str | None:
    return prefix_key(payload, path, SIZE, BLOCK)


# -- the key ------------------------------------------------------------------------------


def test_one_system_prompt_with_different_questions_gives_one_key():
    first = key(chat(("system", SUPPORT), ("user", "How do I reset my password?")))
    second = key(chat(("system", SUPPORT), ("user", "Why is the light blinking " * 30)))
    assert first is not None
    assert first == second


def test_system_prompts_that_differ_give_different_keys():
    support = key(chat(("system", SUPPORT), ("user", "Hi")))
    billing = key(chat(("system", BILLING), ("user", "Hi")))
    assert support != billing


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(chat(("system", "Be brief."), ("user", "Hi " * 500)), id="short-system"),
        pytest.param(chat(("user", "What is 2 + 2?")), id="one-short-message"),
        pytest.param(chat(), id="no-messages"),
        pytest.param({"model": "m", "messages": "not a list"}, id="messages-not-a-list"),
    ],
)
def test_less_than_one_shared_block_gives_no_key(payload):
    assert key(payload) is None


def test_text_parts_read_like_the_same_text_as_a_string():
    parts = [
        {"type": "text", "text": SUPPORT[:1000]},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": SUPPORT[1000:]},
    ]
    as_parts = key(chat(("system", parts), ("user", "Hi")))
    as_string = key(chat(("system", SUPPORT), ("user", "Hi")))
    assert as_parts is not None
    assert as_parts == as_string


def test_the_role_is_part_of_the_key():
    assert key(chat(("system", SUPPORT), ("user", "Hi"))) != key(
        chat(("developer", SUPPORT), ("user", "Hi"))
    )


def test_bytes_past_the_prefix_size_do_not_count():
    long_prompt = "x" * SIZE
    assert key(chat(("system", long_prompt + "tail one"), ("user", "a"))) == key(
        chat(("system", long_prompt + "tail two"), ("user", "b"))
    )


def test_a_conversation_keeps_its_key_once_its_opening_fills_the_prefix():
    opening = chat(("system", SUPPORT * 3), ("user", "First question"))
    later = chat(
        ("system", SUPPORT * 3), ("user", "First question"), ("assistant", "An answer"),
        ("user", "A follow-up"),
    )  # fmt: skip
    assert key(opening) is not None
    assert key(opening) == key(later)


def test_a_completion_is_keyed_on_its_prompt_and_embeddings_on_nothing():
    def completion(prompt):
        return {"model": "m", "prompt": prompt}

    shared = "Context: " + "the manual says many things. " * 100
    first = key(completion(shared + "Q: one?"), "/v1/completions")
    assert first is not None
    assert first == key(completion([shared + "Q: two?", "other"]), "/v1/completions")
    assert key(completion(list(range(1000))), "/v1/completions") is not None
    assert key({"model": "m", "input": shared}, "/v1/embeddings") is None


def test_text_that_is_not_valid_unicode_still_gives_a_key():
    assert key(chat(("system", "\ud800" + SUPPORT), ("user", "Hi"))) is not None


# -- the hook the router calls --------------------------------------------------------------


def route(routing: str, endpoints: int = 3):
    snapshot = RoutingSnapshot(
        models=[
            RoutableModel(
                name="m",
                routing=routing,
                endpoints=[
                    {"replica": f"r{i}", "url": f"http://10.0.0.{i}:9000"} for i in range(endpoints)
                ],
            )
        ]
    )
    return RoutingTable.from_snapshot(snapshot).routes["m"]


def test_a_prefix_route_keys_requests_on_their_prefix():
    payload = chat(("system", SUPPORT), ("user", "Hi"))
    assert affinity_for(route("prefix"), payload, CHAT, None, RouterConfig()) == key(payload)


@pytest.mark.parametrize(
    ("routing", "session", "endpoints", "expected"),
    [
        pytest.param("prefix", "client-session", 3, "client-session", id="session-wins"),
        pytest.param("least_outstanding", None, 3, None, id="least-outstanding"),
        pytest.param("prefix", None, 1, None, id="one-endpoint-nothing-to-choose"),
    ],
)
def test_other_requests_keep_what_the_client_sent(routing, session, endpoints, expected):
    payload = chat(("system", SUPPORT), ("user", "Hi"))
    got = affinity_for(route(routing, endpoints), payload, CHAT, session, RouterConfig())
    assert got == expected


def test_the_prefix_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("LLMGW_ROUTER_PREFIX_BYTES", "1024")
    monkeypatch.setenv("LLMGW_ROUTER_PREFIX_BLOCK", "128")
    config = RouterConfig.from_env()
    assert (config.prefix_bytes, config.prefix_block) == (1024, 128)
    monkeypatch.setenv("LLMGW_ROUTER_PREFIX_BLOCK", "4096")
    with pytest.raises(ValueError, match="LLMGW_ROUTER_PREFIX_BLOCK=4096"):
        RouterConfig.from_env()


# -- the balancer, given prefix keys -----------------------------------------------------------

ENDPOINTS = [Endpoint(f"r{i}", f"http://10.0.0.{i}:9000", b"") for i in range(3)]
PREFIXES = [key(chat(("system", f"Prompt {n}. " + SUPPORT), ("user", "Hi"))) for n in range(20)]


def test_one_prefix_keeps_to_one_replica_and_prefixes_spread_over_all():
    balancer = Balancer()
    chosen = {}
    for prefix in PREFIXES:
        picks = {balancer.pick(ENDPOINTS, session=prefix) for _ in range(5)}
        assert len(picks) == 1
        chosen[prefix] = picks.pop()
    assert set(chosen.values()) == set(ENDPOINTS)


def test_a_replica_above_load_factor_times_the_mean_is_passed_over():
    balancer = Balancer(load_factor=1.25)
    prefix = PREFIXES[0]
    home = balancer.pick(ENDPOINTS, session=prefix)
    # Two in flight on its replica, none elsewhere: 3 would be over 1.25 x (2 + 1) / 3.
    balancer.started(home.replica)
    balancer.started(home.replica)
    elsewhere = balancer.pick(ENDPOINTS, session=prefix)
    assert elsewhere != home
    # Once the load evens out, the prefix goes home to its cache.
    balancer.finished(home.replica, ok=True)
    balancer.finished(home.replica, ok=True)
    assert balancer.pick(ENDPOINTS, session=prefix) == home


# -- the catalog: file, API, apply ------------------------------------------------------------


def catalog(engine: str = "llama.cpp", routing: str = "prefix", args=(), env=None) -> str:
    profile = {"name": "p", "engine": engine, "routing": routing, "args": list(args)}
    if env:
        profile["env"] = env
    return yaml.safe_dump({"models": [{"name": "m", "source": "org/m", "profiles": [profile]}]})


@pytest.mark.parametrize(
    ("engine", "args", "env", "switch"),
    [
        ("vllm", ["--no-enable-prefix-caching"], None, "--no-enable-prefix-caching"),
        ("vllm", ["--no_enable_prefix_caching"], None, "--no_enable_prefix_caching"),
        ("sglang", ["--disable-radix-cache"], None, "--disable-radix-cache"),
        ("llama.cpp", ["--no-cache-prompt"], None, "--no-cache-prompt"),
        ("llama.cpp", [], {"LLAMA_ARG_CACHE_PROMPT": "0"}, "LLAMA_ARG_CACHE_PROMPT=0"),
    ],
    ids=["vllm", "vllm-underscores", "sglang", "llama.cpp", "llama.cpp-env"],
)
def test_prefix_routing_to_an_engine_without_its_prefix_cache_is_refused(engine, args, env, switch):
    with pytest.raises(CatalogError) as refused:
        parse_catalog(catalog(engine, args=args, env=env))
    (problem,) = refused.value.problems
    assert problem.startswith("catalog.yaml: models[0] (m): profiles[0] (p): routing: ")
    assert f"{switch} turns {engine}'s prefix cache off" in problem
    assert f"remove {switch}, or use routing: least_outstanding" in problem


@pytest.mark.parametrize(
    ("engine", "routing", "args", "env"),
    [
        ("vllm", "prefix", ["--no-enable-prefix-caching", "--enable-prefix-caching"], None),
        ("llama.cpp", "prefix", ["--cache-prompt"], {"LLAMA_ARG_CACHE_PROMPT": "0"}),
        ("llama.cpp", "prefix", ["--cache-reuse", "256"], None),
        ("sglang", "least_outstanding", ["--disable-radix-cache"], None),
    ],
    ids=["last-flag-wins", "flag-wins-over-env", "cache-on", "no-prefix-routing"],
)
def test_routing_is_accepted_where_the_cache_stays_on_or_is_not_relied_on(
    engine, routing, args, env
):
    (model,) = parse_catalog(catalog(engine, routing, args, env)).models
    assert model.profiles[0].routing == routing
    assert prefix_cache_switched_off("tgi", ["--no-cache-prompt"], {}) is None


def test_an_unknown_routing_is_refused_with_the_choices():
    with pytest.raises(CatalogError, match="routing: unknown routing 'round_robin'; use "
                       "least_outstanding or prefix"):  # fmt: skip
        parse_catalog(catalog(routing="round_robin"))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"routing": "prefix", "args": ["--no-cache-prompt"]}, "routing"),
        ({"routing": "fastest"}, "routing"),
    ],
    ids=["cache-off", "unknown"],
)
def test_the_api_refuses_the_same_routing_naming_the_field(api_client, operator, body, field):
    make_model(name="gemma")
    api_client.force_authenticate(operator)
    payload = {"model": "gemma", "name": "cpu", "engine": "llama.cpp", **body}
    response = api_client.post("/api/v1/profiles/", payload, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert not Profile.objects.exists()


@pytest.mark.django_db
def test_the_api_refuses_turning_the_cache_off_under_prefix_routing(api_client, operator):
    profile = make_profile(routing="prefix")
    api_client.force_authenticate(operator)
    response = api_client.patch(
        f"/api/v1/profiles/{profile.id}/", {"args": ["--no-cache-prompt"]}, format="json"
    )
    assert response.status_code == 400
    assert "--no-cache-prompt turns llama.cpp's prefix cache off" in response.json()["routing"][0]


@pytest.mark.django_db
def test_the_api_sets_routing_without_changing_the_fingerprint(api_client, operator):
    profile = make_profile(args=["--threads", "2"])
    before = profile.fingerprint()
    api_client.force_authenticate(operator)
    response = api_client.patch(
        f"/api/v1/profiles/{profile.id}/", {"routing": "prefix"}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["routing"] == "prefix"
    assert response.json()["fingerprint"] == before
    profile.refresh_from_db()
    assert profile.routing == "prefix"


CATALOG = textwrap.dedent(
    """
    models:
      - name: gemma
        source: /abs/gemma.gguf
        profiles:
          - name: cpu
            engine: llama.cpp
            args: ["--cache-reuse", "256"]
            {routing}
    """
)


@pytest.mark.django_db
def test_apply_plans_and_saves_routing_and_the_fingerprint_stays():
    apply_catalog(CATALOG.format(routing=""), actor=SETUP)
    profile = Profile.objects.get()
    before = profile.fingerprint()
    prefix = CATALOG.format(routing="routing: prefix")

    planned = apply_catalog(prefix, dry_run=True, actor=SETUP)
    assert [c.describe() for c in planned] == [
        "~ profile gemma/cpu: routing 'least_outstanding' -> 'prefix'"
    ]
    profile.refresh_from_db()
    assert profile.routing == "least_outstanding"

    apply_catalog(prefix, actor=SETUP)
    profile.refresh_from_db()
    assert profile.routing == "prefix"
    assert profile.fingerprint() == before
    assert export_catalog()["models"][0]["profiles"][0]["routing"] == "prefix"
    assert apply_catalog(prefix, actor=SETUP) == []


# -- the snapshot and the table ----------------------------------------------------------------


def ready(profile, node: str, port: int):
    replica = make_replica(profile, state=ReplicaState.READY)
    make_shard(replica, rank=0, node=make_node(node, address="10.0.0.1"), port=port)
    return replica


@pytest.mark.django_db
def test_the_snapshot_routes_a_model_by_prefix_when_a_ready_profile_asks():
    gemma = make_model("gemma")
    ready(make_profile(gemma, "cpu", routing="prefix"), "n1", 9001)
    ready(make_profile(gemma, "gpu", engine="vllm"), "n2", 9002)
    qwen = make_model("qwen")
    ready(make_profile(qwen, "cpu"), "n3", 9003)
    # Asking counts only once it has a routable replica.
    make_replica(make_profile(qwen, "spare", routing="prefix"), state=ReplicaState.STARTING)

    snapshot = routing_snapshot()

    assert {m.name: m.routing for m in snapshot.models} == {
        "gemma": "prefix", "qwen": "least_outstanding",
    }  # fmt: skip
    table = RoutingTable.from_snapshot(snapshot)
    assert table.by_name["gemma"].routing == "prefix"
    assert table.by_name["qwen"].routing == "least_outstanding"


def test_a_saved_table_from_before_routing_reads_as_least_outstanding():
    old = {"models": [{"name": "m", "endpoints": [{"replica": "r", "url": "http://h:1"}]}]}
    table = RoutingTable.from_snapshot(RoutingSnapshot.model_validate(old))
    assert table.routes["m"].routing == "least_outstanding"


def test_a_static_file_says_routing_per_model(tmp_path):
    path = tmp_path / "static.yaml"
    path.write_text(
        "auth: false\nmodels:\n"
        "- {name: cached, routing: prefix, endpoints: [{url: 'http://h:1'}, {url: 'http://h:2'}]}\n"
        "- {name: plain, endpoints: [{url: 'http://h:1'}, {url: 'http://h:2'}]}\n"
    )
    snapshot, _keys = load_static(str(path))
    routes = RoutingTable.from_snapshot(snapshot, source="static").routes
    assert routes["cached"].routing == "prefix"
    assert routes["plain"].routing == "least_outstanding"

    path.write_text(
        "auth: false\nmodels:\n- {name: m, routing: sticky, endpoints: [{url: 'http://h:1'}]}\n"
    )
    with pytest.raises(StaticFileError, match=r"models\.0\.routing: Input should be"):
        load_static(str(path))


def test_a_router_keeps_each_system_prompt_on_one_engine(harness):
    engines = [harness.engine(name) for name in ("A", "B")]
    static = harness.static_file(
        models=[{"name": "m", "routing": "prefix", "endpoints": [{"url": e.url} for e in engines]}],
        keys=None, auth=False,
    )  # fmt: skip
    router = harness.router({"LLMGW_ROUTER_STATIC": str(static)})
    prompts = [f"Prompt {n}. " + SUPPORT for n in range(6)]
    for number in range(24):
        messages = [{"role": "system", "content": prompts[number % 6]},
                    {"role": "user", "content": f"Question {number}?"}]  # fmt: skip
        response = httpx.post(f"{router.url}/v1/chat/completions",
                              json={"model": "m", "messages": messages}, timeout=30)  # fmt: skip
        assert response.status_code == 200, response.text
    served_by: dict[str, set[str]] = {}
    for engine in engines:
        for request in engine.requests():
            served_by.setdefault(request["body"]["messages"][0]["content"], set()).add(engine.name)
    assert len(served_by) == 6
    assert all(len(names) == 1 for names in served_by.values()), served_by
