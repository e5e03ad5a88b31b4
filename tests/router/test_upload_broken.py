"""An upload whose engine breaks off its answer: the router cannot send it again (the
client's body went to that engine as it came), so it answers at once, saying why."""

from __future__ import annotations

import httpx
import pytest

from tests.router.harness import session_homed_on

pytestmark = pytest.mark.process


def test_an_upload_broken_off_by_its_engine_is_a_502_at_once_not_sent_again(harness):
    a, b = harness.engine("A"), harness.engine("B")
    static = harness.static_file(
        models=[{"name": "whisper", "serves": ["transcription"],
                 "endpoints": [{"url": a.url}, {"url": b.url}]}],
        keys=None, auth=False,
    )  # fmt: skip
    router = harness.router({"LLMGW_ROUTER_STATIC": str(static)})
    a.control(break_next=1)
    session = session_homed_on(a.url, [a.url, b.url])
    # Before the fix the router sent the consumed body to B and waited for the client's
    # bytes forever: this timeout is the test's only bound, not a claim about speed.
    response = httpx.post(
        f"{router.url}/v1/audio/transcriptions", data={"model": "whisper"},
        files={"file": ("a.wav", b"RIFF" + b"\0" * 100_000)},
        headers={"x-session-id": session}, timeout=60,
    )  # fmt: skip
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_unreachable"
    assert "broke off its answer" in error["message"]
    assert "cannot be sent to another replica" in error["message"]
    assert [r["body"]["upload_bytes"] > 100_000 for r in a.requests()] == [True]
    assert b.requests() == []
