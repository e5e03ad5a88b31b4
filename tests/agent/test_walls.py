"""The node's walls: which sources each shard's ports admit, rendered as nftables rules,
kept by the agent, and proved with real packets between two throwaway namespaces."""

from __future__ import annotations

import json
import socket

import pytest

from agent_worker.engines import get_adapter
from agent_worker.walls import WallError, Walls
from agent_worker.walls import nftables as nft
from agent_worker.walls.openings import shard_wall
from agent_worker.walls.rules import Opening, ShardWall, chain_name, ruleset, set_names
from protocol.shard import ShardSpec
from tests.support.netns import CLIENTS, NODE_ADDRESS, Namespaces, unavailable_reason

ROUTER, STRANGER, RANK0 = CLIENTS


def spec(**fields) -> ShardSpec:
    fields.setdefault("shard_id", "a" * 32)
    fields.setdefault("replica_id", "r1")
    fields.setdefault("model", "m")
    fields.setdefault("source", "/m.gguf")
    fields.setdefault("engine", "llama.cpp")
    fields.setdefault("host", NODE_ADDRESS)
    fields.setdefault("port", 20000)
    return ShardSpec(**fields)


def admitted(wall: ShardWall) -> dict[int, tuple[str, ...]]:
    return {port: opening.allowed for opening in wall.openings for port in opening.ports}


# Who may reach which port


def test_rank_0_serves_routers_and_control_planes_and_its_rendezvous_no_one():
    wall = shard_wall(spec(), get_adapter("llama.cpp"), ["198.18.0.20", "198.18.0.11"])

    assert admitted(wall) == {20000: ("198.18.0.20", "198.18.0.11"), 20001: ()}


def test_a_llama_cpp_worker_admits_rank_0_alone_on_its_rpc_server():
    worker = spec(rank=1, world_size=3, port=20004,
                  ranks=[["10.0.0.1", "192.168.7.1"], ["10.0.0.2"], ["10.0.0.3"]])  # fmt: skip

    wall = shard_wall(worker, get_adapter("llama.cpp"), ["198.18.0.20"])

    assert admitted(wall)[20004] == ("10.0.0.1", "192.168.7.1")  # its node's and its fabric's
    assert admitted(wall)[20005] == ("10.0.0.1", "192.168.7.1", "10.0.0.3")  # the other ranks


def test_vllm_rank_0s_rendezvous_admits_the_other_ranks_and_its_http_the_callers():
    rank0 = spec(engine="vllm", world_size=2, ranks=[["10.0.0.1"], ["10.0.0.2"]])

    wall = shard_wall(rank0, get_adapter("vllm"), ["198.18.0.20"])

    assert admitted(wall) == {20000: ("198.18.0.20",), 20001: ("10.0.0.2",)}


def test_ranks_from_an_older_control_plane_come_from_its_meeting_points():
    worker = spec(rank=1, world_size=2, port=20002, rendezvous="10.0.0.1:20001",
                  workers=["10.0.0.2:20002"])  # fmt: skip

    assert admitted(shard_wall(worker, get_adapter("llama.cpp"), []))[20002] == ("10.0.0.1",)


def test_an_http_port_is_left_open_when_no_control_plane_named_the_routers():
    wall = shard_wall(spec(callers=None), get_adapter("llama.cpp"), None)

    assert 20000 not in admitted(wall)  # walling it would cut every router off


# The rules


def test_the_ruleset_replaces_the_table_with_one_chain_and_sets_per_shard():
    wall = ShardWall("s1", (Opening((20000,), ("10.0.0.0/8", "10.1.2.3", "fd00::7"), "http"),))

    script = ruleset([wall])

    assert script.startswith("table inet llmgw {}\ndelete table inet llmgw\n")
    assert "elements = { 20000 : jump shard-s1 }" in script
    v4, v6 = set_names("s1")
    # An address inside a network also admitted is one element: sets refuse overlaps.
    assert f"set {v4} {{" in script and "elements = { 20000 . 10.0.0.0/8 }" in script
    assert f"set {v6} {{" in script and "elements = { 20000 . fd00::7 }" in script
    assert "reject with tcp reset" in script


def test_nothing_to_wall_removes_the_table():
    assert ruleset([]) == "table inet llmgw {}\ndelete table inet llmgw\n"


def test_a_port_held_by_two_shards_and_a_source_that_is_no_address_are_refused():
    one = ShardWall("s1", (Opening((20000,), (), "x"),))
    two = ShardWall("s2", (Opening((20000,), (), "x"),))
    with pytest.raises(WallError, match="port 20000 is walled for shard s1 and shard s2"):
        ruleset([one, two])
    with pytest.raises(WallError, match="'router.example' is not an IP address"):
        ruleset([ShardWall("s1", (Opening((20000,), ("router.example",), "x"),))])


def test_a_shard_id_that_is_no_plain_name_gets_a_digest_for_a_name():
    assert chain_name("a" * 32) == "shard-" + "a" * 32
    assert chain_name("odd.id") == chain_name("odd.id") != "shard-odd.id"


# Kept by the agent, in a namespace of its own


@pytest.fixture
def namespaces():
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    made = Namespaces()
    yield made
    made.close()


def walls_in(namespaces: Namespaces, tmp_path, setting: str = "nftables") -> Walls:
    """A Walls whose every nft runs in the node namespace."""
    walls = Walls(setting, tmp_path / "engine-callers.json")

    def in_node(method):
        return lambda *args, **kwargs: namespaces.inside(
            namespaces.node, lambda: method(*args, **kwargs)
        )

    for name in ("wall", "unwall", "keep_only", "set_callers", "status"):
        setattr(walls, name, in_node(getattr(walls, name)))
    return walls


def test_an_engine_port_answers_the_callers_and_loopback_and_refuses_the_rest(namespaces, tmp_path):
    walls = walls_in(namespaces, tmp_path)
    server = namespaces.listen(20000)
    try:
        walls.wall(spec(callers=[ROUTER]))

        assert namespaces.connect_from(ROUTER, 20000) == "connected"
        assert namespaces.connect_from(STRANGER, 20000) == "refused"
        loopback = namespaces.inside(namespaces.node, lambda: probe("127.0.0.1", 20000))
        assert loopback == "connected"
        # The routers change: the next callers list is the wall, and it is kept on disk.
        walls.set_callers([STRANGER])
        assert namespaces.connect_from(STRANGER, 20000) == "connected"
        assert namespaces.connect_from(ROUTER, 20000) == "refused"
        assert json.loads((tmp_path / "engine-callers.json").read_text()) == {"callers": [STRANGER]}
    finally:
        server.close()


def test_a_worker_rpc_port_admits_rank_0_only(namespaces, tmp_path):
    walls = walls_in(namespaces, tmp_path)
    server = namespaces.listen(20002)
    try:
        walls.wall(spec(rank=1, world_size=2, port=20002, ranks=[[RANK0], [NODE_ADDRESS]],
                        callers=[ROUTER]))  # fmt: skip

        assert namespaces.connect_from(RANK0, 20002) == "connected"
        assert namespaces.connect_from(ROUTER, 20002) == "refused"
        assert namespaces.connect_from(STRANGER, 20002) == "refused"
    finally:
        server.close()


def test_walls_come_with_a_shard_go_with_it_and_an_agent_restart_keeps_only_the_adopted(
    namespaces, tmp_path
):
    first, second, third = (
        spec(shard_id=digit * 32, port=port, callers=[ROUTER])
        for digit, port in (("1", 20000), ("2", 20002), ("3", 20004))
    )
    walls = walls_in(namespaces, tmp_path)
    walls.wall(first)
    walls.wall(second)
    assert set(walled(namespaces)) == {chain_name(first.shard_id), chain_name(second.shard_id)}

    walls.unwall(first.shard_id)
    assert set(walled(namespaces)) == {chain_name(second.shard_id)}

    # A new agent adopts only the third (the second stopped while no agent ran).
    again = walls_in(namespaces, tmp_path)
    again.keep_only([third], NODE_ADDRESS)
    assert walled(namespaces) == {chain_name(third.shard_id): [20004, 20005]}

    again.unwall(third.shard_id)
    assert "llmgw" not in namespaces.nft_list()  # the last one gone takes the table


def test_a_loopback_node_and_firewall_off_touch_no_rules(namespaces, tmp_path):
    loopback = walls_in(namespaces, tmp_path)
    loopback.wall(spec(host="127.0.0.1"))
    loopback.keep_only([], "127.0.0.1")
    off = walls_in(namespaces, tmp_path, "off")
    off.wall(spec(world_size=2, rank=1, ranks=[[RANK0], [NODE_ADDRESS]]))

    assert namespaces.nft_list() == ""
    assert loopback.status("127.0.0.1")[0] == "loopback"
    assert off.status(NODE_ADDRESS) == (
        "off", "LLMGW_AGENT_FIREWALL=off: the operator accepted engine ports open"
    )  # fmt: skip


def test_a_node_that_cannot_wall_runs_one_node_shards_open_and_refuses_multi_node(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(nft, "unavailable_reason", lambda: "nft is not installed (apt install "
                        "nftables)")  # fmt: skip
    walls = Walls("nftables", tmp_path / "engine-callers.json")

    walls.wall(spec())  # runs, unwalled: the node's page says its ports are open
    with pytest.raises(WallError) as refused:
        walls.wall(spec(rank=1, world_size=2, ranks=[[RANK0], [NODE_ADDRESS]]))

    assert walls.status(NODE_ADDRESS) == ("unavailable", "nft is not installed (apt install "
                                          "nftables)")  # fmt: skip
    assert "install nftables on the node, or set LLMGW_AGENT_FIREWALL=off" in str(refused.value)


def walled(namespaces: Namespaces) -> dict[str, list[int]]:
    return namespaces.inside(namespaces.node, nft.walled_ports)


def probe(address: str, port: int) -> str:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError as exc:
        return type(exc).__name__
    return "connected"
