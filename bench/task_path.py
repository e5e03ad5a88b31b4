"""The router with its express way off (``LLMGW_ROUTER_EXPRESS=false``): every request on
the task path, to measure the express way against in the same run (``own+task`` in
bench/router_overhead.py)."""

import os

os.environ["LLMGW_ROUTER_EXPRESS"] = "false"

from router.asgi import application  # noqa: E402

__all__ = ["application"]
