"""Installing the engines the catalog names, on the node itself: the build that fits,
checked, unpacked safely, its packages and libraries present, seen to run; vLLM and
SGLang in a virtualenv per version. See ``installer`` for the order of things."""

from __future__ import annotations

from agent_worker.engines.install.apt import AptSettings
from agent_worker.engines.install.builds import NodeTarget, choose_build
from agent_worker.engines.install.errors import InstallError
from agent_worker.engines.install.installer import EngineInstaller, InstallSettings
from agent_worker.engines.install.python_env import PipSettings

__all__ = [
    "AptSettings",
    "EngineInstaller",
    "InstallError",
    "InstallSettings",
    "NodeTarget",
    "PipSettings",
    "choose_build",
]
