"""The agent's configuration: only what a node cannot find out for itself.

Read from a YAML file (``LLMGW_AGENT_CONFIG``, default /etc/llmgw/agent.yaml) and
the environment, which wins. Everything else — id, address, hardware — the agent
discovers.
"""

from __future__ import annotations

import os


def broker_url() -> str:
    """The Redis the node's command queue lives on; unix:// becomes Celery's socket form."""
    url = os.environ.get("LLMGW_AGENT_BROKER") or os.environ.get("REDIS_URL") or ""
    if not url:
        url = "redis://127.0.0.1:6379/0"
    return url.replace("unix://", "redis+socket://", 1)
