"""vLLM and SGLang installs: a real venv and a real pip, from wheels made in the test
(no network), checked by running the engine before it counts."""

from __future__ import annotations

import subprocess

import pytest

from agent_worker.engines.install import InstallError
from agent_worker.engines.install.python_env import PipSettings, install_python_engine
from protocol.engines import WantedEngine
from tests.agent.engine_archives import make_installer, wheel

pytestmark = pytest.mark.usefixtures("pip_without_this_machines_config")

VLLM_MAIN = "import sys\ndef main():\n    print({said!r})\n    sys.exit({code})\n"


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> PipSettings:
    links = tmp_path_factory.mktemp("find-links")
    wheel(links, "vllm", "0.6.3", {"vllm/__init__.py": VLLM_MAIN.format(said="0.6.3", code=0)},
          scripts={"vllm": "vllm:main"})  # fmt: skip
    wheel(links, "vllm", "0.6.4", {"vllm/__init__.py": VLLM_MAIN.format(said="oops", code=1)},
          scripts={"vllm": "vllm:main"})  # fmt: skip
    wheel(links, "vllm", "0.6.5", {"vllm/__init__.py": VLLM_MAIN.format(said="0.6.50", code=0)},
          scripts={"vllm": "vllm:main"})  # fmt: skip
    wheel(links, "sglang", "0.4.1", {"sglang/__init__.py": '__version__ = "0.4.1"\n'},
          extras=("all",))  # fmt: skip
    return PipSettings(no_index=True, find_links=(str(links),))


def test_vllm_is_installed_into_a_venv_of_its_own_and_seen_to_run(index, tmp_path):
    said: list[str] = []

    path = install_python_engine("vllm", "0.6.3", tmp_path / "0.6.3", index, said.append, 30)

    assert path == str(tmp_path / "0.6.3" / "bin" / "vllm")
    assert subprocess.run([path, "--version"], capture_output=True, text=True).stdout == "0.6.3\n"
    assert said == ["creating a virtualenv", "pip install vllm==0.6.3", "checking vllm"]


def test_sglang_with_its_all_extra_counts_when_its_import_says_the_version(
    index, tmp_path, monkeypatch
):
    # A stray sglang/ where the agent runs, or on the agent's PYTHONPATH, is not the install.
    stray = tmp_path / "stray"
    (stray / "sglang").mkdir(parents=True)
    (stray / "sglang" / "__init__.py").write_text('__version__ = "0.0.0"\n')
    monkeypatch.chdir(stray)
    monkeypatch.setenv("PYTHONPATH", str(stray))
    said: list[str] = []

    path = install_python_engine("sglang", "0.4.1", tmp_path / "0.4.1", index, said.append, 30)

    assert path == str(tmp_path / "0.4.1" / "bin" / "python")
    assert said == ["creating a virtualenv", "pip install sglang[all]==0.4.1", "checking sglang"]


def test_a_version_the_index_lacks_fails_naming_it_and_leaves_nothing(index, tmp_path):
    with pytest.raises(InstallError) as failure:
        install_python_engine("vllm", "9.9.9", tmp_path / "9.9.9", index, print, 30)

    assert "pip install vllm==9.9.9 failed" in str(failure.value)
    assert "No matching distribution found for vllm==9.9.9" in str(failure.value)
    assert not (tmp_path / "9.9.9").exists()


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("0.6.4", "checking vllm 0.6.4: vllm --version failed (exit code 1): oops"),
        ("0.6.5", "checking vllm 0.6.5: vllm --version says '0.6.50', not 0.6.5"),
    ],
    ids=["exits-1", "another-version"],
)
def test_an_engine_that_does_not_run_as_asked_does_not_count(index, tmp_path, version, reason):
    with pytest.raises(InstallError) as failure:
        install_python_engine("vllm", version, tmp_path / version, index, print, 30)

    assert str(failure.value) == reason
    assert not (tmp_path / version).exists()


def test_unknown_engines_and_occupied_directories_are_refused(index, tmp_path):
    with pytest.raises(InstallError, match="llmgw installs vllm, sglang with pip, not llama.cpp"):
        install_python_engine("llama.cpp", "b1", tmp_path / "b1", index, print, 30)
    occupied = tmp_path / "0.6.3"
    occupied.mkdir()
    (occupied / "keep").write_text("mine")

    with pytest.raises(InstallError, match="is not an empty directory; llmgw leaves it alone"):
        install_python_engine("vllm", "0.6.3", occupied, index, print, 30)

    assert (occupied / "keep").read_text() == "mine"


def test_the_installer_reports_a_pip_engine_installed_and_managed(index, tmp_path):
    installer = make_installer(tmp_path, pip=index)

    installer.want([WantedEngine(name="vllm", version="0.6.3")])
    installer.converge_once()

    [status] = installer.statuses()
    version_dir = tmp_path / "engines" / "vllm" / "0.6.3"
    assert (status.status, status.managed) == ("installed", True)
    assert status.path == str(version_dir / "bin" / "vllm")
    assert (version_dir / ".llmgw-install.json").exists()
