"""docker-compose.yml and the systemd units describe a TLS fleet whose agent links (issue 39
part 3). Compose cannot run here, so the pieces that must agree are checked from the files:
the agent's servers are what the control plane serves (wss, the port, a certificate that
names the host), the broker is what Redis serves (rediss, TLS only, a password from .env),
the agent links by its certificate as the control plane expects, every CA file a service
names is in a volume it mounts, passwords come from .env, hosts are named; and
``llmgw_ctl onboard`` itself accepts the bundle compose asks of it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from agent_worker.config import load_config

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
UNITS = REPO / "deploy" / "systemd"


def env(service: str) -> dict[str, str]:
    return dict(SERVICES[service].get("environment") or {})


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def mounts(service: str) -> dict[str, str]:
    """Where each volume is mounted in ``service``: container path -> volume."""
    found = {}
    for entry in SERVICES[service].get("volumes") or []:
        volume, path = entry.split(":")[:2]
        found[path] = volume
    return found


def in_a_volume(service: str, path: str) -> str | None:
    return next((v for where, v in mounts(service).items() if path.startswith(where + "/")), None)


def interpolated(text: str) -> str:
    """``text`` with each ``${NAME:?…}`` as compose would fill it from .env ("x")."""
    return re.sub(r"\$\{\w+(?::\?[^}]*)?\}", "x", text)


def onboard_argv() -> list[str]:
    return SERVICES["onboard"]["command"]


def test_the_agent_links_over_wss_to_what_the_control_plane_serves():
    argv = onboard_argv()
    servers = flag(argv, "--servers").split(",")
    [server] = servers
    parts = urlsplit(server)
    assert parts.scheme == "wss"
    endpoint = SERVICES["control-plane"]["command"][2]
    assert endpoint.startswith(f"ssl:{parts.port}:")
    assert f"{parts.port}:{parts.port}" in SERVICES["control-plane"]["ports"]
    assert parts.hostname in SERVICES  # the control plane's service name is its host
    pki = SERVICES["pki"]["command"][-1]
    assert f"server-cert {parts.hostname} " in pki  # its certificate names that host
    key_file = re.search(r"privateKey=([^:]+)", endpoint).group(1)
    assert in_a_volume("control-plane", key_file) == in_a_volume("pki", key_file) == "home"
    # By certificate, as the control plane takes agents by default: no token anywhere.
    assert (
        "LLMGW_NODE_AUTH" not in env("control-plane")
        and "LLMGW_NODE_AUTH" not in COMPOSE["x-llmgw-env"]
    )
    assert not any("TOKEN" in name for name in env("agent"))


def test_the_agent_is_the_node_its_bundle_names_and_holds_nothing_of_the_control_planes():
    agent = SERVICES["agent"]
    node = flag(onboard_argv(), "onboard")
    assert agent["hostname"] == node and agent["command"][-1] == f"node-{node}"
    bundle = flag(onboard_argv(), "--out")
    assert mounts("agent")[bundle] == mounts("onboard")[bundle]
    assert env("agent")["LLMGW_AGENT_CONFIG"] == f"{bundle}/agent.yaml"
    assert not {"SECRET_KEY", "LLMGW_FLEET_KEY", "DATABASE_URL", "REDIS_URL"} & set(env("agent"))
    assert "home" not in mounts("agent").values()
    assert agent["depends_on"]["onboard"]["condition"] == "service_completed_successfully"


def test_every_redis_url_is_tls_to_what_redis_serves_with_a_ca_the_service_mounts():
    redis = SERVICES["redis"]["command"]
    assert flag(redis, "--port") == "0"  # no plaintext port at all
    tls_port = int(flag(redis, "--tls-port"))
    assert in_a_volume("redis", flag(redis, "--tls-key-file")) == "redis-tls"
    assert "server-cert redis " in SERVICES["pki"]["command"][-1]  # it names the host "redis"
    urls = {
        "control plane": (COMPOSE["x-llmgw-env"]["REDIS_URL"], "control-plane"),
        "router": (env("router")["REDIS_URL"], "router"),
        "agent": (flag(onboard_argv(), "--broker"), "agent"),
    }
    for who, (url, service) in urls.items():
        parts = urlsplit(interpolated(url))
        assert (parts.scheme, parts.hostname, parts.port) == ("rediss", "redis", tls_port), who
        [ca] = parse_qs(parts.query)["ssl_ca_certs"]
        assert in_a_volume(service, ca), f"{who}: {ca} is in no volume {service} mounts"
    # The agent's broker names no password: onboard signs it in as the node's own user.
    assert urlsplit(urls["agent"][0]).password is None
    assert urlsplit(interpolated(urls["router"][0])).password == "x"  # REDIS_PASSWORD


def test_passwords_come_from_env_and_hosts_are_named():
    text = (REPO / "docker-compose.yml").read_text()
    for name in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "LLMGW_ROUTER_DB_PASSWORD"):
        assert f"${{{name}:?" in text, name
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSW")
    assert flag(SERVICES["redis"]["command"], "--requirepass").startswith("${REDIS_PASSWORD:?")
    assert ":llmgw@" not in text and "redis://" not in text and "ws://" not in text
    hosts = COMPOSE["x-llmgw-env"]["ALLOWED_HOSTS"].split(",")
    assert "*" not in hosts and "control-plane" in hosts
    router = SERVICES["router"]["command"]
    assert in_a_volume("router", flag(router, "--ssl-keyfile")) == "router-tls"


def test_onboard_makes_the_bundle_compose_asks_for(tmp_path, settings, django_db_blocker):
    """compose's own onboard arguments, run: the agent file it writes loads, over TLS."""
    from io import StringIO

    from django.core.management import call_command

    from audit.redis import redis_client
    from fleet.pki import broker_users

    settings.LLMGW_CA_DIR = str(tmp_path / "ca")
    argv = onboard_argv()[argv_start(onboard_argv()) :]
    out = tmp_path / "bundle"
    argv[argv.index("--out") + 1] = str(out)
    with django_db_blocker.unblock():
        call_command("llmgw_ctl", "ca", "init", stdout=StringIO())
        call_command("llmgw_ctl", *argv, stdout=StringIO())
        broker_users.delete_user(redis_client(), flag(argv, "onboard"))
    text = (out / "agent.yaml").read_text().replace("/etc/llmgw/", f"{out}/")
    (out / "agent.yaml").write_text(text)
    config = load_config(out / "agent.yaml", environ={})
    assert not config.insecure and config.servers == ("wss://control-plane:8443",)
    assert config.broker.startswith("rediss://llmgw-node-")


def argv_start(argv: list[str]) -> int:
    return argv.index("llmgw_ctl") + 1


def test_the_units_serve_tls_and_the_agent_reads_its_bundle():
    control = (UNITS / "llmgw-control-plane.service").read_text()
    assert "-e ssl:8443:privateKey=" in control and "-b 0.0.0.0" not in control
    router = (UNITS / "llmgw-router.service").read_text()
    assert "--ssl-certfile ${CREDENTIALS_DIRECTORY}/server.pem" in router
    assert "LoadCredential=server-key.pem:" in router
    agent = (UNITS / "llmgw-agent.service").read_text()
    assert 'worker -Q "node-$(hostname)"' in agent


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker here")
def test_docker_compose_reads_the_file(tmp_path):
    """Where compose runs, it must accept the file with a complete .env."""
    check = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if check.returncode != 0:
        pytest.skip("docker has no compose plugin here")
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{name}=x\n" for name in (
        "LLMGW_SECRET_KEY", "LLMGW_FLEET_KEY", "POSTGRES_PASSWORD", "REDIS_PASSWORD",
        "LLMGW_ROUTER_DB_PASSWORD", "LLMGW_PUBLIC_HOST")))  # fmt: skip
    done = subprocess.run(["docker", "compose", "-f", str(REPO / "docker-compose.yml"),
                           "--env-file", str(env_file), "config", "-q"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
