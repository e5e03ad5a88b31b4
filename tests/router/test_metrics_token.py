"""The router's /metrics behind LLMGW_METRICS_TOKEN: the token's holder only; /health's
details too, while its status is anyone's."""

from __future__ import annotations

import httpx
import pytest

from tests.router.harness import Harness

TOKEN = "s3cret-metrics-token"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    harness = Harness(tmp_path_factory.mktemp("metrics-token"))
    try:
        static = harness.static_file(models=[], keys=[])
        yield harness.router({"LLMGW_ROUTER_STATIC": str(static), "LLMGW_METRICS_TOKEN": TOKEN})
    finally:
        harness.cleanup()


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"bearer {TOKEN}",
        TOKEN,
        "Bearer é".encode(),
    ],
    ids=["none", "empty", "prefix", "longer", "lowercase-scheme", "no-scheme", "non-ascii"],
)
def test_metrics_refuse_a_missing_or_wrong_token(guarded, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = httpx.get(f"{guarded.url}/metrics", headers=headers, timeout=30)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_metrics_token"


def test_metrics_answer_the_right_token(guarded):
    response = httpx.get(
        f"{guarded.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    assert response.status_code == 200
    assert "llmgw_router_requests_total" in response.text


def test_health_tells_anyone_its_status_and_the_token_holder_its_details(guarded):
    anyone = httpx.get(f"{guarded.url}/health", timeout=30)
    assert anyone.status_code == 200 and anyone.json()["status"] == "ok"
    assert not {"last_error", "api_keys"} & set(anyone.json())
    wrong = httpx.get(f"{guarded.url}/health", headers={"Authorization": "Bearer x"}, timeout=30)
    assert not {"last_error", "api_keys"} & set(wrong.json())
    holder = httpx.get(
        f"{guarded.url}/health", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    assert holder.json()["api_keys"] == 0 and holder.json()["last_error"] is None
