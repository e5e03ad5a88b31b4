"""The model page says what each profile needs, estimated from the model's file."""

from __future__ import annotations

import pytest
from django.test import Client

from catalog.actions.entries import apply_catalog
from tests.factories import SETUP
from tests.gguf_files import llama_model

pytestmark = pytest.mark.django_db


def test_the_model_page_shows_each_profiles_estimate_and_its_parts(reader, tmp_path):
    path = llama_model(tmp_path / "m.gguf", layers=8, embedding=512, heads=8, kv_heads=2,
                       feed_forward=1024, vocab=8000, context=4096, kind="f16")  # fmt: skip
    apply_catalog(
        f"models:\n  - name: tiny\n    source: {path}\n    profiles:\n"
        "      - {name: cpu, engine: llama.cpp, context: 2048}\n",
        actor=SETUP,
    )
    client = Client()
    client.force_login(reader)
    html = client.get("/models/tiny/").content.decode()
    assert "per rank: weights " in html
    assert "KV cache at 2048 tokens 8, buffers " in html
    assert "(the estimate: memory: not set)" in html
