"""A prebuilt llama.cpp (a ``pip: xllamacpp==V`` build): a real venv and a real pip, from a
wheel made in the test (no network), hash-checked, with llmgw's launcher written in as
``bin/llama-server`` and run before it counts."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from agent_worker.engines import LlamaCppAdapter
from agent_worker.engines.install import InstallError
from agent_worker.engines.install.prebuilt import install_prebuilt_llama
from agent_worker.engines.install.python_env import PipSettings
from agent_worker.engines.prebuilt_launcher import is_launcher
from protocol.engines import EngineBuild, WantedEngine
from protocol.shard import ShardSpec
from tests.agent.engine_archives import make_installer, wheel

pytestmark = pytest.mark.usefixtures("pip_without_this_machines_config")

# What the launcher's --version reads: the package's version, as xllamacpp's own says it.
FAKE_XLLAMACPP = '__version__ = "{version}"\n'


@pytest.fixture(scope="module")
def links(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("find-links")
    for version in ("0.0.1", "0.0.2"):
        files = {"xllamacpp/__init__.py": FAKE_XLLAMACPP.format(version=version)}
        wheel(directory, "xllamacpp", version, files)
    return directory


def build(links: Path, version: str = "0.0.1", sha256: str = "") -> EngineBuild:
    """The prebuilt build of ``version``, pinned to its wheel's sha256 unless told another."""
    path = links / f"xllamacpp-{version}-py3-none-any.whl"
    digest = sha256 or hashlib.sha256(path.read_bytes()).hexdigest()
    return EngineBuild(name="xllamacpp-test", pip=f"xllamacpp=={version}", sha256=digest)


def index(links: Path) -> PipSettings:
    return PipSettings(no_index=True, find_links=(str(links),))


def test_the_wheel_goes_into_a_venv_of_its_own_behind_llmgws_launcher(links, tmp_path):
    said: list[str] = []
    target = tmp_path / "xllamacpp-0.0.1"

    path = install_prebuilt_llama(build(links), "xllamacpp-0.0.1", target, index(links),
                                  said.append, 30)  # fmt: skip

    assert path == str(target / "bin" / "llama-server")
    assert is_launcher(path)
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout == "version: xllamacpp 0.0.1 (llmgw's llama-server launcher)\n"
    assert (target / "llmgw-requirements.txt").read_text() == (
        f"xllamacpp==0.0.1 --hash=sha256:{build(links).sha256}\n"
    )
    # Made without pip (the agent's pip filled it): seconds saved on every node.
    assert not list(target.glob("lib/python3*/site-packages/pip"))
    assert said == ["creating a virtualenv", "pip install xllamacpp==0.0.1",
                    "checking xllamacpp==0.0.1"]  # fmt: skip


def test_a_wheel_whose_hash_differs_is_refused_by_pip_and_leaves_nothing(links, tmp_path):
    target = tmp_path / "xllamacpp-0.0.1"
    tampered = build(links, sha256="0" * 64)

    with pytest.raises(InstallError) as failure:
        install_prebuilt_llama(tampered, "xllamacpp-0.0.1", target, index(links), print, 30)

    assert "pip install xllamacpp==0.0.1 (sha256 000000000000…) failed" in str(failure.value)
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in str(failure.value)
    assert not target.exists()


def test_a_wheel_that_says_another_version_does_not_count(links, tmp_path):
    # The requirement names 0.0.2 and the index holds it; its hash pins 0.0.1's file, so pip
    # refuses: what the node runs is the file the catalog's hash names, nothing else.
    mixed = EngineBuild(name="x", pip="xllamacpp==0.0.2", sha256=build(links).sha256)

    with pytest.raises(InstallError, match="DO NOT MATCH THE HASHES"):
        install_prebuilt_llama(mixed, "v", tmp_path / "v", index(links), print, 30)


def test_the_installer_reports_the_prebuilt_build_installed_managed_and_marked(links, tmp_path):
    installer = make_installer(tmp_path, pip=index(links))
    wanted = WantedEngine(name="llama.cpp", version="xllamacpp-0.0.1", builds=[build(links)])

    installer.want([wanted])
    installer.converge_once()

    [status] = installer.statuses()
    version_dir = tmp_path / "engines" / "llama.cpp" / "xllamacpp-0.0.1"
    assert (status.status, status.managed) == ("installed", True)
    assert status.path == str(version_dir / "bin" / "llama-server")
    marker = json.loads((version_dir / ".llmgw-install.json").read_text())
    assert (marker["build"], marker["sha256"]) == ("xllamacpp-test", build(links).sha256)
    # Unwanted and unused, it goes like any other install of llmgw's.
    installer.want([])
    installer.converge_once()
    assert installer.statuses() == [] and not version_dir.exists()


def test_the_adapter_refuses_before_launch_what_the_launcher_would(links, tmp_path):
    launcher = install_prebuilt_llama(build(links), "v", tmp_path / "v", index(links), print, 30)
    adapter = LlamaCppAdapter()
    spec = ShardSpec(shard_id="s", replica_id="r", model="m", source="/m.gguf",
                     engine="llama.cpp", model_path="/m.gguf", port=1, api_key="k",
                     args=["--threads", "2", "--no-warmup"])  # fmt: skip

    assert adapter.binary_problems(spec, launcher) == []
    flash = spec.model_copy(update={"args": ["--flash-attn", "on"]})
    [problem] = adapter.binary_problems(flash, launcher)
    assert problem.startswith("--flash-attn: the prebuilt llama.cpp (xllamacpp) does not take")
    across = spec.model_copy(update={"world_size": 2, "workers": ["10.0.0.2:1"]})
    [problem] = adapter.binary_problems(across, launcher)
    assert problem.startswith("--rpc: the prebuilt llama.cpp (xllamacpp) has no RPC backend")
