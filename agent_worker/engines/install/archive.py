"""Unpacking an engine archive so that nothing in it can reach outside its directory.

Every member is checked before anything is written: an absolute path, a ``..`` part, a
link whose target leaves the directory (or a hard link to no member), a device file or
a fifo refuses the whole archive, naming the member. Links that stay inside are fine:
llama.cpp's libraries are ``libggml.so -> libggml.so.0 -> libggml.so.0.26.0``.

Where a link leads is worked out as the disk will: through every other link the archive
holds, wherever it lies in the archive (``d -> .`` then ``e -> d/d/d/..`` reads ``d/d``
but is the directory's parent). Python's own tar filter checks this too, but had bypasses
(CVE-2025-4517, fixed in 3.11.13 only), and nodes run the Python they have.
"""

from __future__ import annotations

import os
import posixpath
import stat
import tarfile
import zipfile
from pathlib import Path

from agent_worker.engines.install.errors import InstallError

TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tar")


def unpack(archive: Path, into: Path) -> None:
    """Unpack ``archive`` (tar or zip) into the existing, empty directory ``into``."""
    name = archive.name
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zipped:
                for info in zipped.infolist():
                    _check_zip_member(zipped, info, name)
                zipped.extractall(into)  # noqa: S202 (every member was checked above)
                _restore_zip_modes(zipped, into)
        elif name.endswith(TAR_SUFFIXES):
            with tarfile.open(archive) as tar:
                members = tar.getmembers()  # reads the whole archive: truncation shows here
                names = {posixpath.normpath(member.name) for member in members}
                for member in members:
                    _check_tar_member(member, names, name)
                _check_links_on_disk(members, name)
                tar.extractall(into, members=members, filter="tar")
        else:
            raise InstallError(f"{name} is neither a tar archive nor a zip; llmgw unpacks "
                               f"{', '.join(TAR_SUFFIXES)} and .zip")  # fmt: skip
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise InstallError(f"{name} is truncated or corrupt: {exc}") from None
    except OSError as exc:
        raise InstallError(f"unpacking {name} failed: {exc}") from None


def _check_path(path: str, archive: str) -> str:
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        raise InstallError(f"{archive}: member {path!r} has an absolute path; refused")
    if ".." in path.replace("\\", "/").split("/"):
        raise InstallError(f"{archive}: member {path!r} climbs out with '..'; refused")
    return posixpath.normpath(path)


def _check_link(member: str, target: str, archive: str) -> None:
    if target.startswith("/"):
        raise InstallError(f"{archive}: link {member!r} points to {target!r}, outside; refused")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(member), target))
    if resolved == ".." or resolved.startswith("../"):
        raise InstallError(f"{archive}: link {member!r} points to {target!r}, outside; refused")


def _check_tar_member(member: tarfile.TarInfo, names: set[str], archive: str) -> None:
    path = _check_path(member.name, archive)
    if member.issym():
        _check_link(path, member.linkname, archive)
    elif member.islnk():
        # A hard link names another member, from the archive's top.
        target = member.linkname
        if target.startswith("/") or ".." in target.split("/"):
            raise InstallError(
                f"{archive}: hard link {member.name!r} points to {target!r}, outside; refused"
            )
        if posixpath.normpath(target) not in names:
            raise InstallError(
                f"{archive}: hard link {member.name!r} points to {target!r}, which is not in "
                "the archive; refused"
            )
    elif member.isdev() or member.isfifo():
        raise InstallError(f"{archive}: member {member.name!r} is a device or fifo; refused")
    elif not (member.isfile() or member.isdir()):
        raise InstallError(f"{archive}: member {member.name!r} is of an unknown type; refused")


# More hops than any real release needs (Linux itself gives up after 40).
MAX_LINK_HOPS = 40


def _check_links_on_disk(members: list[tarfile.TarInfo], archive: str) -> None:
    """Refuse a member or link target that leaves the directory once links are followed,
    and a link whose path another member also names (which one wins depends on order)."""
    links: dict[str, str] = {}
    seen: set[str] = set()
    for member in members:
        path = posixpath.normpath(member.name)
        if member.issym():
            links[path] = member.linkname
        if path in seen and path in links:
            raise InstallError(f"{archive}: names {path!r} twice, once as a link; refused")
        seen.add(path)
    for member in members:
        path = posixpath.normpath(member.name)
        _follow(posixpath.dirname(path), links, member.name, archive)
        if member.issym():
            _follow(posixpath.join(posixpath.dirname(path), member.linkname), links,
                    member.name, archive, target=member.linkname)  # fmt: skip
        elif member.islnk():
            _follow(member.linkname, links, member.name, archive, target=member.linkname)


def _follow(
    path: str, links: dict[str, str], member: str, archive: str, target: str | None = None
) -> str:
    """``path`` (from the archive's top) with every link in it followed; InstallError when
    that leaves the top, naming ``member`` (and ``target``, the link's own)."""
    parts: list[str] = []
    pending = path.split("/")
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                what = f"link {member!r} points to {target!r}" if target else f"member {member!r}"
                raise InstallError(f"{archive}: {what}, outside; refused")
            parts.pop()
            continue
        parts.append(part)
        followed = links.get("/".join(parts))
        if followed is not None:
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise InstallError(f"{archive}: {member!r} goes through links in a loop; refused")
            if followed.startswith("/"):  # refused as a member already; never followed
                raise InstallError(f"{archive}: {member!r} goes through an absolute link; refused")
            parts.pop()  # a link's target is read from the directory that holds it
            pending = followed.split("/") + pending
    return "/".join(parts)


def _check_zip_member(zipped: zipfile.ZipFile, info: zipfile.ZipInfo, archive: str) -> None:
    path = _check_path(info.filename, archive)
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        # extractall would write the link's target as a file; refuse rather than guess.
        target = zipped.read(info).decode("utf-8", "replace")
        _check_link(path, target, archive)
        raise InstallError(f"{archive}: member {info.filename!r} is a symlink, which llmgw "
                           "unpacks only from tar archives; refused")  # fmt: skip
    if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InstallError(f"{archive}: member {info.filename!r} is a device or fifo; refused")


def _restore_zip_modes(zipped: zipfile.ZipFile, into: Path) -> None:
    # zipfile drops the permission bits: without them llama-server is not executable.
    for info in zipped.infolist():
        mode = (info.external_attr >> 16) & 0o777
        if mode and not info.is_dir():
            os.chmod(into / info.filename, mode)
