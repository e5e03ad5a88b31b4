"""The agent's configuration: only what a node cannot find out for itself.

Read from a YAML file (``LLMGW_AGENT_CONFIG``, default /etc/llmgw/agent.yaml, the same
on every node) and the environment, which wins. Id, address and hardware the agent
discovers; what is written here only overrides.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONFIG = Path("/etc/llmgw/agent.yaml")
DEFAULT_WEIGHTS_DIR = Path("/var/lib/llmgw-weights")
DEFAULT_AGENT_DIR = Path("/var/lib/llmgw-agent")


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
    fabrics: dict[str, list[str]] = field(default_factory=dict)
    sglang_python: str = "python3"
    heartbeat_interval: float = 5.0
    probe_interval: float = 60.0

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


def load_config(path: Path | None = None, environ: dict[str, str] | None = None) -> AgentConfig:
    """Read the agent file (if any) and the environment into an AgentConfig."""
    environ = dict(os.environ if environ is None else environ)
    path = path or Path(environ.get("LLMGW_AGENT_CONFIG", DEFAULT_CONFIG))
    data: dict[str, Any] = {}
    if path.exists():
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise AgentConfigError(f"{path}: the top level must be a mapping (server:, tls: …)")
        data = loaded
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
    return AgentConfig(
        servers=servers,
        broker=broker_url(environ, data),
        token=environ.get("LLMGW_AGENT_TOKEN") or data.get("token", ""),
        ca_file=tls.get("ca", ""),
        cert_file=tls.get("cert", ""),
        key_file=tls.get("key", ""),
        node_id=environ.get("LLMGW_NODE_ID") or data.get("node_id", ""),
        address=data.get("address", ""),
        agent_dir=agent_dir,
        weights_dir=Path(
            environ.get("LLMGW_WEIGHTS_DIR") or data.get("weights_dir") or DEFAULT_WEIGHTS_DIR
        ),
        install_dirs=tuple(Path(d) for d in install_dirs) + (agent_dir / "engines",),
        fabrics={str(k): [str(a) for a in v] for k, v in fabrics.items()},
        sglang_python=data.get("sglang_python", "python3"),
        heartbeat_interval=float(environ.get("LLMGW_HEARTBEAT_INTERVAL") or 5.0),
    )


def broker_url(environ: dict[str, str] | None = None, data: dict[str, Any] | None = None) -> str:
    """The Redis the node's command queue lives on; unix:// becomes Celery's socket form."""
    environ = dict(os.environ if environ is None else environ)
    url = (
        environ.get("LLMGW_AGENT_BROKER")
        or (data or {}).get("broker")
        or environ.get("REDIS_URL")
        or "redis://127.0.0.1:6379/0"
    )
    return url.replace("unix://", "redis+socket://", 1)
