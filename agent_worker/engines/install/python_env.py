"""vLLM and SGLang: a virtualenv per engine version, ``pip install`` from the package
index the node is configured with, and a check that the engine runs before it counts.

Virtualenvs are not relocatable (their scripts name the interpreter's absolute path), so
the venv is made at its final path; the caller writes its marker only after this returns,
and a failure removes the directory whole.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent_worker.engines.install.checks import run_bounded
from agent_worker.engines.install.errors import InstallError
from agent_worker.engines.probe import SGLANG_IMPORT, SGLANG_VERSION_TAG

# engine -> (the requirement pip installs, the executable the adapter runs)
REQUIREMENTS = {"vllm": ("vllm=={version}", "bin/vllm"),
                "sglang": ("sglang[all]=={version}", "bin/python")}  # fmt: skip
# The agent's own environment must not leak into the engine's.
DROPPED_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
# `python -m venv` copies pip in from ensurepip, offline: seconds, unless the disk hangs.
VENV_TIMEOUT = 300.0
# pip's own chatter, which says nothing about why an install failed.
PIP_NOISE = ("[notice]", "note:", "hint:")


@dataclass(frozen=True)
class PipSettings:
    """Where pip finds the engines, and what makes the venvs."""

    index_url: str = ""  # "" is pip's own default (or pip.conf)
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    python: str = sys.executable  # makes the venvs (`python -m venv`)
    timeout: float = 3600.0  # a whole pip install: vLLM is gigabytes

    def index_args(self) -> list[str]:
        """The pip options that say where to look."""
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
    return its executable (``bin/vllm``; SGLang's ``bin/python``).

    Raise ``InstallError`` naming the engine, the version and what failed; on any failure
    nothing is left at ``target_dir``.
    """
    if engine not in REQUIREMENTS:
        raise InstallError(f"llmgw installs {', '.join(REQUIREMENTS)} with pip, not {engine}")
    refuse_occupied(target_dir)
    spec, executable = REQUIREMENTS[engine]
    requirement = spec.format(version=version)
    try:
        say("creating a virtualenv")
        venv = [pip.python, "-m", "venv", str(target_dir)]
        run_step(venv, f"creating a virtualenv for {engine} {version}", VENV_TIMEOUT)
        say(f"pip install {requirement}")
        python = str(target_dir / "bin" / "python")
        # No progress bar: nobody reads it here, and for gigabytes of wheels it is most
        # of the output held in memory.
        command = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                   "--progress-bar", "off", *pip.index_args(), requirement]  # fmt: skip
        run_step(command, f"pip install {requirement}", pip.timeout)
        say(f"checking {engine}")
        _check(engine, version, target_dir, version_timeout)
    except BaseException:
        # Anything at the path would be taken for an install by the next look, or
        # refused as somebody else's by the next try.
        shutil.rmtree(target_dir, ignore_errors=True)
        raise
    return str(target_dir / executable)


def _check(engine: str, version: str, target_dir: Path, timeout: float) -> None:
    """Run the engine as the adapter will, and hold it to the version pip was asked for."""
    if engine == "vllm":
        what = f"checking vllm {version}: vllm --version"
        output = run_step([str(target_dir / "bin" / "vllm"), "--version"], what, timeout)
        # vLLM may log before it answers; the version has to be there as a whole word,
        # so 0.6.30 is not 0.6.3 (a local label such as 0.6.3+cu124 is: pip takes it).
        if not re.search(rf"(?<![\d.]){re.escape(version)}(?!\w|\.\w)", output):
            raise InstallError(f"{what} says {_tail(output) or 'nothing'!r}, not {version}")
        return
    # The tagged import probe.py runs, so the check and the probe read the same version;
    # cwd "/" (run_bounded's) so a stray sglang/ folder where the agent runs is not it.
    what = f"checking sglang {version}: importing sglang"
    output = run_step([str(target_dir / "bin" / "python"), "-c", SGLANG_IMPORT], what, timeout)
    tagged = [line for line in output.splitlines() if line.startswith(SGLANG_VERSION_TAG)]
    said = tagged[-1].removeprefix(SGLANG_VERSION_TAG).strip() if tagged else ""
    if said != version:
        raise InstallError(f"{what} gives version {said or 'none'!r}, not {version}")


def run_step(command: list[str], what: str, timeout: float) -> str:
    """Run ``command`` bounded, without the agent's venv; return its output, or raise
    naming ``what`` with the process's last meaningful lines."""
    env = {key: value for key, value in os.environ.items() if key not in DROPPED_ENV}
    code, output = run_bounded(command, what, timeout, env=env)
    if code < 0:
        raise InstallError(f"{what} was killed by signal {_signal_name(-code)}")
    if code != 0:
        tail = _tail(output)
        raise InstallError(f"{what} failed (exit code {code})" + (f": {tail}" if tail else ""))
    return output


def _tail(output: str, count: int = 3) -> str:
    """The last few lines that say something: pip's ERROR lines when there are any."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines if not line.lower().startswith(PIP_NOISE)]
    errors = [line for line in lines if line.startswith("ERROR")]
    return " / ".join((errors or lines)[-count:])


def refuse_occupied(target_dir: Path) -> None:
    """Refuse a link, or a directory holding anything: not llmgw's to make a venv in."""
    if target_dir.is_symlink() or (target_dir.exists() and not is_empty_dir(target_dir)):
        raise InstallError(f"{target_dir} is not an empty directory; llmgw leaves it alone")


def is_empty_dir(path: Path) -> bool:
    try:
        return not any(path.iterdir())
    except OSError:  # a file, or unreadable: not ours to use either way
        return False


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
