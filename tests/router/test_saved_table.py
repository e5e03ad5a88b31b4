"""The router's last good routing table on disk: whole or not at all, private, and never a crash."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from protocol.routing import RoutingSnapshot
from router.table.saved import FORMAT_VERSION, TableFile

TABLE = RoutingSnapshot.model_validate(
    {
        "models": [
            {
                "name": "gemma",
                "aliases": ["g"],
                "wanted": 1,
                "endpoints": [
                    {"replica": "r1", "url": "http://127.0.0.1:9001", "secret": "s3cret"}
                ],
                "states": {"ready": 1},
                "reasons": [],
            }
        ]
    }
)
KEYS = [{"name": "team", "prefix": "llmgw-abcdef", "sha256": "a" * 64, "models": []}]


@pytest.fixture
def table_file(tmp_path):
    return TableFile(tmp_path / "router" / "routing-table.json")


def leftovers(table_file: TableFile) -> list[str]:
    return sorted(p.name for p in table_file.path.parent.iterdir() if p != table_file.path)


def test_a_saved_table_reads_back_as_it_was_with_when_it_was_loaded(table_file):
    assert table_file.save(TABLE, KEYS, loaded_at=1_700_000_000.0)
    saved = table_file.read()
    assert saved is not None
    assert (saved.table, saved.keys) == (TABLE, KEYS)
    assert saved.loaded_at == 1_700_000_000.0
    document = json.loads(table_file.path.read_text())
    assert document["version"] == FORMAT_VERSION
    assert isinstance(document["saved_at"], float)


def test_keys_that_are_off_read_back_as_off(table_file):
    table_file.save(TABLE, None, loaded_at=1_700_000_000.0)
    saved = table_file.read()
    assert saved is not None and saved.keys is None


def test_the_file_is_private_in_a_private_directory_whatever_the_umask(table_file):
    previous = os.umask(0)
    try:
        table_file.save(TABLE, KEYS, loaded_at=1_700_000_000.0)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(table_file.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(table_file.path.parent.stat().st_mode) == 0o700


def test_a_changed_table_replaces_the_file_whole_by_a_rename(table_file):
    table_file.save(TABLE, KEYS, loaded_at=1_700_000_000.0)
    before = table_file.path.stat().st_ino
    changed = RoutingSnapshot(
        models=[TABLE.models[0].model_copy(update={"aliases": ["g", "small"]})]
    )
    assert table_file.save(changed, KEYS, loaded_at=1_700_000_010.0)
    assert table_file.path.stat().st_ino != before  # a new file renamed over, not rewritten
    assert leftovers(table_file) == []
    saved = table_file.read()
    assert saved is not None and saved.table == changed and saved.loaded_at == 1_700_000_010.0
    assert stat.S_IMODE(table_file.path.stat().st_mode) == 0o600


def test_an_unchanged_table_is_not_written_again_only_marked_as_confirmed(table_file):
    table_file.save(TABLE, KEYS, loaded_at=1_700_000_000.0)
    before = table_file.path.stat().st_ino
    saved_at = json.loads(table_file.path.read_text())["saved_at"]
    assert not table_file.save(TABLE, KEYS, loaded_at=1_700_000_600.0)
    assert table_file.path.stat().st_ino == before
    assert json.loads(table_file.path.read_text())["saved_at"] == saved_at
    saved = table_file.read()
    assert saved is not None and saved.loaded_at == 1_700_000_600.0  # age runs from here


def test_another_process_finds_the_file_unchanged_and_does_not_rewrite_it(table_file):
    table_file.save(TABLE, KEYS, loaded_at=1_700_000_000.0)
    before = table_file.path.stat().st_ino
    restarted = TableFile(table_file.path)
    assert not restarted.save(TABLE, KEYS, loaded_at=1_700_000_600.0)
    assert table_file.path.stat().st_ino == before


def test_a_file_deleted_behind_its_back_is_written_again(table_file):
    table_file.save(TABLE, KEYS, loaded_at=1_700_000_000.0)
    table_file.path.unlink()
    assert table_file.save(TABLE, KEYS, loaded_at=1_700_000_600.0)
    assert table_file.read() is not None


def test_a_failed_write_warns_leaves_no_temporary_file_and_does_not_raise(tmp_path, caplog):
    target = tmp_path / "routing-table.json"
    target.mkdir()  # a rename cannot replace a directory
    (target / "x").write_text("")
    table_file = TableFile(target)
    with caplog.at_level(logging.WARNING, logger="router.table.saved"):
        assert not table_file.save(TABLE, KEYS, loaded_at=1_700_000_000.0)
    assert str(target) in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["routing-table.json"]


def document(**changes) -> str:
    """A saved table's file text with some fields changed."""
    whole = {"version": FORMAT_VERSION, "saved_at": 1.0, "loaded_at": 1.0,
             "table": TABLE.model_dump(mode="json"), "keys": None}  # fmt: skip
    return json.dumps({**whole, **changes})


@pytest.mark.parametrize(
    ("content", "words"),
    [
        pytest.param("{not json", "not JSON", id="garbage"),
        pytest.param(document()[:40], "not JSON", id="cut-short"),
        pytest.param(document(version=99), "version 99", id="other-version"),
        pytest.param(json.dumps(["a", "list"]), "not a saved routing table", id="not-an-object"),
        pytest.param(
            document(table={"models": [{"aliases": []}]}),
            "not a saved routing table",
            id="model-without-name",
        ),  # fmt: skip
        pytest.param(
            document(keys=[{"name": "k"}]), "not a saved routing table", id="key-without-hash"
        ),  # fmt: skip
        pytest.param(
            document(loaded_at="yesterday"), "not a saved routing table", id="bad-time"
        ),  # fmt: skip
    ],
)
def test_an_unusable_file_is_ignored_with_a_warning_naming_it(table_file, caplog, content, words):
    table_file.path.parent.mkdir()
    table_file.path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="router.table.saved"):
        assert table_file.read() is None
    assert str(table_file.path) in caplog.text
    assert words in caplog.text


def test_no_file_is_no_table_and_no_warning(table_file, caplog):
    with caplog.at_level(logging.WARNING, logger="router.table.saved"):
        assert table_file.read() is None
    assert caplog.text == ""
