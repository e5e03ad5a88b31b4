"""Secrets under LLMGW_HOME are 0600 from their first moment, and the home is the owner's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

from core.secret_files import read_or_create_secret, write_secret_file
from tests.site.probe import REPO, run_watching, settings_env

SECRET_MODE = 0o600


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_generated_secret_key_is_never_readable_by_others_even_with_umask_0(tmp_path):
    home = tmp_path / "home"
    key = home / "secret_key"
    seen = run_watching("import llmgw_site.settings", [key], settings_env(home))
    assert seen[str(key)], "settings never created the secret key"
    assert set(seen[str(key)]) == {SECRET_MODE}
    assert len(key.read_text().strip()) > 40


def test_llmgw_up_writes_the_admin_password_and_api_key_0600_from_the_start(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    code = (
        "from pathlib import Path\n"
        "from llmgw_cli import up_setup\n"
        "up_setup.manage = lambda *args, **kwargs: 'llmgw-key\\n'\n"
        f"home = Path({str(home)!r})\n"
        "up_setup.ensure_admin(home)\n"
        "up_setup.ensure_api_key(home)\n"
    )
    password, key = home / "admin-password", home / "api-key"
    seen = run_watching(code, [password, key], settings_env(home))
    for path in (password, key):
        assert seen[str(path)], f"{path.name} was never written"
        assert set(seen[str(path)]) == {SECRET_MODE}, path.name
    assert key.read_text() == "llmgw-key\n"
    assert len(password.read_text().strip()) >= 16


def test_an_existing_secret_is_kept_and_nothing_is_left_beside_it(tmp_path):
    path = tmp_path / "secret"
    assert write_secret_file(path, "first")
    assert not write_secret_file(path, "second")
    assert path.read_text() == "first"
    assert mode(path) == SECRET_MODE
    assert read_or_create_secret(path, lambda: "third") == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]


def test_processes_racing_to_create_a_secret_all_end_up_with_the_first_ones(tmp_path):
    path = tmp_path / "secret"
    start = threading.Barrier(8)
    answers: list[str] = []

    def create(n: int) -> None:
        start.wait()
        answers.append(read_or_create_secret(path, lambda: f"secret-{n}"))

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 8
    assert set(answers) == {path.read_text()}


def test_a_secret_left_readable_by_an_earlier_version_is_narrowed(tmp_path):
    path = tmp_path / "secret_key"
    path.write_text("kept")
    path.chmod(0o644)
    assert read_or_create_secret(path, lambda: "new") == "kept"
    assert mode(path) == SECRET_MODE


def import_settings(home: Path, umask: int = 0o022) -> subprocess.CompletedProcess:
    code = f"import os; os.umask({umask}); import llmgw_site.settings"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, **settings_env(home)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_new_home_is_the_owners_alone(tmp_path):
    home = tmp_path / "new" / "home"
    result = import_settings(home)
    assert result.returncode == 0, result.stderr
    assert mode(home) == 0o700


def test_an_existing_home_open_to_others_is_narrowed_and_said_so(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    result = import_settings(home)
    assert result.returncode == 0, result.stderr
    assert mode(home) == 0o700
    assert f"{home} was open to other users (mode 0755)" in result.stderr
    again = import_settings(home)
    assert "open to other users" not in again.stderr
