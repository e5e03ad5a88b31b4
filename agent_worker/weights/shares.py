"""Which shared store a look directory is on, named so that every node that sees the same
filer names it alike, and no two filers share a name.

A store is its fabric and its filesystem's identity as the server sees it, never the path a
node mounts it on (two fabrics may each have their own filer at /lustre/models) nor the
device number a client gives it (each NFS or Lustre client numbers its mounts its own way,
so one filer would count once per node):

- a declared ``shared:`` directory carries a marker file (``.llmgw-share``, a random id)
  that the first agent to see it writes and every other reads: the filer's own name for
  itself, whatever path or server name each node reaches it by;
- where no marker can be read or written (a read-only export, root squashed), a network
  filesystem is named by its type and mount source (``nfs4:filer:/export/llm``), whatever
  directory below it is looked in;
- and a declared share on neither (a marker unwritable on local storage) by its path.

Each is prefixed with the node's fabrics (``ib-a/``), so that the same mount source or path
on two fabrics is two stores. Local storage that is not declared shared is never a store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from collections.abc import Sequence
from pathlib import Path

from core.mounts import Mount, mount_of

log = logging.getLogger("llmgw.agent.weights")

MARKER = ".llmgw-share"
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "cephfs", "ceph", "beegfs", "fuse.cephfs")
_MARKER_ID = re.compile(r"[0-9a-f]{32}")


def share_store(share: Path, fabrics: Sequence[str], mounts: Sequence[Mount]) -> str:
    """The store of a declared shared directory ``share`` (resolved)."""
    marked = share_marker(share)
    if marked:
        return _on(fabrics, f"share:{marked}")
    mount = mount_of(share, mounts)
    if mount is not None and mount.fstype in NETWORK_FILESYSTEMS:
        return _on(fabrics, mount_identity(mount))
    return _on(fabrics, f"shared:{share}")


def network_store(directory: Path, fabrics: Sequence[str], mounts: Sequence[Mount]) -> str:
    """The store of a look directory on a network filesystem, or "" when it is local."""
    mount = mount_of(directory, mounts)
    if mount is None or mount.fstype not in NETWORK_FILESYSTEMS:
        return ""
    return _on(fabrics, mount_identity(mount))


def mount_identity(mount: Mount) -> str:
    """A network filesystem as its server names it: its type and mount source."""
    return f"{mount.fstype}:{mount.source}"


def share_marker(share: Path) -> str:
    """The id in ``share``'s marker file, written first if there is none; "" when it can
    be neither read nor written (read-only, or not ours to write)."""
    marker = share / MARKER
    found = _read_marker(marker)
    if found:
        return found
    made = share / f"{MARKER}.{uuid.uuid4().hex}"
    try:
        made.write_text(uuid.uuid4().hex + "\n")
        made.chmod(0o644)
        # A link is made whole or not at all, and never over another: of two nodes that
        # write at once, one's id stands and both read it.
        with contextlib.suppress(FileExistsError):
            os.link(made, marker)
    except OSError as err:
        log.info("cannot mark shared directory %s (%s); naming it by its mount", share, err)
        return ""
    finally:
        with contextlib.suppress(OSError):
            made.unlink()
    return _read_marker(marker)


def _read_marker(marker: Path) -> str:
    try:
        text = marker.read_text().strip()
    except OSError:
        return ""
    if not _MARKER_ID.fullmatch(text):
        log.warning("%s does not hold an id llmgw wrote; naming its share by its mount", marker)
        return ""
    return text


def _on(fabrics: Sequence[str], identity: str) -> str:
    scope = "+".join(sorted(fabrics))
    return f"{scope}/{identity}" if scope else identity
