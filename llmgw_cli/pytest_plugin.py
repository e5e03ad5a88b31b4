"""The test runner's entry point (``-p llmgw_cli.pytest_plugin``): the embedded servers
start here when DATABASE_URL / REDIS_URL are unset, before pytest-django reads settings.

Under pytest-xdist each worker is a test run of its own: its own LLMGW_HOME (so its own
embedded servers, CA and files) and, on a shared Redis, its own database number. pytest-
django already gives each worker its own PostgreSQL database.
"""

import os
import sysconfig
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from llmgw_cli.embedded import configure_services, stop_started_here


def redis_url_for_worker(url: str, index: int) -> str:
    """``url`` with the Redis database number moved by ``index`` + 1 (db 0 -> 1 for gw0)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        # Not through urlunsplit, which turns unix:///run/redis.sock into unix:/run/….
        base, _, query = url.partition("?")
        params = dict(parse_qsl(query))
        params["db"] = str(int(params.get("db", "0")) + index + 1)
        return f"{base}?{urlencode(params)}"
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{db + index + 1}"))


def isolate_xdist_worker(environ=os.environ) -> None:
    worker = environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    home = Path(environ.get("LLMGW_HOME") or Path.cwd() / "var" / "test")
    environ["LLMGW_HOME"] = str(home / worker)
    if environ.get("REDIS_URL"):
        environ["REDIS_URL"] = redis_url_for_worker(environ["REDIS_URL"], int(worker[2:]))


def allow_test_models(environ=os.environ) -> None:
    """Tests write model files under their home (``tmp_path`` is there: pytest_configure)
    and the demo's is in this environment's packages: the control plane reads those for the
    fit estimate (settings.LLMGW_MODEL_ROOTS), in this process and every one a test starts;
    a file elsewhere is refused as in production (tests/catalog/test_model_files.py)."""
    home = Path(environ.get("LLMGW_HOME") or Path.cwd() / "var" / "test")
    roots = [str(home), sysconfig.get_paths()["purelib"]]
    environ.setdefault("LLMGW_MODEL_ROOTS", os.pathsep.join(roots))


allow_test_models()  # before a worker's home is its own: tmp_path is under the shared one
# One /metrics token for the test run's control planes and routers, whatever their homes
# (tests/support/metrics.py sends it); the token made when none is set has tests of its own.
os.environ.setdefault("LLMGW_METRICS_TOKEN", "llmgw-test-metrics-token")
isolate_xdist_worker()
configure_services()
# Without llmgw's default engines (rule R103), in this process's settings and in every
# process a test starts: a test's nodes run the engines the test gives them, where a
# default would have each placement wait for a pip install. The tests of the default, and
# `llmgw up`'s, turn it on (settings.DEFAULT_ENGINES, LLMGW_DEFAULT_ENGINES=1).
os.environ["LLMGW_DEFAULT_ENGINES"] = "0"


def pytest_configure(config):
    """Temporary directories under the test home, not pytest's shared ``/tmp/pytest-of-USER``:
    every pytest session that starts on the machine takes that one back to 0700, which cuts
    off the embedded PostgreSQL (its own user) of a simulated fleet still starting there."""
    if config.option.basetemp or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # given on the command line, or a worker (it takes the controller's)
    home = Path(os.environ.get("LLMGW_HOME") or Path.cwd() / "var" / "test")
    config.option.basetemp = str(home / "tmp")


def pytest_sessionfinish(session, exitstatus):
    """Leave no embedded PostgreSQL or Redis behind that this test run started."""
    stop_started_here()
