from __future__ import annotations

import os
import pwd

import pytest
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient

from tests.factories import make_user
from tests.processes.scheduling import ModulesTogether
from tests.support.db_sessions import close_executor_connections, other_sessions, sessions_left
from tests.support.leftovers import label_this_run, stop_leftovers

# The fuzz tests: a fixed seed and a bounded number of examples, so `make test` runs the
# same inputs every time and stays well under a minute.
settings.register_profile(
    "llmgw-fuzz",
    derandomize=True,  # the same examples on every run: a failure here is never a fluke
    database=None,  # nothing written into the checkout
    deadline=None,  # a loaded 2-core machine is slow; speed is for bench/
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("llmgw-fuzz")

# The agents tests start run engines as their own user: the stand-in engines are scripts of
# this checkout's Python, which an unprivileged user may not reach (a pyenv under /root).
# Tests of the engine user name it (tests/agent/test_engine_user.py); the simulated fleet's
# agents, which run the real llama-server, use it as an installed node's do.
os.environ.setdefault("LLMGW_AGENT_ENGINE_USER", pwd.getpwuid(os.geteuid()).pw_name)


@pytest.fixture(autouse=True, scope="session")
def quick_password_hashes():
    """Test users' passwords hashed at one round (tests/support/hashers.py), in place of
    Django's PBKDF2: one hasher per algorithm, so that none is rehashed at sign-in."""
    from django.conf import settings as django_settings
    from django.test import override_settings

    django_pbkdf2 = "django.contrib.auth.hashers.PBKDF2PasswordHasher"
    others = [name for name in django_settings.PASSWORD_HASHERS if name != django_pbkdf2]
    hashers = ["tests.support.hashers.OneRoundPBKDF2", *others]
    with override_settings(PASSWORD_HASHERS=hashers):  # and Django forgets its cached ones
        yield


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadgroup``: a module's tests together, the simulated fleets' on one
    worker, the longest first (tests/processes/scheduling.py)."""
    if config.getvalue("dist") == "loadgroup":
        return ModulesTogether(config, log)
    return None


@pytest.fixture
def admin_user(db):
    return make_user("admin", superuser=True)


@pytest.fixture
def operator(db):
    return make_user("olga", operator=True)


@pytest.fixture
def reader(db):
    """A signed-in user without the operator role: reads, changes nothing."""
    return make_user("rita")


@pytest.fixture
def api_client():
    return APIClient()


@pytest.fixture(autouse=True)
def links_by_token(settings):
    """In-process link tests connect with node tokens; certificate links say so."""
    settings.LLMGW_NODE_AUTH = "token"


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """Close connections after each use in tests: threads that Channels' database_sync_to_async
    leaves behind would otherwise hold the test database open past its teardown. Under
    xdist each worker's database keeps its suffix (test_llmgw_gw0), as pytest-django's own
    fixture does."""
    from django.db import connections

    connections.settings["default"]["CONN_MAX_AGE"] = 0
    connections["default"].settings_dict["CONN_MAX_AGE"] = 0


@pytest.fixture(autouse=True)
def no_database_session_outlives_its_test(request):
    """A database session a test opens in another thread is closed with the test (asgiref's
    executor thread's here, any other by the test): left open, it fails the test database's
    teardown in a two-worker run. Process tests stop their own children."""
    uses_db = request.node.get_closest_marker("django_db") or (
        {"db", "transactional_db"} & set(request.fixturenames)
    )
    if not uses_db or request.node.get_closest_marker("process"):
        yield
        return
    request.getfixturevalue("django_db_setup")  # the test database, not the one it copies
    before = other_sessions()
    yield
    close_executor_connections()
    left = sessions_left(before)
    assert not left, f"database sessions this test opened and left open: {left}"


RUN_LABEL = label_this_run()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if anything it started (an engine, an agent, a server) still runs."""
    left = stop_leftovers(RUN_LABEL)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = "\n  ".join(left)
        message = (
            f"processes this test run started were still running at its end (killed):\n  {lines}"
        )
        if reporter:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
