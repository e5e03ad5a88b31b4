"""`llmgw up` tells the control plane where its router is, and the router which origin the
pages' playground calls from; what the operator set stays."""

from __future__ import annotations

from llmgw_cli.up import browser_settings


def test_the_router_answers_the_control_planes_own_origins():
    env: dict[str, str] = {}
    browser_settings(env, 8000, 8080)
    assert env["LLMGW_ROUTER_URL"] == "http://127.0.0.1:8080"
    assert env["LLMGW_ROUTER_CORS_ORIGINS"] == "http://127.0.0.1:8000,http://localhost:8000"


def test_what_the_operator_set_is_kept():
    env = {
        "LLMGW_ROUTER_URL": "https://llm.example",
        "LLMGW_ROUTER_CORS_ORIGINS": "https://llmgw.example",
    }
    browser_settings(env, 8000, 8080)
    assert env == {
        "LLMGW_ROUTER_URL": "https://llm.example",
        "LLMGW_ROUTER_CORS_ORIGINS": "https://llmgw.example",
    }
