"""The usage journal (router/usage/journal.py): a router killed with SIGKILL leaves what it
counted and had not written, and the requests it was still answering; another router
adopts them, so no request answered goes without its usage row."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from router.usage.accounting import Accounting
from router.usage.journal import Journal, read_entries

KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from router.usage.accounting import Accounting
    from router.usage.journal import Journal

    accounting = Accounting(journal=Journal(Path(sys.argv[1])))
    done = accounting.begin("llmgw-k1", "team", "gemma", 40)
    accounting.record("llmgw-k1", "team", "gemma", 12, 30, done)
    accounting.begin("llmgw-k1", "team", "gemma", 40)  # still answering when killed
    accounting.record("llmgw-k2", "other", "gemma", 5, 6)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_killed_routers_usage_is_adopted_by_another(tmp_path):
    killed = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], check=False)
    assert killed.returncode == -9
    accounting = Accounting(journal=Journal(tmp_path))
    accounting.adopt()
    rows = {row.key_prefix: row for row in accounting.take()}
    assert (rows["llmgw-k1"].requests, rows["llmgw-k1"].prompt_tokens,
            rows["llmgw-k1"].completion_tokens) == (2, 12 + 40, 30)  # fmt: skip
    assert (rows["llmgw-k2"].requests, rows["llmgw-k2"].completion_tokens) == (1, 6)
    again = Accounting(journal=Journal(tmp_path))
    again.adopt()
    assert again.take() == []  # adopted once


@pytest.mark.asyncio
async def test_a_written_journal_is_removed_and_a_clean_stop_leaves_nothing(tmp_path):
    accounting = Accounting(journal=Journal(tmp_path))
    running = accounting.begin("llmgw-k1", "team", "gemma", 40)
    accounting.record(
        "llmgw-k1", "team", "gemma", 12, 30, accounting.begin("llmgw-k1", "team", "gemma", 40)
    )
    written = []

    async def write(rows):
        written.extend(rows)

    await accounting.flush(write)
    assert [(r.requests, r.prompt_tokens) for r in written] == [(1, 12)]
    # Only the running request is left in the journal, carried over to the new file.
    (left,) = tmp_path.glob("*.jsonl")
    assert f'"begun":{running}' in left.read_text()
    accounting.record("llmgw-k1", "team", "gemma", 1, 2, running)
    await accounting.flush(write)
    accounting.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.asyncio
async def test_in_a_router_a_turns_lines_go_out_together_at_its_end(tmp_path):
    journal = Journal(tmp_path)
    journal.begun(1, 499000, "llmgw-k1", "k1", "m", 40)
    journal.counted(1, 499000, "llmgw-k1", "k1", "m", 40, 12, 0)
    assert journal.path.read_text() == ""  # held until the loop's turn ends
    await asyncio.sleep(0)
    begun, counted = journal.path.read_text().splitlines()
    assert begun.startswith('{"begun":1,') and counted.startswith('{"counted":1,')
    journal.begun(2, 499000, "llmgw-k1", "k1", "m", 40)
    old = journal.rotate()  # what the old file held is in it before it is let go
    assert '"begun":2' in old.read_text()
    journal.close()


def test_a_line_made_by_hand_reads_back_whatever_the_names_hold(tmp_path):
    journal = Journal(tmp_path)
    name = 'a "quoted" key\\ with\nlines, é and 💡'
    journal.begun(1, 499000, "llmgw-k1", name, "org/model:Q4", 40)
    journal.begun(2, 499000, "llmgw-k2", "k2", "m", 5)
    journal.counted(1, 499000, "llmgw-k1", name, "org/model:Q4", 40, 12.0, 3)
    journal.close()  # request 2 still running: its file stays
    (path,) = tmp_path.glob("*.jsonl")
    assert sorted(read_entries([path]), key=lambda e: e["p"]) == [
        {"counted": 1, "h": 499000, "p": "llmgw-k1", "n": name, "m": "org/model:Q4", "pt": 40,
         "ct": 12, "cp": 3},
        {"begun": 2, "h": 499000, "p": "llmgw-k2", "n": "k2", "m": "m", "pt": 5, "ct": 0},
    ]  # fmt: skip
