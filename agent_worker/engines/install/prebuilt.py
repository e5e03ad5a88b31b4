"""A prebuilt llama.cpp from the package index (``pip: xllamacpp==V`` builds): a
virtualenv of its own, the one wheel whose sha256 the build names (``--require-hashes``:
a wheel with another hash, or any other package, is refused by pip itself), and llmgw's
launcher written into it as ``bin/llama-server``, so that every adapter, probe and check
that runs a llama-server runs this one the same way.

The virtualenv is made without pip and filled by the agent's own pip (``pip --python``):
``python -m venv`` copying pip in takes 3 to 11 s on a loaded 2-core node, more than the
whole install of the wheel from a warm cache.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from agent_worker.engines import prebuilt_launcher
from agent_worker.engines.install.checks import check_libraries, check_version
from agent_worker.engines.install.errors import InstallError
from agent_worker.engines.install.python_env import (
    VENV_TIMEOUT,
    PipSettings,
    refuse_occupied,
    run_step,
)
from protocol.engines import EngineBuild

LAUNCHER = "bin/llama-server"
REQUIREMENTS_FILE = "llmgw-requirements.txt"


def install_prebuilt_llama(
    build: EngineBuild,
    version: str,
    target_dir: Path,
    pip: PipSettings,
    say: Callable[[str], None],
    version_timeout: float,
) -> str:
    """Make a venv at ``target_dir`` holding ``build``'s wheel, hash-checked, and llmgw's
    launcher; check it starts; return the launcher's path.

    Raise ``InstallError`` naming the build and what failed; on any failure nothing is
    left at ``target_dir``.
    """
    label = f"llama.cpp {version} ({build.pip})"
    refuse_occupied(target_dir)
    try:
        say("creating a virtualenv")
        venv = [pip.python, "-m", "venv", "--without-pip", str(target_dir)]
        run_step(venv, f"creating a virtualenv for {label}", VENV_TIMEOUT)
        requirements = target_dir / REQUIREMENTS_FILE
        requirements.write_text(f"{build.pip} --hash=sha256:{build.sha256}\n")
        say(f"pip install {build.pip}")
        command = [pip.python, "-m", "pip", "--python", str(target_dir / "bin" / "python"),
                   "install", "--disable-pip-version-check", "--no-input", "--progress-bar",
                   "off", "--require-hashes", "--no-deps", "--only-binary", ":all:",
                   *pip.index_args(), "-r", str(requirements)]  # fmt: skip
        run_step(command, f"pip install {build.pip} (sha256 {build.sha256[:12]}…)", pip.timeout)
        launcher = write_launcher(target_dir)
        say(f"checking {build.pip}")
        for library in sorted(target_dir.glob("lib/python3*/site-packages/*/*.so")):
            check_libraries(library)
        said = check_version(launcher, version_timeout)
        if build.pip_version not in said:
            raise InstallError(f"{label}: llama-server --version says {said!r}")
    except BaseException:
        shutil.rmtree(target_dir, ignore_errors=True)
        raise
    return str(launcher)


def write_launcher(target_dir: Path) -> Path:
    """llmgw's launcher as the venv's ``bin/llama-server``, run by the venv's Python."""
    source = Path(prebuilt_launcher.__file__).read_text(encoding="utf-8")
    launcher = target_dir / LAUNCHER
    python = target_dir / "bin" / "python"
    launcher.write_text(f"#!{python}\n# {prebuilt_launcher.TAG}\n{source}", encoding="utf-8")
    launcher.chmod(0o755)
    return launcher
