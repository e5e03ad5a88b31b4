"""An engine install, as the cluster and node pages show it while it goes on: in the
node's own words, updated in place when the agent says more."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from audit.actors import AGENT_LINK
from fleet.actions.reports import update_engines
from protocol import messages
from protocol.engines import EngineInstall
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
from tests.pages.rows import heartbeating_node
from tests.processes.support import control_plane, free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

DOWNLOADING = "downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MiB, 40%)"


def says(status: str, detail: str, version: str = "b6000") -> messages.Engines:
    install = EngineInstall(
        engine="llama.cpp", version=version, status=status, detail=detail, managed=True
    )
    return messages.Engines(engines=[install])


def test_an_install_in_progress_then_failed_shows_live(browser, processes, tmp_path, screenshot):
    heartbeating_node("node01", engines=[])
    make_user("olga", operator=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start(processes, control_plane(port, tmp_path))
    wait_until(lambda: answers(base), 60, "the control plane to answer")
    page = signed_in_page(browser, base, "olga")

    open_live(page, "/")
    engines = page.locator('tr[id="node-node01"] .engine[data-engine="llama.cpp"]')
    off_loop(update_engines, "node01", says("installing", DOWNLOADING), actor=AGENT_LINK)
    expect(engines).to_have_text(f"llama.cpp b6000 installing: {DOWNLOADING}", timeout=WAIT_MS)
    screenshot(page, "cluster-installing")
    off_loop(update_engines, "node01", says("failed", "libgomp.so.1 not found"), actor=AGENT_LINK)
    expect(engines).to_have_text("llama.cpp b6000 failed: libgomp.so.1 not found")
    expect(engines).to_have_attribute("data-status", "failed")
    assert_not_reloaded(page)
    screenshot(page, "cluster-install-failed")

    open_live(page, "/nodes/node01/")
    row = page.locator('table.engines tr[data-engine="llama.cpp"]')
    expect(row).to_contain_text("failed: libgomp.so.1 not found")
    expect(row).to_contain_text("llmgw")
    off_loop(
        update_engines, "node01", says("waiting", "another apt-get is running"), actor=AGENT_LINK
    )
    expect(row).to_contain_text("waiting: another apt-get is running", timeout=WAIT_MS)
    assert_not_reloaded(page)
