"""Where the control plane may read a model's local files (its header, its adapters' sizes)
for the fit estimate: only under the model roots (settings.LLMGW_MODEL_ROOTS), so that a
catalog entry cannot make the estimate an oracle for this host's files (review finding 24).
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings


class OutsideModelRoots(ValueError):
    """A local source the control plane does not read; the message names it and the fix."""


def under_a_model_root(source: str, roots: list[Path] | None = None) -> Path:
    """``source`` as a path under one of the model roots (LLMGW_MODEL_ROOTS), or
    OutsideModelRoots saying it is not: decided by the name before the file is looked at, then
    by where links lead (a link out of a root is refused too)."""
    roots = settings.LLMGW_MODEL_ROOTS if roots is None else roots
    named = os.path.normpath(source)
    if not any(_within(named, os.path.normpath(root)) for root in roots):
        raise OutsideModelRoots(
            f"{source} is not under a model root of the control plane "
            f"({os.pathsep.join(map(str, roots))}); add its directory to LLMGW_MODEL_ROOTS "
            "to have its size estimated, or declare memory: or gpu_memory: for its profiles"
        )
    real = os.path.realpath(named)
    if not any(_within(real, os.path.realpath(root)) for root in roots):
        raise OutsideModelRoots(
            f"{source} is a link that leads out of the control plane's model roots; name the "
            "file it leads to, under a root, or add that directory to LLMGW_MODEL_ROOTS"
        )
    return Path(real)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
