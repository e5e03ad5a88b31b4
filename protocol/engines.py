"""Engines on a node, both ways: what the control plane wants a node to have
(``WantedEngine``, carried by the ``converge_engines`` command) and what the node says it
has (``EngineInstall``, one per engine version, in ``register`` and ``engines``).

A status is one word and the node's own detail: ``installed``, ``installing: downloading
llama-b6000-bin-ubuntu-x64.tar.gz (16 MiB, 40%)``, ``waiting: another apt-get is
running``, ``failed: libgomp.so.1 not found``. Only ``installed`` can run a shard.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

PLATFORMS = ("linux-x86_64", "linux-aarch64")
# Engines that are Python packages: a node installs them with pip, never from an archive.
PIP_ENGINES = ("vllm", "sglang")
# "cpu", "cuda", or "cuda>=12.4": the least CUDA version the node's driver must support.
ACCELERATOR = re.compile(r"^(cpu|cuda(>=\d+(\.\d+)?)?)$")
EngineStatusWord = Literal["installed", "installing", "waiting", "failed"]
# An engine's name, version and build name each become one file or directory name on a
# node (<root>/<engine>/<version>/, engine-downloads/<engine>-<version>/): one path
# component, never "/", "." or "..", so no catalog can point a root agent elsewhere.
PATH_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
# Debian policy's package name; above all never "-o …", which apt-get would take as an option.
DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


def check_path_token(field: str, value: str) -> str:
    """``value``, or ValueError naming ``field`` unless it is one plain path component."""
    if not PATH_TOKEN.match(value):
        raise ValueError(
            f"{field} {value!r} is not usable as a directory name on a node; use letters, "
            "digits and . _ + - (64 at most, starting with a letter or digit), no / or .."
        )
    return value


def check_package_names(packages: Iterable[str]) -> list[str]:
    """``packages``, or ValueError naming the first that is not a Debian package name."""
    for package in packages:
        if not DEBIAN_PACKAGE.match(package):
            raise ValueError(
                f"{package!r} is not a Debian package name (lower-case letters, digits and "
                "+ . -, starting with a letter or digit); list packages only, no apt options"
            )
    return list(packages)


def natural_key(version: str) -> list[tuple[int, int | str]]:
    """Sort key for versions: b10991 is newer than b9000, which a string sort denies."""
    return [(1, int(part)) if part.isdigit() else (0, part) for part in re.split(r"(\d+)", version)]


def newest_version(versions: Iterable[str]) -> str:
    """The newest of ``versions`` in natural order; "" when there are none."""
    return max(versions, key=natural_key, default="")


class EngineBuild(BaseModel):
    """One archive of an engine version, for one platform and accelerator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    packages: list[str] = Field(default_factory=list, description="apt packages it needs")
    platform: str = "linux-x86_64"
    accelerator: str = "cpu"

    @field_validator("name")
    @classmethod
    def _name_is_a_token(cls, value: str) -> str:
        return check_path_token("build name", value)

    @field_validator("packages")
    @classmethod
    def _debian_packages(cls, value: list[str]) -> list[str]:
        return check_package_names(value)

    @field_validator("platform")
    @classmethod
    def _known_platform(cls, value: str) -> str:
        if value not in PLATFORMS:
            raise ValueError(f"unknown platform {value!r}; use one of {', '.join(PLATFORMS)}")
        return value

    @field_validator("accelerator")
    @classmethod
    def _known_accelerator(cls, value: str) -> str:
        if not ACCELERATOR.match(value):
            raise ValueError(
                f"unknown accelerator {value!r}; use cpu, cuda, or cuda>=VERSION (cuda>=12.4)"
            )
        return value

    @property
    def least_cuda(self) -> tuple[int, int] | None:
        """The least CUDA version a ``cuda>=X.Y`` build needs; None when it names none."""
        _, _, version = self.accelerator.partition(">=")
        if not version:
            return None
        major, _, minor = version.partition(".")
        return int(major), int(minor or 0)


class WantedEngine(BaseModel):
    """An engine version the catalog names; archive engines carry their builds, Python
    engines (vLLM, SGLang) none: they are installed with pip."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    builds: list[EngineBuild] = Field(default_factory=list)

    @field_validator("name", "version")
    @classmethod
    def _one_path_component(cls, value: str, info: ValidationInfo) -> str:
        return check_path_token(f"engine {info.field_name}", value)

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.version


class EngineInstall(BaseModel):
    """One engine version on a node and how it stands, as its agent says."""

    model_config = ConfigDict(extra="forbid")

    engine: str = ""
    version: str = ""
    path: str = Field(default="", description="the executable; for SGLang the Python")
    status: EngineStatusWord = "installed"
    detail: str = Field(default="", description="the node's own words for the status")
    managed: bool = Field(default=False, description="installed by llmgw, which may remove it")

    @property
    def installed(self) -> bool:
        return self.status == "installed"

    @property
    def words(self) -> str:
        """``installing: downloading … (40%)``: the status as the node put it."""
        return (
            f"{self.status}: {self.detail}" if self.detail and not self.installed else self.status
        )


def chosen_install(
    installs: Iterable[EngineInstall], engine: str, version: str = ""
) -> EngineInstall | None:
    """The install a node runs ``engine`` at ``version`` ("" any) with: llmgw's own first,
    since the catalog named it, then the newest. The agent launches with it, and the
    control plane reads from it what a replica with no recorded version runs."""
    candidates = [
        install
        for install in installs
        if install.installed
        and install.engine == engine
        and (not version or install.version == version)
    ]
    return max(candidates, key=lambda i: (i.managed, natural_key(i.version)), default=None)
