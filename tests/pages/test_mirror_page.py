"""The mirror page in a browser: who holds a model's weights, a download's progress as it
moves, and the warning that no node able to serve the model holds them."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from audit.actors import AGENT_LINK
from fleet.actions.reports import update_weights
from fleet.actions.shard_reports import record_shard_progress
from fleet.models import ShardState
from protocol import messages
from tests.factories import make_user
from tests.pages.browser import (
    WAIT_MS,
    answers,
    assert_not_reloaded,
    off_loop,
    open_live,
    signed_in_page,
    start,
)
from tests.pages.rows import heartbeating_node, stale_replica_on
from tests.processes.support import control_plane, free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

WARNING = "no node with llama.cpp holds gemma or could fetch it (its source is a path)"


def test_the_mirror_page_follows_a_download_and_warns_of_no_holder(
    browser, processes, tmp_path, screenshot
):
    node = heartbeating_node("node01")
    _profile, stale, fetching, _unplaceable = stale_replica_on(node)
    shard = fetching.shards.get()
    # An engine running from the path would make node01 hold gemma: this one has failed.
    stale.shards.update(state=ShardState.FAILED)
    make_user("rita")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start(processes, control_plane(port, tmp_path))
    wait_until(lambda: answers(base), 60, "the control plane to answer")
    page = signed_in_page(browser, base, "rita")  # a reader sees it

    open_live(page, "/")
    page.click('tr.model[data-model="gemma"] a.weights-link')
    expect(page).to_have_url(f"{base}/weights/gemma/")
    open_live(page, "/weights/gemma/")
    expect(page.locator('[data-warning="no-holder"]')).to_have_text(WARNING, timeout=WAIT_MS)
    progress = page.locator(f'#mirror-holders tr[data-shard="{shard.id}"] .progress')
    expect(progress).to_have_text("2.9 of 14.2 GiB, 39 MiB/s")
    screenshot(page, "mirror-downloading")

    off_loop(record_shard_progress, "node01", messages.ShardProgress(
        shard_id=shard.id, bytes=12_000_000_000, total=15_200_000_000, rate=50_000_000,
    ), actor=AGENT_LINK)  # fmt: skip
    expect(progress).to_have_text("11.2 of 14.2 GiB, 48 MiB/s", timeout=WAIT_MS)
    # The node reports the file: it holds the weights, and the warning goes.
    held = messages.WeightFile(source="/models/gemma.gguf", path="/models/gemma.gguf", size=5 << 30)
    off_loop(update_weights, "node01", messages.Weights(weights=[held]), actor=AGENT_LINK)
    expect(page.locator('#mirror-holders tr[data-node="node01"]')).to_contain_text(
        "5 GiB", timeout=WAIT_MS
    )
    expect(page.locator('[data-warning="no-holder"]')).to_have_count(0, timeout=WAIT_MS)
    assert_not_reloaded(page)
    screenshot(page, "mirror-held")
