"""The bearer the suite's /metrics ask for (llmgw_cli/pytest_plugin.py sets the token)."""

from __future__ import annotations

import os


def metrics_auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ['LLMGW_METRICS_TOKEN']}"}
