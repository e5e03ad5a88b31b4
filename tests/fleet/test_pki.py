"""llmgw's own CA with real keys and certificates: init, onboarding bundles, server
certificates, revocation, and the checks a link makes of a node's certificate."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import stat
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from django.core.management import CommandError, call_command
from django.utils import timezone

from agent_worker.config import load_config
from audit.models import Event
from audit.redis import redis_client
from fleet.actions.certificates import issue_node_certificate, revoke_node_certificates
from fleet.pki import authority, broker_users, verify
from tests.ctl import ctl
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


@pytest.fixture
def ca(tmp_path, settings):
    settings.LLMGW_CA_DIR = str(tmp_path / "ca")
    call_command("llmgw_ctl", "ca", "init", stdout=StringIO())
    return tmp_path / "ca"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_ca_key_is_private_and_an_existing_ca_is_kept_without_force(ca):
    assert mode(ca / "ca-key.pem") == 0o600
    before = (ca / "ca.pem").read_bytes()

    with pytest.raises(CommandError, match="a CA already exists .* Pass --force"):
        ctl("ca", "init")
    assert (ca / "ca.pem").read_bytes() == before
    ctl("ca", "init", "--force")
    assert (ca / "ca.pem").read_bytes() != before


def test_the_link_signer_is_the_cas_own_private_and_replaced_with_it(ca):
    cert_pem, _key = authority.link_signer()
    assert mode(ca / authority.LINK_SIGNER) == 0o600
    signer = x509.load_pem_x509_certificate(cert_pem)
    signer.verify_directly_issued_by(authority.load_ca_certificate())
    assert authority.link_signer() == (cert_pem, _key)  # made once, kept

    ctl("ca", "init", "--force")
    renewed = x509.load_pem_x509_certificate(authority.link_signer()[0])
    renewed.verify_directly_issued_by(authority.load_ca_certificate())  # the new CA's


def test_onboarding_writes_a_bundle_the_agent_reads(ca, tmp_path):
    bundle = tmp_path / "bundle"

    said = ctl("onboard", "gpu07", "--servers", "wss://a:8443,wss://b:8443",
               "--broker", "rediss://r:6380/0", "--out", str(bundle),
               "--wheel-sha256", "ab" * 32)  # fmt: skip

    assert "wrote the bundle for gpu07" in said
    assert sorted(p.name for p in bundle.iterdir()) == [
        "agent.yaml", "ca.pem", "install.sh", "node-key.pem", "node.pem", "requirements.lock",
    ]  # fmt: skip
    assert mode(bundle / "node-key.pem") == 0o600 and os.access(bundle / "install.sh", os.X_OK)
    config = load_config(bundle / "agent.yaml", environ={})
    assert config.servers == ("wss://a:8443", "wss://b:8443")
    assert config.cert_file == "/etc/llmgw/node.pem"
    assert config.broker.startswith("rediss://llmgw-node-") and config.broker.endswith("@r:6380/0")
    assert not config.insecure
    cert = x509.load_pem_x509_certificate((bundle / "node.pem").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu07"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["gpu07"]
    valid = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=365) <= valid <= dt.timedelta(days=366)
    # The agent file is the same on every node but for its broker user: the certificate
    # names the node.
    ctl("onboard", "gpu08", "--servers", "wss://a:8443,wss://b:8443", "--broker",
        "rediss://r:6380/0", "--out", str(tmp_path / "other"),
        "--wheel-sha256", "ab" * 32)  # fmt: skip

    def apart_from_broker(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if not line.startswith("broker:")]

    assert apart_from_broker(tmp_path / "other" / "agent.yaml") == apart_from_broker(
        bundle / "agent.yaml"
    )
    for node in ("gpu07", "gpu08"):
        broker_users.delete_user(redis_client(), node)


def test_onboarding_refuses_plaintext_across_the_network_unless_told(ca, tmp_path):
    for servers, broker in (("ws://cp:8000", "rediss://r:6380/0"),
                            ("wss://cp:8443", "redis://:pw@10.0.0.2:6379/0")):  # fmt: skip
        with pytest.raises(CommandError, match="in clear across the network") as refused:
            ctl("onboard", "gpu09", "--servers", servers, "--broker", broker,
                "--certificate-only", "--out", str(tmp_path / "b"))  # fmt: skip
        assert "pw" not in str(refused.value)
    assert not (tmp_path / "b").exists()

    ctl("onboard", "gpu09", "--servers", "ws://cp:8000", "--broker", "redis://10.0.0.2:6379/0",
        "--certificate-only", "--insecure", "--out", str(tmp_path / "b"))  # fmt: skip
    config = load_config(tmp_path / "b" / "agent.yaml", environ={})
    assert config.insecure and config.plaintext[0] == "ws://cp:8000"
    # Loopback is no network, and a bundle without --broker says rediss://, checked by the CA.
    ctl("onboard", "gpu10", "--servers", "ws://127.0.0.1:8000", "--certificate-only",
        "--out", str(tmp_path / "c"))  # fmt: skip
    assert "rediss://llmgw-node-" in (tmp_path / "c" / "agent.yaml").read_text()
    for node in ("gpu09", "gpu10"):
        broker_users.delete_user(redis_client(), node)


def issue(node_id: str, **kwargs) -> bytes:
    return issue_node_certificate(node_id, actor=SETUP, **kwargs).cert_pem


def test_a_nodes_own_certificate_is_accepted(ca):
    cert = verify.check_node_certificate(issue("gpu07"), "gpu07")
    assert cert.subject.rfc4514_string() == "CN=gpu07"


def test_another_nodes_certificate_is_refused_naming_both(ca):
    with pytest.raises(
        verify.CertificateRefused,
        match="the agent claims node 'gpu07' with the certificate of node 'gpu08'",
    ):
        verify.check_node_certificate(issue("gpu08"), "gpu07")  # fmt: skip


def test_an_expired_certificate_is_refused_naming_its_expiry(ca):
    long_ago = timezone.now() - dt.timedelta(days=400)
    old = issue("gpu07", days=30, now=long_ago)
    expiry = (long_ago + dt.timedelta(days=30)).strftime("%Y-%m-%d %H:%M")

    with pytest.raises(verify.CertificateRefused, match=f"certificate expired on {expiry} UTC"):
        verify.check_node_certificate(old, "gpu07")


def test_a_certificate_of_another_ca_is_refused_naming_its_issuer(ca, tmp_path, settings):
    settings.LLMGW_CA_DIR = str(tmp_path / "foreign")
    authority.init_ca()
    foreign = issue("gpu07")
    settings.LLMGW_CA_DIR = str(ca)

    # Both CAs are called "llmgw CA": the signature, not the name, tells them apart.
    with pytest.raises(verify.CertificateRefused, match="claims CN=llmgw CA as issuer but is not"):
        verify.check_node_certificate(foreign, "gpu07")


def test_a_revoked_certificate_is_refused_from_then_on(ca):
    cert = issue("gpu07")
    verify.check_node_certificate(cert, "gpu07")

    assert "revoked 1 certificate(s) of gpu07" in ctl("ca", "revoke", "gpu07")

    with pytest.raises(verify.CertificateRefused, match="of node gpu07 .* was revoked on"):
        verify.check_node_certificate(cert, "gpu07")
    with pytest.raises(CommandError, match="no certificate left to revoke"):
        ctl("ca", "revoke", "gpu07")


def test_issuing_and_revoking_are_events_naming_who_did_them(ca, operator, monkeypatch):
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr("audit.actors.getpass.getuser", lambda: "olga")  # operator's name
    issued = issue_node_certificate("gpu07", actor=operator)

    ctl("ca", "revoke", "gpu07")
    issue_node_certificate("gpu07", actor=operator)
    revoke_node_certificates("gpu07", actor=operator)

    events = Event.objects.filter(subject="gpu07").order_by("id")
    said = [(e.reason, e.actor) for e in events]
    assert said[0] == (
        f"certificate {issued.serial} issued, valid until {issued.not_after:%Y-%m-%d}",
        operator,
    )
    assert said[1] == ("revoked 1 certificate(s)", operator)
    assert [e.description for e in events][3] == "revoked 1 certificate(s) by olga"
    assert revoke_node_certificates("gpu07", actor=operator) == 0  # none left: no Event
    assert events.count() == 4


def test_the_server_certificate_names_every_host_and_address(ca, tmp_path):
    ctl("ca", "server-cert", "cp1.example", "10.0.0.5", "--out", str(tmp_path / "srv"))

    cert = x509.load_pem_x509_certificate((tmp_path / "srv" / "server.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["cp1.example"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert mode(tmp_path / "srv" / "server-key.pem") == 0o600


FAKE_PYTHON = """#!/bin/sh
# The venv's python: says which llmgw it has.
cat "$(dirname "$0")/installed-version" 2>/dev/null || exit 1
"""
# The venv's pip: `download` serves the index's wheel (the file INDEX_WHEEL), `install`
# records what it installed.
FAKE_PIP = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/pip-calls"
if [ "$1" = download ]; then
    while [ "$1" != -d ]; do shift; done
    cp "$INDEX_WHEEL" "$2/llmgw-0.1.0-py3-none-any.whl"
    exit 0
fi
echo 0.1.0 > "$(dirname "$0")/installed-version"
"""
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "{log}"
"""
RELEASED_WHEEL = b"llmgw 0.1.0 as released"


def fake_node(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A root directory with a venv whose pip and python are stand-ins, and the environment
    install.sh runs in there."""
    root, tools = tmp_path / "root", tmp_path / "tools"
    venv_bin = root / "opt" / "llmgw" / "bin"
    index_wheel = tmp_path / "index.whl"
    index_wheel.write_bytes(RELEASED_WHEEL)
    for path, text in (
        (venv_bin / "python", FAKE_PYTHON),
        (venv_bin / "pip", FAKE_PIP),
        (tools / "systemctl", FAKE_SYSTEMCTL.format(log=tmp_path / "systemctl")),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)  # fmt: skip
    env = {**os.environ, "ROOT": str(root), "PATH": f"{tools}:{os.environ['PATH']}",
           "INDEX_WHEEL": str(index_wheel)}  # fmt: skip
    return root, env


def released_sha256() -> str:
    return hashlib.sha256(RELEASED_WHEEL).hexdigest()


def test_install_sh_installs_once_and_a_second_run_changes_nothing(ca, tmp_path):
    bundle = tmp_path / "bundle"
    ctl("onboard", "gpu07", "--servers", "wss://a:8443", "--out", str(bundle),
        "--wheel-sha256", released_sha256())  # fmt: skip
    root, env = fake_node(tmp_path)
    venv_bin = root / "opt" / "llmgw" / "bin"

    def install() -> str:
        done = subprocess.run([str(bundle / "install.sh")], env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        return done.stdout

    first = install()
    unit = root / "etc" / "systemd" / "system" / "llmgw-agent.service"
    written = {p: p.stat().st_mtime_ns for p in (unit, *(root / "etc" / "llmgw").iterdir())}
    second = install()

    assert "installed llmgw 0.1.0" in first and "llmgw-agent is running" in first
    calls = (venv_bin / "pip-calls").read_text().splitlines()
    assert calls[0].startswith("download --quiet --no-deps --only-binary=:all: -d ")
    assert calls[0].endswith(" llmgw==0.1.0")
    # The dependencies as locked, each file checked by its hash; then llmgw alone.
    assert calls[1] == f"install --quiet --require-hashes -r {bundle / 'requirements.lock'}"
    assert calls[2].startswith("install --quiet --no-deps ") and calls[2].endswith(".whl")
    assert len(calls) == 3  # the second run installed nothing
    assert "Restart=always" in unit.read_text()
    assert "worker -Q node-$$(hostname)" in unit.read_text()
    assert mode(root / "etc" / "llmgw" / "node-key.pem") == 0o600
    assert second.strip() == "install.sh: nothing to change"
    assert {p: p.stat().st_mtime_ns for p in written} == written
    assert (tmp_path / "systemctl").read_text().count("restart") == 1


def test_install_sh_refuses_an_index_wheel_that_is_not_the_released_one(ca, tmp_path):
    bundle = tmp_path / "bundle"
    ctl("onboard", "gpu07", "--servers", "wss://a:8443", "--out", str(bundle),
        "--wheel-sha256", hashlib.sha256(b"another build").hexdigest())  # fmt: skip
    root, env = fake_node(tmp_path)

    done = subprocess.run([str(bundle / "install.sh")], env=env, capture_output=True, text=True)

    assert done.returncode == 1
    assert "from the index does not match its sha256" in done.stdout
    assert "install --quiet" not in (root / "opt" / "llmgw" / "bin" / "pip-calls").read_text()
    assert not (root / "etc" / "systemd").exists()


def test_install_sh_refuses_a_carried_wheel_that_was_altered(ca, tmp_path):
    wheel = tmp_path / "llmgw-0.1.0-py3-none-any.whl"
    wheel.write_bytes(RELEASED_WHEEL)
    bundle = tmp_path / "bundle"
    ctl("onboard", "gpu07", "--servers", "wss://a:8443", "--out", str(bundle),
        "--wheel", str(wheel))  # fmt: skip
    (bundle / wheel.name).write_bytes(b"altered on the way")
    root, env = fake_node(tmp_path)

    done = subprocess.run([str(bundle / "install.sh")], env=env, capture_output=True, text=True)

    assert done.returncode == 1 and "does not match its sha256" in done.stdout
    assert not (root / "opt" / "llmgw" / "bin" / "pip-calls").exists()


def test_onboard_names_what_it_needs_to_check_the_node_s_llmgw(ca, tmp_path):
    with pytest.raises(CommandError, match="--wheel FILE .* or --wheel-sha256 HEX"):
        ctl("onboard", "gpu07", "--servers", "wss://a:8443", "--out", str(tmp_path / "b"))
    with pytest.raises(CommandError, match="not a sha256"):
        ctl("onboard", "gpu07", "--servers", "wss://a:8443", "--out", str(tmp_path / "b"),
            "--wheel-sha256", "latest")  # fmt: skip
    assert not (tmp_path / "b").exists()  # refused before anything was issued or written

    ctl("onboard", "gpu07", "--servers", "wss://a:8443", "--out", str(tmp_path / "c"),
        "--certificate-only")  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "agent.yaml", "ca.pem", "node-key.pem", "node.pem",
    ]  # fmt: skip
