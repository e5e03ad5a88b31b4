"""Engine release archives made in a test, and an installer over a real temp directory."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from agent_worker.engines.install import (
    AptSettings,
    EngineInstaller,
    InstallSettings,
    NodeTarget,
    PipSettings,
)
from agent_worker.weights import FetchSettings
from protocol.engines import EngineBuild, WantedEngine

FAST = FetchSettings(progress_interval=0.0, attempts=2, backoff=0.01)
X86_64 = NodeTarget("linux-x86_64")
PRINTS_VERSION = "#!/bin/sh\necho 'version: 6000 (abc123)'\n"

Member = tuple[str, str, bytes | str]  # (kind, name, content or link target)


def tar_gz(members: list[Member]) -> bytes:
    """A .tar.gz of ``members``: ("file", name, bytes), ("exec", name, text),
    ("symlink", name, target), ("hardlink", name, target), ("fifo", name, "")."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for kind, name, content in members:
            info = tarfile.TarInfo(name)
            data = content.encode() if isinstance(content, str) else content
            if kind in ("file", "exec"):
                info.size, info.mode = len(data), 0o755 if kind == "exec" else 0o644
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE, "device": tarfile.CHRTYPE}[kind]  # fmt: skip
            info.linkname = str(content)
            tar.addfile(info)
    return buffer.getvalue()


def release(version: str = "b6000", server: str = PRINTS_VERSION) -> list[Member]:
    """A llama.cpp-style release: one top folder, bin/, a library behind two links."""
    top = f"llama-{version}/bin"
    return [
        ("exec", f"{top}/llama-server", server),
        ("file", f"{top}/libggml.so.0.26.0", b"\x7fELF not really"),
        ("symlink", f"{top}/libggml.so.0", "libggml.so.0.26.0"),
        ("symlink", f"{top}/libggml.so", "libggml.so.0"),
    ]


def wanted(url: str, sha256: str, version: str = "b6000", **build: object) -> WantedEngine:
    return WantedEngine(
        name="llama.cpp",
        version=version,
        builds=[EngineBuild(name="cpu-x64", url=url, sha256=sha256, **build)],  # type: ignore[arg-type]
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_installer(
    home: Path,
    apt: AptSettings | None = None,
    clock: Callable[[], float] | None = None,
    in_use: Callable[[], set[tuple[str, str]]] = set,
    target: NodeTarget = X86_64,
    pip: PipSettings | None = None,
) -> EngineInstaller:
    settings = InstallSettings(
        root=home / "engines",
        staging=home / "engines-staging",
        downloads=home / "engine-downloads",
        apt=apt or AptSettings(command=(str(home / "no-apt-get"),)),
        fetch=FAST,
        pip=pip or PipSettings(),
        version_timeout=30.0 if pip else 5.0,
        **({"clock": clock} if clock else {}),
    )
    return EngineInstaller(settings, target, in_use=in_use)


def leftovers(home: Path, keep: tuple[str, ...] = ()) -> list[str]:
    """Whatever an install left behind outside the versions in ``keep``."""
    found = []
    for top in ("engines", "engines-staging", "engine-downloads"):
        for path in (home / top).rglob("*") if (home / top).exists() else []:
            relative = path.relative_to(home)
            parts = relative.parts
            if parts[:1] == ("engines",) and len(parts) >= 3 and parts[2] in keep:
                continue
            if path.is_dir() and not path.is_symlink() and len(relative.parts) <= 2:
                continue  # the directories themselves (and engines/llama.cpp) may stay
            found.append(str(relative))
    return found


def wheel(directory: Path, name: str, version: str, files: dict[str, str],
          scripts: dict[str, str] | None = None, extras: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """Write ``{name}-{version}-py3-none-any.whl`` holding ``files`` and console scripts."""
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Provides-Extra: {extra}\n" for extra in extras)
    contents = dict(files)
    contents[f"{dist}/METADATA"] = metadata
    contents[f"{dist}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: llmgw-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if scripts:
        lines = "".join(f"{script} = {target}\n" for script, target in scripts.items())
        contents[f"{dist}/entry_points.txt"] = f"[console_scripts]\n{lines}"
    record = []
    for member, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{member},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    contents[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in contents.items():
            archive.writestr(member, text)
    return path
