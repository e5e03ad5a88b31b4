"""vLLM and SGLang: a virtualenv per engine version, ``pip install`` from the package
index the node is configured with, and a check that the engine runs before it counts.

Virtualenvs are not relocatable (their scripts name the interpreter's absolute path), so
the venv is made at its final path; the caller writes its marker only after this returns,
and a failure removes the directory whole.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent_worker.engines.install.checks import run_bounded
from agent_worker.engines.install.errors import InstallError

# engine -> (the requirement pip installs, the executable the adapter runs)
REQUIREMENTS = {"vllm": ("vllm=={version}", "bin/vllm"),
                "sglang": ("sglang[all]=={version}", "bin/python")}  # fmt: skip
SGLANG_VERSION = "import sglang; print(sglang.__version__)"
# The agent's own environment must not leak into the engine's.
DROPPED_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")


@dataclass(frozen=True)
class PipSettings:
    index_url: str = ""  # "" is pip's own default (or pip.conf)
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    python: str = sys.executable  # makes the venvs
    timeout: float = 3600.0  # a whole pip install: vLLM is gigabytes

    def index_args(self) -> list[str]:
        args = ["--no-index"] if self.no_index else []
        args += ["--index-url", self.index_url] if self.index_url else []
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        return args


def install_python_engine(
    engine: str,
    version: str,
    target_dir: Path,
    pip: PipSettings,
    say: Callable[[str], None],
    version_timeout: float,
) -> str:
    """Make a venv at ``target_dir`` with ``engine`` at ``version``, check it runs, and
    return its executable; on any failure nothing is left at ``target_dir``."""
    if engine not in REQUIREMENTS:
        raise InstallError(f"llmgw installs {', '.join(REQUIREMENTS)} with pip, not {engine}")
    if target_dir.exists() and any(target_dir.iterdir()):
        raise InstallError(f"{target_dir} exists and is not empty; llmgw leaves it alone")
    spec, executable = REQUIREMENTS[engine]
    requirement = spec.format(version=version)
    try:
        say("creating a virtualenv")
        _run([pip.python, "-m", "venv", str(target_dir)], "creating a virtualenv", 300)
        say(f"pip install {requirement}")
        python = str(target_dir / "bin" / "python")
        command = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                   *pip.index_args(), requirement]  # fmt: skip
        _run(command, f"pip install {requirement}", pip.timeout)
        say(f"checking {engine}")
        _check(engine, version, target_dir, version_timeout)
    except BaseException:
        shutil.rmtree(target_dir, ignore_errors=True)
        raise
    return str(target_dir / executable)


def _check(engine: str, version: str, target_dir: Path, timeout: float) -> None:
    if engine == "vllm":
        output = _run([str(target_dir / "bin" / "vllm"), "--version"], "vllm --version", timeout)
    else:
        command = [str(target_dir / "bin" / "python"), "-c", SGLANG_VERSION]
        output = _run(command, "importing sglang", timeout)
    said = output.strip().splitlines()[-1].strip() if output.strip() else ""
    if said != version and not said.endswith(version):
        raise InstallError(f"{engine} installed but says version {said!r}, not {version}")


def _run(command: list[str], what: str, timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    code, text = run_bounded(command, what, timeout, env=env)
    if code != 0:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        meaningful = [line for line in lines if line.startswith("ERROR")] or lines
        tail = " / ".join(meaningful[-3:])
        raise InstallError(f"{what} failed (exit code {code}): {tail}")
    return text
