"""``llmgw_ctl ca init | server-cert | revoke`` and ``llmgw_ctl onboard NODE``: llmgw's own
CA, and the bundle a new node needs, the same on every node apart from its certificate."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import redis
import yaml
from django.core.management.base import CommandError

from audit.actors import shell_operator
from audit.redis import redis_client
from core.addresses import plaintext_to_network
from core.redis_urls import mask_password, with_credentials
from core.secret_files import write_secret_file
from fleet.actions.certificates import (
    issue_node_certificate,
    renew_broker_password,
    revoke_node_certificates,
)
from fleet.pki import authority, broker_users
from fleet.pki.verify import still_good

INSTALL_SH = Path(__file__).with_name("onboard_install.sh")
# llmgw's dependencies, pinned with their sha256s (`make lock` writes it from pyproject.toml):
# what install.sh installs on a node, and `make run` here.
REQUIREMENTS_LOCK = Path(__file__).with_name("requirements.lock")
# Without --broker: TLS, checked against llmgw's CA, which every bundle carries.
DEFAULT_BROKER = "rediss://CHANGE-ME:6380/0?ssl_ca_certs=/etc/llmgw/ca.pem"


def add_parsers(subparsers) -> None:
    ca = subparsers.add_parser("ca", help="llmgw's own certificate authority")
    actions = ca.add_subparsers(dest="ca_action", required=True)
    init = actions.add_parser("init", help="create the CA (its key is 0600)")
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.set_defaults(handler=ca_init_command)
    server = actions.add_parser("server-cert", help="the control plane's serving certificate")
    server.add_argument("hosts", nargs="+", metavar="HOST")
    server.add_argument("--days", type=int, default=365)
    server.add_argument("--out", default=".", help="directory for server.pem, server-key.pem")
    server.set_defaults(handler=server_cert_command)
    revoke = actions.add_parser("revoke", help="revoke every certificate of a node")
    revoke.add_argument("node")
    revoke.set_defaults(handler=revoke_command)

    onboard = subparsers.add_parser("onboard", help="issue a node certificate and its bundle")
    onboard.add_argument("node")
    onboard.add_argument(
        "--servers", required=True, help="control plane addresses, comma separated: wss://a:8443,…"
    )
    onboard.add_argument(
        "--broker",
        default="",
        help="the broker's Redis URL, as the node reaches it; the bundle's signs in as the "
        "node's own user (any password in it is dropped)",
    )
    onboard.add_argument(
        "--insecure",
        action="store_true",
        help="accept ws:// servers and a redis:// broker across the network (in clear)",
    )
    onboard.add_argument("--out", default="", help="directory for the bundle (default: NODE/)")
    onboard.add_argument("--days", type=int, default=365)
    onboard.add_argument("--wheel", default="", help="a llmgw wheel to carry in the bundle")
    onboard.add_argument(
        "--wheel-sha256",
        default="",
        help="instead of --wheel: the sha256 of llmgw's wheel as released; install.sh takes "
        "that wheel from the index and refuses any other",
    )
    onboard.add_argument(
        "--certificate-only",
        action="store_true",
        help="no install.sh: for a node whose llmgw is already installed (as under llmgw up)",
    )
    onboard.add_argument(
        "--reuse",
        action="store_true",
        help="keep the bundle's certificate if it is still good for 30 days",
    )
    onboard.set_defaults(handler=onboard_command)  # fmt: skip


def ca_init_command(options, out) -> None:
    try:
        directory = authority.init_ca(force=options["force"])
    except authority.PkiError as exc:
        raise CommandError(str(exc)) from None
    out.write(f"created llmgw's CA in {directory} (key {directory / authority.CA_KEY}, mode 0600)")


def server_cert_command(options, out) -> None:
    try:
        issued = authority.issue_server_certificate(options["hosts"], options["days"])
    except authority.PkiError as exc:
        raise CommandError(str(exc)) from None
    target = Path(options["out"])
    target.mkdir(parents=True, exist_ok=True)
    (target / "server.pem").write_bytes(issued.cert_pem)
    _replace_secret(target / "server-key.pem", issued.key_pem)
    hosts = ", ".join(options["hosts"])
    out.write(f"wrote {target / 'server.pem'} and {target / 'server-key.pem'} for {hosts}, "
              f"valid until {issued.not_after:%Y-%m-%d}")  # fmt: skip


def revoke_command(options, out) -> None:
    revoked = revoke_node_certificates(options["node"], actor=shell_operator())
    if not revoked:
        raise CommandError(f"node {options['node']!r} has no certificate left to revoke")
    out.write(f"revoked {revoked} certificate(s) of {options['node']}; every control plane "
              "refuses them from now on")  # fmt: skip


def onboard_command(options, out) -> None:
    node_id = options["node"]
    servers = [s.strip() for s in options["servers"].split(",") if s.strip()]
    bad = [s for s in servers if not s.startswith(("wss://", "ws://"))]
    if not servers or bad:
        raise CommandError(
            f"--servers must be wss:// addresses, comma separated (got {options['servers']!r})"
        )
    clear = [url for url in (*servers, options["broker"]) if url and plaintext_to_network(url)]
    if clear and not options.get("insecure"):
        raise CommandError(
            f"{', '.join(mask_password(url) for url in clear)}: in clear across the network; "
            "give wss:// servers and a rediss:// broker, or pass --insecure to accept it (the "
            "agent file then says insecure: true, and the node's page shows it)"
        )
    wheel_sha256 = _wheel_sha256(options)
    bundle = Path(options["out"] or node_id)
    password, sha256 = broker_users.new_password()
    if options["reuse"] and still_good(bundle / "node.pem", node_id):
        # The certificate stays; the broker password is renewed (Redis may have forgotten
        # the node's user, and this bundle may be older than broker users).
        if renew_broker_password(node_id, sha256, actor=shell_operator()):
            broker = node_broker(options["broker"], node_id, password)
            _replace_secret(bundle / "agent.yaml", agent_file(servers, broker, bool(clear)))
            _make_broker_user(node_id, out)
        out.write(f"kept the certificate of {node_id} in {bundle}/")
        return
    try:
        issued = issue_node_certificate(
            node_id, options["days"], actor=shell_operator(), broker_password_sha256=sha256
        )
        ca = authority.ca_pem()
    except authority.PkiError as exc:
        raise CommandError(str(exc)) from None
    bundle.mkdir(parents=True, exist_ok=True, mode=0o700)
    (bundle / "ca.pem").write_bytes(ca)
    (bundle / "node.pem").write_bytes(issued.cert_pem)
    _replace_secret(bundle / "node-key.pem", issued.key_pem)
    # 0600: it holds the node's broker password.
    broker = node_broker(options["broker"], node_id, password)
    _replace_secret(bundle / "agent.yaml", agent_file(servers, broker, bool(clear)))
    _make_broker_user(node_id, out)
    if not options.get("certificate_only"):
        wheel = _carry_wheel(options["wheel"], bundle) or ("", wheel_sha256)
        (bundle / "requirements.lock").write_text(REQUIREMENTS_LOCK.read_text())
        (bundle / "install.sh").write_text(install_script(wheel))
        (bundle / "install.sh").chmod(0o755)
    out.write(f"wrote the bundle for {node_id} to {bundle}/ (certificate valid until "
              f"{issued.not_after:%Y-%m-%d}); on the node, run: sudo ./install.sh")  # fmt: skip


def node_broker(broker: str, node_id: str, password: str) -> str:
    """The node's broker URL: ``broker`` (the control plane's, with any password it held
    dropped) signed in as the node's own user."""
    user = broker_users.user_name(node_id, broker_users.database_of(redis_client()))
    return with_credentials(broker or DEFAULT_BROKER, user, password)


def _make_broker_user(node_id: str, out) -> None:
    """Make the node's broker user now; if the broker cannot be reached from here, the
    reconciler makes it within a minute (``sync_broker_users``)."""
    try:
        broker_users.ensure_node_user(node_id)
    except (broker_users.BrokerUserError, redis.RedisError) as exc:
        out.write(f"warning: {node_id}'s broker user is not made yet ({exc}); the reconciler "
                  "makes it once it reaches the broker\n")  # fmt: skip


def agent_file(servers: list[str], broker: str, insecure: bool = False) -> str:
    """The agent file, the same on every node but for its broker user: the certificate files
    name the node."""
    data: dict = {
        "servers": servers,
        "broker": broker,
        "tls": {
            "ca": "/etc/llmgw/ca.pem",
            "cert": "/etc/llmgw/node.pem",
            "key": "/etc/llmgw/node-key.pem",
        },  # fmt: skip
    }
    if insecure:  # onboard --insecure: plaintext across the network, accepted
        data["insecure"] = True
    text = yaml.safe_dump(data, sort_keys=False)
    return (
        text
        + "# Which adapters are on which fabric, if any: {ib-a: [mlx5_0, mlx5_1]}\nfabrics: {}\n"
    )


def install_script(wheel: tuple[str, str]) -> str:
    """install.sh for a bundle that carries the wheel ``(name, sha256)``, or (name "")
    takes it from the index and checks it against ``sha256``."""
    version = importlib.metadata.version("llmgw")
    script = INSTALL_SH.read_text().replace("@VERSION@", version)
    name, digest = wheel
    return script.replace("@WHEEL@", name).replace("@WHEEL_SHA256@", digest)


def _wheel_sha256(options) -> str:
    """The sha256 install.sh checks an index's wheel against; a node never trusts the
    index (or a proxy in front of it) for the code that will hold its certificate."""
    digest = options.get("wheel_sha256", "").strip().lower()
    if options["wheel"] or options.get("certificate_only"):
        return ""
    if not digest:
        version = importlib.metadata.version("llmgw")
        raise CommandError(
            "onboard needs the llmgw the node will run: --wheel FILE (carried in the bundle) "
            f"or --wheel-sha256 HEX (llmgw {version}'s released wheel, taken from the index "
            "and checked)"
        )
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise CommandError(f"--wheel-sha256 {digest!r}: not a sha256 (64 hexadecimal digits)")
    return digest


def _carry_wheel(path: str, bundle: Path) -> tuple[str, str] | None:
    if not path:
        return None
    source = Path(path)
    if not source.is_file() or not source.name.endswith(".whl"):
        raise CommandError(f"--wheel {path}: not a wheel file")
    data = source.read_bytes()
    (bundle / source.name).write_bytes(data)
    return source.name, hashlib.sha256(data).hexdigest()


def _replace_secret(path: Path, data: bytes | str) -> None:
    path.unlink(missing_ok=True)
    write_secret_file(path, data if isinstance(data, str) else data.decode())
