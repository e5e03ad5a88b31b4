"""The test runner's entry point (``-p llmgw_cli.pytest_plugin``): the embedded servers
start here when DATABASE_URL / REDIS_URL are unset, before pytest-django reads settings."""

from llmgw_cli.embedded import configure_services, stop_started_here

configure_services()


def pytest_sessionfinish(session, exitstatus):
    """Leave no embedded PostgreSQL or Redis behind that this test run started."""
    stop_started_here()
