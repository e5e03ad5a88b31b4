"""The agent's configuration: only what a node cannot find out for itself.

Read from a YAML file (``LLMGW_AGENT_CONFIG``, default /etc/llmgw/agent.yaml, the same
on every node) and the environment, which wins. Id, address and hardware the agent
discovers; what is written here only overrides.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent_worker.discovery.infiniband import INFINIBAND
from core.addresses import plaintext_to_network
from core.redis_urls import RedisURL, RedisURLError, mask_password, parse_redis_url
from protocol.commands import unacked_keys
from protocol.units import format_size, parse_size

DEFAULT_CONFIG = Path("/etc/llmgw/agent.yaml")
DEFAULT_WEIGHTS_DIR = Path("/var/lib/llmgw-weights")
DEFAULT_AGENT_DIR = Path("/var/lib/llmgw-agent")
# 50 MiB x 5 old files: at most 300 MiB of disk per engine, far more than a page shows.
DEFAULT_LOG_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_LOG_KEEP = 5
# Below this a busy engine's log would be copied over and over, every check.
MIN_LOG_MAX_BYTES = 1024 * 1024
MAX_LOG_KEEP = 100


class AgentConfigError(ValueError):
    """A configuration the agent cannot run with, naming the key and the fix."""


@dataclass(frozen=True)
class AgentConfig:
    servers: tuple[str, ...]
    broker: str
    token: str = ""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    node_id: str = ""
    address: str = ""
    agent_dir: Path = DEFAULT_AGENT_DIR
    weights_dir: Path = DEFAULT_WEIGHTS_DIR
    install_dirs: tuple[Path, ...] = ()
    # Directories to find weights in, read-only (``weights: {look: [...], shared: [...]}``).
    look_dirs: tuple[Path, ...] = ()
    shared_dirs: tuple[Path, ...] = ()
    fabrics: dict[str, list[str]] = field(default_factory=dict)
    # Where the InfiniBand adapters are read from: another tree only on a simulated node.
    infiniband_root: Path = INFINIBAND
    # engine -> what the agent file names for it (llama-server, a vLLM venv, SGLang's Python)
    engines: dict[str, str] = field(default_factory=dict)
    # Where llmgw installs vLLM and SGLang from; "" is pip's own default (or pip.conf).
    pip_index_url: str = ""
    # Loader variables (LD_LIBRARY_PATH…) this node lets a profile's env set; none by default.
    allow_env: tuple[str, ...] = ()
    # "nftables": wall every shard's ports (docs/security.md, "Engine ports: who may reach them");
    # "off": the operator accepts them open to the network, and the node page says so.
    firewall: str = "nftables"
    # Who engines run as when the agent is root (agent_worker/engine_user.py): "" for
    # llmgw-engine; the agent's own user name keeps them as that user (an accepted risk).
    engine_user: str = ""
    heartbeat_interval: float = 5.0
    probe_interval: float = 60.0
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    log_keep: int = DEFAULT_LOG_KEEP
    # Often enough that a log overshoots its limit by little, seldom enough to cost nothing.
    log_check_interval: float = 15.0
    # ws://, http:// and redis:// to an address other than loopback: refused unless this
    # is set (``insecure: true``), and then said on the node's page.
    insecure: bool = False

    @property
    def plaintext(self) -> list[str]:
        """The addresses this agent reaches across the network without TLS."""
        return [mask_password(url) for url in (*self.servers, self.broker)
                if plaintext_to_network(url)]  # fmt: skip

    @property
    def state_dir(self) -> Path:
        return self.agent_dir / "shards"

    @property
    def log_dir(self) -> Path:
        return self.agent_dir / "logs"

    @property
    def identity(self) -> str:
        return self.node_id or socket.gethostname()


def servers_from(data: dict[str, Any]) -> tuple[str, ...]:
    """``server`` and ``servers`` are both accepted, ``server`` first: configurations
    written before there could be a standby name one address, and it stays preferred."""
    servers: list[str] = []
    single = data.get("server")
    if single:
        servers.append(str(single))
    many = data.get("servers") or []
    if isinstance(many, str):
        many = [s.strip() for s in many.split(",") if s.strip()]
    servers += [str(s) for s in many if str(s) not in servers]
    return tuple(servers)


def read_agent_file(path: Path) -> dict[str, Any]:
    """The agent file's mapping; empty when there is no file."""
    if not path.exists():
        return {}
    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict):
        raise AgentConfigError(f"{path}: the top level must be a mapping (server:, tls: …)")
    return loaded


def load_config(path: Path | None = None, environ: dict[str, str] | None = None) -> AgentConfig:
    """Read the agent file (if any) and the environment into an AgentConfig."""
    environ = dict(os.environ if environ is None else environ)
    path = path or Path(environ.get("LLMGW_AGENT_CONFIG", DEFAULT_CONFIG))
    data = read_agent_file(path)
    if environ.get("LLMGW_AGENT_SERVERS"):
        data["servers"] = environ["LLMGW_AGENT_SERVERS"]
        data.pop("server", None)
    servers = servers_from(data)
    if not servers:
        raise AgentConfigError(
            f"no control plane address: set server: in {path} or LLMGW_AGENT_SERVERS "
            "(e.g. wss://llmgw.example:8000)"
        )
    tls = data.get("tls") or {}
    fabrics = data.get("fabrics") or {}
    if not isinstance(fabrics, dict) or not all(isinstance(v, list) for v in fabrics.values()):
        raise AgentConfigError(f"{path}: fabrics: must map a fabric name to a list of adapters")
    install_dirs = environ.get("LLMGW_ENGINE_DIRS") or data.get("install_dirs") or []
    if isinstance(install_dirs, str):
        install_dirs = [d for d in install_dirs.split(os.pathsep) if d]
    agent_dir = Path(environ.get("LLMGW_AGENT_DIR") or data.get("agent_dir") or DEFAULT_AGENT_DIR)
    log_max_bytes, log_keep = log_rotation_from(environ, data, path)
    broker = broker_url(environ, data)
    insecure = insecure_from(environ, data, path)
    clear = [url for url in (*servers, broker) if plaintext_to_network(url)]
    if clear and not insecure:
        raise AgentConfigError(
            f"{', '.join(mask_password(url) for url in clear)}: in clear across the network "
            "(the link's command key, the broker's password and every command could be read "
            "or changed on the way); use wss:// and rediss:// (llmgw_ctl onboard writes them), "
            f"or set insecure: true in {path} (or LLMGW_AGENT_INSECURE=1) to accept it"
        )
    return AgentConfig(
        servers=servers,
        broker=broker,
        insecure=insecure,
        token=environ.get("LLMGW_AGENT_TOKEN") or data.get("token", ""),
        ca_file=environ.get("LLMGW_AGENT_CA") or tls.get("ca", ""),
        cert_file=environ.get("LLMGW_AGENT_CERT") or tls.get("cert", ""),
        key_file=environ.get("LLMGW_AGENT_KEY") or tls.get("key", ""),
        node_id=environ.get("LLMGW_NODE_ID") or data.get("node_id", ""),
        address=data.get("address", ""),
        agent_dir=agent_dir,
        weights_dir=Path(
            environ.get("LLMGW_WEIGHTS_DIR") or data.get("weights_dir") or DEFAULT_WEIGHTS_DIR
        ),
        install_dirs=tuple(Path(d) for d in install_dirs),
        fabrics={str(k): [str(a) for a in v] for k, v in fabrics.items()},
        infiniband_root=infiniband_root_from(environ, data, path),
        engines=engines_from(environ, data, path),
        look_dirs=_dirs(environ, data, path, "LLMGW_WEIGHTS_LOOK", "look"),
        shared_dirs=_dirs(environ, data, path, "LLMGW_WEIGHTS_SHARED", "shared"),
        pip_index_url=str(environ.get("LLMGW_PIP_INDEX_URL") or data.get("pip_index_url") or ""),
        allow_env=allow_env_from(environ, data, path),
        firewall=firewall_from(environ, data, path),
        engine_user=str(environ.get("LLMGW_AGENT_ENGINE_USER") or data.get("engine_user") or ""),
        heartbeat_interval=float(environ.get("LLMGW_HEARTBEAT_INTERVAL") or 5.0),
        log_max_bytes=log_max_bytes,
        log_keep=log_keep,
    )


def _dirs(
    environ: Mapping[str, str], data: dict[str, Any], path: Path, env_name: str, key: str
) -> tuple[Path, ...]:
    """``weights: {KEY: [dirs]}`` in the agent file, or ENV_NAME (separated by ``:``)."""
    weights = data.get("weights") or {}
    if not isinstance(weights, dict):
        raise AgentConfigError(
            f"{path}: weights: must be a mapping, e.g. "
            "{look: [/nfs/models], shared: [/nfs/models]}"
        )
    named = environ.get(env_name)
    listed = named.split(os.pathsep) if named else weights.get(key) or []
    if isinstance(listed, str) or not isinstance(listed, list):
        raise AgentConfigError(f"{path}: weights: {key}: must be a list of directories")
    for directory in listed:
        if not str(directory).startswith("/"):
            raise AgentConfigError(
                f"{path}: weights: {key}: {directory!r} is not an absolute path; write it as /…"
            )
    return tuple(Path(str(d)) for d in listed if str(d))


def allow_env_from(environ: Mapping[str, str], data: dict[str, Any], path: Path) -> tuple[str, ...]:
    """``LLMGW_AGENT_ALLOW_ENV`` (``LD_LIBRARY_PATH,LD_PRELOAD``), else ``allow_env:`` in the
    agent file: the loader variables a profile may set on this node."""
    named = environ.get("LLMGW_AGENT_ALLOW_ENV")
    listed = [n.strip() for n in named.split(",")] if named else data.get("allow_env") or []
    if not isinstance(listed, list) or not all(isinstance(name, str) for name in listed):
        raise AgentConfigError(
            f"{path}: allow_env: must be a list of names, e.g. [LD_LIBRARY_PATH]"
        )
    return tuple(name for name in listed if name)


def insecure_from(environ: Mapping[str, str], data: dict[str, Any], path: Path) -> bool:
    """``LLMGW_AGENT_INSECURE`` (1/true) or ``insecure: true`` in the agent file."""
    named = environ.get("LLMGW_AGENT_INSECURE")
    value = named if named is not None else data.get("insecure", False)
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("", "0", "false", "no", "off"):
        return False
    raise AgentConfigError(
        f"insecure {value!r} (LLMGW_AGENT_INSECURE or insecure: in {path}): true accepts "
        "plaintext to the network, false (the default) refuses it"
    )


FIREWALL_SETTINGS = {"nftables": "nftables", "on": "nftables", "off": "off"}


def firewall_from(environ: Mapping[str, str], data: dict[str, Any], path: Path) -> str:
    """``LLMGW_AGENT_FIREWALL`` (or ``firewall:``): nftables (the default, also ``on``) or
    off. YAML reads a bare ``off`` as false, which means off too."""
    value = environ.get("LLMGW_AGENT_FIREWALL")
    if value is None:
        value = data.get("firewall", "nftables")
    if value is False:
        value = "off"
    setting = FIREWALL_SETTINGS.get(str(value).strip().lower())
    if setting is None:
        raise AgentConfigError(
            f"firewall {value!r} (LLMGW_AGENT_FIREWALL or firewall: in {path}): use nftables "
            "to wall every engine's ports, or off to accept them open to the network"
        )
    return setting


def infiniband_root_from(environ: Mapping[str, str], data: dict[str, Any], path: Path) -> Path:
    """``LLMGW_INFINIBAND_ROOT``, else ``infiniband_root:`` in the agent file, else sysfs."""
    if environ.get("LLMGW_INFINIBAND_ROOT"):
        named, where = environ["LLMGW_INFINIBAND_ROOT"], "LLMGW_INFINIBAND_ROOT"
    else:
        named, where = str(data.get("infiniband_root") or ""), f"{path}: infiniband_root"
    if not named:
        return INFINIBAND
    if not named.startswith("/"):
        raise AgentConfigError(
            f"{where}: {named!r} is not an absolute path; write it as /… (the directory "
            "that holds mlx5_0/, like /sys/class/infiniband)"
        )
    return Path(named)


def engines_from(environ: Mapping[str, str], data: dict[str, Any], path: Path) -> dict[str, str]:
    """``engines:`` in the agent file, then ``LLMGW_ENGINES`` (``llama.cpp=/opt/llama-server,
    vllm=/opt/vllm-venv``), which wins engine by engine."""
    named = data.get("engines") or {}
    if not isinstance(named, dict):
        raise AgentConfigError(
            f"{path}: engines: must map an engine to its path, e.g. "
            "{llama.cpp: /opt/llama/bin/llama-server, vllm: /opt/vllm-venv}"
        )
    engines = {str(engine): str(where) for engine, where in named.items()}
    if data.get("sglang_python"):  # the older spelling of engines: {sglang: …}
        engines.setdefault("sglang", str(data["sglang_python"]))
    for pair in (environ.get("LLMGW_ENGINES") or "").split(","):
        engine, equals, where = pair.strip().partition("=")
        if not pair.strip():
            continue
        if not equals or not engine or not where:
            raise AgentConfigError(
                f"LLMGW_ENGINES: {pair.strip()!r} is not ENGINE=PATH; write it like "
                "llama.cpp=/opt/llama/bin/llama-server,vllm=/opt/vllm-venv"
            )
        engines[engine] = where
    return engines


def log_rotation_from(
    environ: Mapping[str, str], data: dict[str, Any] | None = None, path: Path | None = None
) -> tuple[int, int]:
    """Return (max bytes, old files kept) for log rotation: ``LLMGW_LOG_MAX_BYTES`` and
    ``LLMGW_LOG_KEEP``, else ``log_max_bytes:`` / ``log_keep:`` in the agent file."""
    data = data or {}
    max_bytes = _setting(environ, data, path, "LLMGW_LOG_MAX_BYTES", "log_max_bytes")
    keep = _setting(environ, data, path, "LLMGW_LOG_KEEP", "log_keep")
    return (
        DEFAULT_LOG_MAX_BYTES if max_bytes is None else _log_max_bytes(*max_bytes),
        DEFAULT_LOG_KEEP if keep is None else _log_keep(*keep),
    )


def _setting(
    environ: Mapping[str, str], data: dict[str, Any], path: Path | None, env_name: str, key: str
) -> tuple[str, Any] | None:
    """The value set for a knob and how to name it in an error; the environment wins."""
    if environ.get(env_name):
        return env_name, environ[env_name]
    if data.get(key) is not None:
        return (f"{path}: {key}" if path else key), data[key]
    return None


def _log_max_bytes(name: str, value: Any) -> int:
    default = format_size(DEFAULT_LOG_MAX_BYTES)
    try:
        size = parse_size(value if isinstance(value, int) else str(value))
    except ValueError:
        raise AgentConfigError(
            f"{name}={value!r} is not a size: write bytes or a size with its unit, "
            f"e.g. {default} (the default) or 200MiB"
        ) from None
    if size < MIN_LOG_MAX_BYTES:
        raise AgentConfigError(
            f"{name}={value!r} is under {format_size(MIN_LOG_MAX_BYTES)}; a log rotated that "
            f"often is copied all the time: set 1MiB or more, e.g. {default} (the default)"
        )
    return size


def _log_keep(name: str, value: Any) -> int:
    try:
        keep = int(str(value).strip())
    except ValueError:
        keep = -1
    if isinstance(value, bool) or not 0 <= keep <= MAX_LOG_KEEP:
        raise AgentConfigError(
            f"{name}={value!r} is not a whole number from 0 to {MAX_LOG_KEEP}: it is how many "
            f"old log files to keep, e.g. {DEFAULT_LOG_KEEP} (the default; 0 keeps none)"
        )
    return keep


def broker_redis(
    environ: Mapping[str, str] | None = None, data: Mapping[str, Any] | None = None
) -> RedisURL:
    """The Redis the node's command queue lives on, with its password and TLS options
    (``rediss://…?ssl_ca_certs=``); a URL that cannot be used names where it was set."""
    environ = os.environ if environ is None else environ
    choices = (
        ("LLMGW_AGENT_BROKER", environ.get("LLMGW_AGENT_BROKER")),
        ("broker: in the agent file", (data or {}).get("broker")),
        ("REDIS_URL", environ.get("REDIS_URL")),
    )
    setting, url = next(
        ((setting, url) for setting, url in choices if url),
        ("the default broker", "redis://127.0.0.1:6379/0"),
    )
    try:
        return parse_redis_url(str(url), setting)
    except RedisURLError as exc:
        raise AgentConfigError(str(exc)) from None


def broker_url(
    environ: Mapping[str, str] | None = None, data: Mapping[str, Any] | None = None
) -> str:
    """The broker's URL as Celery takes it: unix:// in its socket form, TLS options apart."""
    return broker_redis(environ, data).celery_url


def celery_broker_config(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The agent's Celery broker and result backend, from the environment or the agent
    file, with the TLS dicts kombu and the result backend need for rediss://, and the
    node's own keys for the messages it holds unacknowledged: its broker user may touch
    its own keys only, never the ones kombu shares between consumers by default."""
    environ = os.environ if environ is None else environ
    path = Path(environ.get("LLMGW_AGENT_CONFIG", DEFAULT_CONFIG))
    data = read_agent_file(path)
    node_id = environ.get("LLMGW_NODE_ID") or data.get("node_id") or socket.gethostname()
    return {
        **broker_redis(environ, data).celery_config(),
        "broker_transport_options": unacked_keys(str(node_id)),
    }
