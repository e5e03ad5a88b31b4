from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.router.harness import FakeEngine, Harness, RouterProcess, key_sha256

FULL_KEY = "llmgw-test-full-key"
LIMITED_KEY = "llmgw-test-limited-key"
MAX_BODY = 64 * 1024


@dataclass
class Shared:
    """One router in static mode over three engines, shared by the tests that only read."""

    router: RouterProcess
    engines: dict[str, FakeEngine]

    @property
    def url(self) -> str:
        return self.router.url


@pytest.fixture
def harness(tmp_path):
    """Processes for one test; every one is stopped when the test ends."""
    started = Harness(tmp_path)
    yield started
    started.cleanup()


@pytest.fixture(scope="session")
def shared_router(tmp_path_factory):
    harness = Harness(tmp_path_factory.mktemp("shared-router"))
    try:
        engines = {name: harness.engine(name, f"secret-{name}") for name in ("A", "B", "C")}
        static = harness.static_file(
            models=[
                {
                    "name": "pair",
                    "aliases": ["p"],
                    "endpoints": [
                        {"url": engines[n].url, "secret": f"secret-{n}"} for n in ("A", "B")
                    ],
                },
                {
                    "name": "solo",
                    "aliases": ["s"],
                    "endpoints": [{"url": engines["C"].url, "secret": "secret-C"}],
                },
            ],
            keys=[
                {"name": "full", "sha256": key_sha256(FULL_KEY)},
                {"name": "limited", "sha256": key_sha256(LIMITED_KEY), "models": ["solo"]},
            ],
        )
        router = harness.router(
            {"LLMGW_ROUTER_STATIC": str(static), "LLMGW_ROUTER_MAX_BODY": str(MAX_BODY)}
        )
        yield Shared(router, engines)
    finally:
        harness.cleanup()


@pytest.fixture
def shared(shared_router):
    """The shared router, with its engines forgetting requests and settings afterwards."""
    for engine in shared_router.engines.values():
        engine.reset()
    yield shared_router
    for engine in shared_router.engines.values():
        engine.reset()
