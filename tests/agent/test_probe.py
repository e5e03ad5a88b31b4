"""Probing finds installed engines by their paths and runs none of them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from agent_worker.engines.probe import (
    SGLANG_IMPORT,
    FoundEngine,
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
    return ProbeConfig(**overrides)


def test_a_node_with_no_engines_reports_an_empty_dict(path_dir, tmp_path):
    assert probe_engines(config(install_dirs=[tmp_path / "none"], venvs=[tmp_path / "v"])) == {}


def test_engines_on_path_are_not_engines_until_the_agent_file_names_them(path_dir):
    llama = install("llama-server", path_dir / "llama-server")
    vllm = install("vllm", path_dir / "vllm")
    install("python-with-sglang", path_dir / "python3")

    assert probe_engines(config()) == {}

    found = probe_engines(config(engine_paths={"llama.cpp": str(llama), "vllm": str(vllm)}))

    assert found == {
        "llama.cpp": FoundEngine("llama.cpp", str(llama), "", "configured"),
        "vllm": FoundEngine("vllm", str(vllm), "", "configured"),
    }
    # Named wrappers are looked at, never run.
    assert not Path(f"{llama}.executed").exists()
    assert not Path(f"{vllm}.executed").exists()


def test_a_venv_named_for_vllm_or_sglang_means_its_entry_point(path_dir, tmp_path):
    vllm = install("vllm", tmp_path / "vllm-env" / "bin" / "vllm")
    python = install("python-with-sglang", tmp_path / "sglang-env" / "bin" / "python")
    named = {"vllm": str(tmp_path / "vllm-env"), "sglang": str(tmp_path / "sglang-env")}

    found = probe_engines(config(engine_paths=named))

    assert found["vllm"] == FoundEngine("vllm", str(vllm), "", "configured")
    assert found["sglang"] == FoundEngine("sglang", str(python), "0.5.2", "configured")


def test_a_file_that_is_not_executable_is_not_an_engine(path_dir):
    binary = install("llama-server", path_dir / "llama-server")
    binary.chmod(0o644)

    assert probe_engines(config(engine_paths={"llama.cpp": str(binary)})) == {}


def test_llama_server_in_an_install_dir_reports_the_newest_version(path_dir, tmp_path):
    engines = tmp_path / "engines"
    install("llama-server", engines / "llama.cpp" / "b9000" / "bin" / "llama-server")
    newest = install("llama-server", engines / "llama.cpp" / "b10991" / "bin" / "llama-server")
    (engines / "llama.cpp" / "b20000").mkdir()  # half-unpacked: no binary yet

    found = probe_engines(config(install_dirs=[tmp_path / "elsewhere", engines]))

    assert found == {"llama.cpp": FoundEngine("llama.cpp", str(newest), "b10991", "install_dir")}
    assert not Path(f"{newest}.executed").exists()


def test_a_version_file_names_the_version_better_than_the_directory(path_dir, tmp_path):
    version_dir = tmp_path / "engines" / "llama.cpp" / "current"
    binary = install("llama-server", version_dir / "llama-server")
    (version_dir / "VERSION").write_text("b11434\n")

    found = probe_engines(config(install_dirs=[tmp_path / "engines"]))

    assert found["llama.cpp"] == FoundEngine("llama.cpp", str(binary), "b11434", "install_dir")


def test_a_named_link_into_an_install_dir_says_its_version(path_dir, tmp_path):
    engines = tmp_path / "engines"
    binary = install("llama-server", engines / "llama.cpp" / "b10991" / "bin" / "llama-server")
    (path_dir / "llama-server").symlink_to(binary)
    named = {"llama.cpp": str(path_dir / "llama-server")}

    found = probe_engines(config(install_dirs=[engines], engine_paths=named))

    assert found["llama.cpp"] == FoundEngine(
        "llama.cpp", str(path_dir / "llama-server"), "b10991", "configured"
    )


def test_a_source_checkout_has_no_version_rather_than_a_wrong_one(path_dir, tmp_path):
    binary = install(
        "llama-server", tmp_path / "src" / "llama.cpp" / "build" / "bin" / "llama-server"
    )

    found = probe_engines(config(engine_paths={"llama.cpp": str(binary)}))

    assert found["llama.cpp"].version == ""


def test_a_configured_path_wins_over_an_install_dir(path_dir, tmp_path):
    engines = tmp_path / "engines"
    install("llama-server", engines / "llama.cpp" / "b10991" / "bin" / "llama-server")
    chosen = install("llama-server", tmp_path / "opt" / "llama-server")

    found = probe_engines(config(install_dirs=[engines], engine_paths={"llama.cpp": str(chosen)}))

    assert found == {"llama.cpp": FoundEngine("llama.cpp", str(chosen), "", "configured")}


def test_a_named_llama_server_from_a_wheel_takes_the_wheels_version_without_importing_it(
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

    found = probe_engines(config(engine_paths={"llama.cpp": str(binary)}))

    assert found == {"llama.cpp": FoundEngine("llama.cpp", str(binary), "0.3.1", "configured")}
    assert "fake_llama_cpp_bin" not in sys.modules
    assert not (tmp_path / "imported").exists()
    assert not Path(f"{binary}.executed").exists()


def test_vllm_in_a_configured_venv_reads_its_version_from_the_dist_info(path_dir, tmp_path):
    venv = tmp_path / "vllm-env"
    entry = install("vllm", venv / "bin" / "vllm")
    (venv / "lib" / "python3.12" / "site-packages" / "vllm-0.11.0+cu128.dist-info").mkdir(
        parents=True
    )

    found = probe_engines(config(venvs=[tmp_path / "empty-env", venv]))

    assert found == {"vllm": FoundEngine("vllm", str(entry), "0.11.0+cu128", "venv")}
    assert not Path(f"{entry}.executed").exists()


def test_sglang_counts_when_llmgws_own_import_succeeds(path_dir, tmp_path):
    python = install("python-with-sglang", tmp_path / "sglang-env" / "bin" / "python")

    found = probe_engines(config(venvs=[tmp_path / "sglang-env"]))

    assert found == {"sglang": FoundEngine("sglang", str(python), "0.5.2", "venv")}
    assert Path(f"{python}.args").read_text().splitlines() == ["-c", SGLANG_IMPORT]


def test_a_failed_sglang_import_means_not_installed(path_dir, tmp_path):
    python = install("python-without-sglang", tmp_path / "opt" / "python3")

    assert probe_engines(config(engine_paths={"sglang": str(python)})) == {}


def test_a_venv_is_tried_after_a_named_python_that_fails(path_dir, tmp_path):
    failing = install("python-without-sglang", tmp_path / "opt" / "python3")
    python = install("python-with-sglang", tmp_path / "env" / "bin" / "python")

    found = probe_engines(config(engine_paths={"sglang": str(failing)}, venvs=[tmp_path / "env"]))

    assert found == {"sglang": FoundEngine("sglang", str(python), "0.5.2", "venv")}


def test_an_sglang_import_that_hangs_is_cut_short_and_not_counted(path_dir, tmp_path):
    python = install("python-hanging", tmp_path / "opt" / "python")

    found = probe_engines(config(engine_paths={"sglang": str(python)}, import_timeout=0.2))

    assert found == {}
