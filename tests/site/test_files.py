"""core.files: the one atomic writer every side uses (agent state, sidecars, pg_hba.conf)."""

from __future__ import annotations

import stat

import pytest

from core.files import TEMPORARY_PREFIX, fsync_directory, write_atomically


def test_a_write_replaces_the_file_whole_and_private(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    target.chmod(0o644)
    write_atomically(target, '{"new": true}')
    assert target.read_text() == '{"new": true}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_bytes_are_written_as_they_are(tmp_path):
    target = tmp_path / "blob"
    write_atomically(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    target.write_text("old")

    def no_rename(*_args):
        raise OSError("disk gone")

    monkeypatch.setattr("core.files.os.replace", no_rename)
    with pytest.raises(OSError, match="disk gone"):
        write_atomically(target, "new")
    assert target.read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMPORARY_PREFIX)]


def test_a_directory_that_cannot_be_synced_is_not_an_error(tmp_path):
    fsync_directory(tmp_path / "missing")


def test_a_write_can_date_the_new_file(tmp_path):
    """The router's saved table says by its modification time when it was last vouched for."""
    target = tmp_path / "routing-table.json"
    write_atomically(target, "{}", modified_at=1_700_000_000.0)
    assert target.stat().st_mtime == 1_700_000_000.0
    assert [p.name for p in tmp_path.iterdir()] == ["routing-table.json"]
