"""The one way an engine install fails: a reason that names the archive or file."""

from __future__ import annotations


class InstallError(RuntimeError):
    """An install that cannot go on; ``str()`` is what the node reports after "failed: "."""
