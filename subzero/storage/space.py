"""Telling a full disk from damage: a write that fails for want of space is said so,
naming the folder, whatever library failed (zarr's OSError, LMDB's ``DiskError``,
an R-tree's "corrupted data file", SQLite's "disk I/O error")."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from subzero.errors import DiskFull, SubZeroError
from subzero.tuning import DISK_FULL_BYTES

#: what the operating system and the libraries SubZero writes with say when a disk is full
_FULL_TEXT = ("no space left", "disk quota exceeded", "database or disk is full")
_FULL_ERRNO = (errno.ENOSPC, errno.EDQUOT)
#: the libraries whose failed writes may not say why (their exceptions' top module)
_WRITERS = ("lmdb", "rtree", "sqlite3", "zarr", "numcodecs")


def free_bytes(folder: str | os.PathLike[str]) -> int | None:
    """Bytes this process may still write on the file system of ``folder`` (its nearest
    existing parent), or None when it cannot be asked."""
    p = Path(folder)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except (OSError, AttributeError):
        return None
    # root may write the blocks reserved for it: count what it can use
    avail = st.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else st.f_bavail
    return int(avail) * int(st.f_frsize)


def is_full(err: BaseException, folder: str | os.PathLike[str]) -> bool:
    """Whether ``err``, raised while writing under ``folder``, is a full disk: its errno
    or text says so, or it is a write failure that does not say why while the file
    system has (almost) nothing free."""
    if isinstance(err, DiskFull):
        return True
    if isinstance(err, SubZeroError):
        return False
    if isinstance(err, OSError) and err.errno in _FULL_ERRNO:
        return True
    text = str(err).lower()
    if any(t in text for t in _FULL_TEXT):
        return True
    if not isinstance(err, OSError) and type(err).__module__.split(".")[0] not in _WRITERS:
        return False        # not a failed write (a bug stays a bug, full disk or not)
    free = free_bytes(folder)
    return free is not None and free < DISK_FULL_BYTES


def disk_full(folder: str | os.PathLike[str], what: str) -> DiskFull:
    """The one-line error: ``what`` could not be written because the disk of
    ``folder`` is full."""
    return DiskFull(f"the disk is full: {what} cannot be written to {folder}; free some "
                    f"space there, or use a store on another disk")


@contextlib.contextmanager
def full_disk_named(folder: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Turn a failure of writing ``what`` under ``folder`` into :class:`DiskFull` when
    the disk is full; any other failure passes unchanged."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        if is_full(e, folder):
            raise disk_full(folder, what) from e
        raise

