"""Where the engine user could not reach what engines need: `llmgw up` as root keeps its
engines as root there, and says which directory stops that user."""

from __future__ import annotations

from agent_worker.supervision.engine_user import unreachable_by_others


def test_the_first_directory_others_may_not_enter_is_named(tmp_path):
    tmp_path.chmod(0o755)
    open_dir, closed = tmp_path / "open", tmp_path / "open" / "closed"
    closed.mkdir(parents=True)
    open_dir.chmod(0o711)
    closed.chmod(0o700)
    program = closed / "python"
    program.write_text("")
    program.chmod(0o755)
    reachable = open_dir / "agent"

    # The first on the way down: this machine's temporary directory, if it is private.
    private = [d for d in [*reversed(tmp_path.parents), tmp_path] if not d.stat().st_mode & 1]
    assert unreachable_by_others(program) == [(private or [closed])[0]]
    assert unreachable_by_others(reachable) == private[:1]


def test_a_path_others_may_reach_names_nothing(tmp_path):
    for directory in [tmp_path, *tmp_path.parents]:
        if not directory.stat().st_mode & 0o001:
            return  # this machine's temporary directory is private: nothing to show here
    target = tmp_path / "agent"
    target.mkdir(mode=0o711)
    target.chmod(0o711)

    assert unreachable_by_others(target, tmp_path / "not-made-yet") == []
