"""The agent's settings from agent.yaml and the environment: addresses, logs, engines."""

from __future__ import annotations

import pytest

from agent_worker.config import AgentConfigError, load_config

SERVER = {"LLMGW_AGENT_SERVERS": "ws://127.0.0.1:8000"}


def config(tmp_path, yaml_text: str = "", **environ: str):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml_text)
    return load_config(path, {**SERVER, **environ})


def test_logs_rotate_at_50_mib_keeping_5_by_default(tmp_path):
    loaded = config(tmp_path)
    assert (loaded.log_max_bytes, loaded.log_keep) == (50 * 1024 * 1024, 5)


def test_log_limits_come_from_the_environment_over_the_file(tmp_path):
    loaded = config(tmp_path, "log_max_bytes: 10MiB\nlog_keep: 2\n", LLMGW_LOG_MAX_BYTES="200MiB")
    assert (loaded.log_max_bytes, loaded.log_keep) == (200 * 1024 * 1024, 2)
    loaded = config(tmp_path, LLMGW_LOG_MAX_BYTES="2097152", LLMGW_LOG_KEEP="0")
    assert (loaded.log_max_bytes, loaded.log_keep) == (2 * 1024 * 1024, 0)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("LLMGW_LOG_MAX_BYTES", "lots", "LLMGW_LOG_MAX_BYTES='lots' is not a size"),
        ("LLMGW_LOG_MAX_BYTES", "10KiB", "LLMGW_LOG_MAX_BYTES='10KiB' is under 1MiB"),
        ("LLMGW_LOG_KEEP", "five", "LLMGW_LOG_KEEP='five' is not a whole number"),
        ("LLMGW_LOG_KEEP", "-1", "LLMGW_LOG_KEEP='-1' is not a whole number from 0"),
        ("LLMGW_LOG_KEEP", "1000", "LLMGW_LOG_KEEP='1000' is not a whole number from 0"),
    ],
    ids=["size-word", "size-too-small", "keep-word", "keep-negative", "keep-too-many"],
)
def test_a_bad_log_limit_names_the_variable_and_the_fix(tmp_path, name, value, says):
    with pytest.raises(AgentConfigError) as refused:
        config(tmp_path, **{name: value})
    assert says in str(refused.value)
    assert "e.g." in str(refused.value)


def test_a_bad_log_limit_in_the_file_names_the_key_and_the_file(tmp_path):
    with pytest.raises(AgentConfigError) as refused:
        config(tmp_path, "log_keep: many\n")
    assert f"{tmp_path / 'agent.yaml'}: log_keep='many'" in str(refused.value)


def test_engines_and_weights_directories_come_from_the_file_and_the_environment(tmp_path):
    loaded = config(
        tmp_path,
        "engines: {llama.cpp: /opt/llama/bin/llama-server, vllm: /opt/vllm-venv}\n"
        "weights: {look: [/nfs/llm, /lustre/models], shared: [/lustre/models]}\n",
        LLMGW_ENGINES="llama.cpp=/usr/local/bin/llama-server",
    )

    assert loaded.engines == {"llama.cpp": "/usr/local/bin/llama-server", "vllm": "/opt/vllm-venv"}
    assert [str(d) for d in loaded.look_dirs] == ["/nfs/llm", "/lustre/models"]
    assert [str(d) for d in loaded.shared_dirs] == ["/lustre/models"]


@pytest.mark.parametrize(
    ("yaml_text", "environ", "says"),
    [
        ("weights: {look: [models]}\n", {}, "weights: look: 'models' is not an absolute path"),
        ("weights: [/nfs]\n", {}, "weights: must be a mapping"),
        ("engines: [llama-server]\n", {}, "engines: must map an engine to its path"),
        ("", {"LLMGW_ENGINES": "llama-server"}, "LLMGW_ENGINES: 'llama-server' is not ENGINE=PATH"),
    ],
)
def test_engines_and_weights_directories_that_cannot_be_used_are_refused(
    tmp_path, yaml_text, environ, says
):
    with pytest.raises(AgentConfigError, match=says):
        config(tmp_path, yaml_text, **environ)


def test_server_comes_before_servers_and_no_address_is_named_twice(tmp_path):
    # Files written before standbys existed name one server: it stays the one tried first.
    path = tmp_path / "agent.yaml"
    path.write_text("server: wss://cp1:8000\nservers: [wss://cp2:8000, wss://cp1:8000]\n")

    loaded = load_config(path, {})

    assert loaded.servers == ("wss://cp1:8000", "wss://cp2:8000")


def test_servers_from_the_environment_replace_the_file(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("server: wss://cp1:8000\n")

    loaded = load_config(path, {"LLMGW_AGENT_SERVERS": "wss://cp3:8000, wss://cp4:8000"})

    assert loaded.servers == ("wss://cp3:8000", "wss://cp4:8000")


def test_infiniband_sysfs_root_comes_from_the_file_and_the_environment(tmp_path):
    # A simulated node reads a fake sysfs tree; a real one /sys/class/infiniband.
    assert str(config(tmp_path).infiniband_root) == "/sys/class/infiniband"
    loaded = config(tmp_path, "infiniband_root: /srv/fake-ib\n")
    assert str(loaded.infiniband_root) == "/srv/fake-ib"
    loaded = config(tmp_path, "infiniband_root: /srv/fake-ib\n", LLMGW_INFINIBAND_ROOT="/x/ib")
    assert str(loaded.infiniband_root) == "/x/ib"
    with pytest.raises(AgentConfigError, match="infiniband_root: 'fake-ib' is not an absolute"):
        config(tmp_path, "infiniband_root: fake-ib\n")


def test_the_loader_variables_a_node_allows_come_from_the_file_and_the_environment(tmp_path):
    assert config(tmp_path).allow_env == ()  # none unless the node's owner says so
    assert config(tmp_path, "allow_env: [LD_LIBRARY_PATH]\n").allow_env == ("LD_LIBRARY_PATH",)
    loaded = config(tmp_path, "allow_env: [LD_LIBRARY_PATH]\n", LLMGW_AGENT_ALLOW_ENV="LD_AUDIT, ")
    assert loaded.allow_env == ("LD_AUDIT",)
    with pytest.raises(AgentConfigError, match="allow_env: must be a list of names"):
        config(tmp_path, "allow_env: LD_PRELOAD\n")


def test_the_firewall_walls_engines_unless_the_operator_turns_it_off(tmp_path):
    assert config(tmp_path).firewall == "nftables"
    assert config(tmp_path, "firewall: off\n").firewall == "off"  # YAML's false
    assert config(tmp_path, "firewall: nftables\n", LLMGW_AGENT_FIREWALL="off").firewall == "off"
    with pytest.raises(AgentConfigError, match="LLMGW_AGENT_FIREWALL or firewall: in .*: use "
                       "nftables to wall every engine's ports, or off"):  # fmt: skip
        config(tmp_path, LLMGW_AGENT_FIREWALL="iptables")


@pytest.mark.parametrize(
    ("servers", "broker"),
    [
        ("ws://10.0.0.1:8000", "redis://127.0.0.1:6379/0"),
        ("http://cp.example:8000", "redis://127.0.0.1:6379/0"),
        ("cp.example:8000", "redis://127.0.0.1:6379/0"),  # a bare host is ws://
        ("wss://cp.example:8443", "redis://:secret@10.0.0.2:6379/0"),
    ],
)
def test_plaintext_across_the_network_is_refused_unless_insecure(tmp_path, servers, broker):
    environ = {"LLMGW_AGENT_SERVERS": servers, "LLMGW_AGENT_BROKER": broker}
    with pytest.raises(AgentConfigError, match="in clear across the network") as refused:
        config(tmp_path, **environ)
    assert "secret" not in str(refused.value) and "insecure: true" in str(refused.value)

    accepted = config(tmp_path, "insecure: true\n", **environ)
    assert accepted.insecure and accepted.plaintext
    assert config(tmp_path, **environ, LLMGW_AGENT_INSECURE="1").insecure


def test_loopback_unix_sockets_and_tls_need_no_insecure(tmp_path):
    for servers, broker in (("ws://127.0.0.1:8000", "redis://localhost:6379/0"),
                            ("ws://[::1]:8000", "unix:///run/redis.sock?db=0"),
                            ("wss://cp.example:8443", "rediss://r.example:6380/0")):  # fmt: skip
        found = config(tmp_path, LLMGW_AGENT_SERVERS=servers, LLMGW_AGENT_BROKER=broker)
        assert (found.insecure, found.plaintext) == (False, [])
