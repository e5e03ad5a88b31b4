"""What the engine is sent of a client's body: the client's bytes where nothing changes,
the usage option added to a stream's bytes as they are, and a body encoded again only
where a field inside it must change (an alias, stream options of the client's own)."""

from __future__ import annotations

import json

import pytest

from router.intake.call import rewrite_body
from router.table.routes import ModelRoute

ROUTE = ModelRoute(name="gemma")


def rewritten(body: bytes, stream: bool) -> tuple[bytes, bool]:
    return rewrite_body(body, json.loads(body), ROUTE, stream)


def test_a_body_that_needs_nothing_goes_as_it_came():
    body = b'{"model": "gemma",  "messages": [{"role": "user", "content": "\\u00e9"}]}'
    assert rewritten(body, stream=False) == (body, False)
    with_usage = b'{"model":"gemma","stream":true,"stream_options":{"include_usage":true}}'
    assert rewritten(with_usage, stream=True) == (with_usage, False)


@pytest.mark.parametrize(
    "body",
    [b'{"model": "gemma", "stream": true, "messages": [{"role": "user", "content": "hi"}]}',
     b'{"model":"gemma","stream":true}\n  ', b'{"stream":true,"model":"gemma","n":{"a":{}}}'],
    ids=["spaced", "trailing-whitespace", "nested"],
)  # fmt: skip
def test_a_stream_asks_for_usage_with_the_clients_bytes_kept(body):
    sent, drop = rewritten(body, stream=True)
    assert drop  # the usage chunk was ours to ask for: not passed on
    assert sent.startswith(body.rstrip()[:-1])  # the client's bytes, untouched
    assert json.loads(sent) == {**json.loads(body), "stream_options": {"include_usage": True}}


@pytest.mark.parametrize(
    ("payload", "expected_options"),
    [({"model": "gemma", "stream": True, "stream_options": None}, {"include_usage": True}),
     ({"model": "gemma", "stream": True, "stream_options": {"x": 1}},
      {"x": 1, "include_usage": True}),
     ({"model": "gemma-alias", "stream": True}, {"include_usage": True})],
    ids=["null-options", "own-options", "alias"],
)  # fmt: skip
def test_a_field_that_must_change_is_changed_in_the_parsed_body(payload, expected_options):
    sent, drop = rewritten(json.dumps(payload).encode(), stream=True)
    assert drop
    assert json.loads(sent) == {**payload, "model": "gemma", "stream_options": expected_options}
