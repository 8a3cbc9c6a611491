"""Scratch folders that a killed process does not leave behind.

A budget run (its profile, its workload, its made run's child), the calibration and
a Spark task's shard all work in folders of the system's temporary folder and remove them when they are
done.  A process killed outright (``kill -9``, the out-of-memory killer, a lost
node) removes nothing: at genomics 10,000x a profile's samples alone are tens of
megabytes, and a survey's night of budget runs would fill ``/tmp`` a run at a
time.  So every such folder is *held*: it is made with a file ``.held`` that its
process keeps locked (``flock``) for as long as it uses the folder.  A lock is
released by the kernel when the last process holding it ends, however it ends --
children forked while it is held hold it too, so a folder outlives its maker while
a child still works in it -- and is shared by nothing else.  Making a scratch
folder first sweeps the scratch folders, of every kind, whose lock no process holds
(:func:`sweep`): only this user's, only folders with a ``.held`` file (a folder is
given its name only once that file is locked, so one being made is never taken for an
abandoned one), and never through a link.

A leaf module: the standard library only.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

#: every scratch folder's name begins with this, then its kind
PREFIX = "subzero-"
#: the file a scratch folder's process holds a lock on
HELD = ".held"
#: seconds after which a folder left half made (hidden, its maker killed as it made it)
#: is swept: making one takes microseconds
MAKING_GRACE_S = 60.0


class Scratch:
    """A scratch folder held by this process (and the children it forks) until
    :meth:`close`, which removes it."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    def close(self) -> None:
        """Remove the folder and let go of it (more calls do nothing)."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:            # a forgotten close: never a leaked descriptor
        if getattr(self, "_fd", None) is not None:
            try:
                os.close(self._fd)  # type: ignore[arg-type]
            except OSError:
                pass


def scratch(kind: str, base: str | os.PathLike[str] | None = None, swept: bool = True) -> Scratch:
    """A new scratch folder ``subzero-KIND-XXXXXXXX`` in ``base`` (the system's temporary
    folder by default), held by this process.  ``swept``: remove first the scratch folders,
    of every kind, that no process holds (a caller that makes many small folders, a shard
    per tile, says False: the next scratch made with a sweep removes its leftovers).

    The folder is made under a hidden name (``.subzero-KIND-...``), its :data:`HELD` file
    locked, and only then renamed to its own: a sweep never sees a folder of that name
    whose lock is not held yet.  A process killed in between leaves a hidden folder with
    an empty file, swept once it is ``MAKING_GRACE_S`` old."""
    where = Path(base) if base is not None else Path(tempfile.gettempdir())
    if swept:
        sweep(None, where)
    making = Path(tempfile.mkdtemp(prefix=f".{PREFIX}{kind}-", dir=where))
    fd = None
    try:
        fd = os.open(making / HELD, os.O_CREAT | os.O_EXCL | os.O_WRONLY
                     | getattr(os, "O_NOFOLLOW", 0), 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = making.with_name(making.name[1:])
        os.rename(making, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        shutil.rmtree(making, ignore_errors=True)
        raise
    return Scratch(path, fd)


def sweep(kind: str | None = None, base: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the scratch folders (of ``kind``, or of every kind) in ``base`` that no
    process holds any more: their makers ended without removing them.  Returns them.
    Folders of other users, folders without a :data:`HELD` file and links are left
    alone; a folder whose lock is held (its process, or a child of it, lives) too, and
    one still being made (hidden) until it is ``MAKING_GRACE_S`` old: then it goes
    whether it has its file or not (its maker was killed before it made it)."""
    where = Path(base) if base is not None else Path(tempfile.gettempdir())
    start = PREFIX + (f"{kind}-" if kind else "")
    gone: list[Path] = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return gone
    me, now = os.getuid(), time.time()
    for e in entries:
        hidden = e.name.startswith("." + start)
        if not (hidden or e.name.startswith(start)):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if not e.is_dir(follow_symlinks=False) or st.st_uid != me:
                continue
            if hidden and now - st.st_mtime < MAKING_GRACE_S:
                continue                      # being made: its lock may not be taken yet
            if hidden and not os.path.lexists(os.path.join(e.path, HELD)):
                shutil.rmtree(e.path, ignore_errors=True)   # killed before it made the file
                gone.append(Path(e.path))
                continue
            fd = os.open(os.path.join(e.path, HELD), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:                       # no held file: not a scratch folder
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:                   # held: its process lives
                continue
            shutil.rmtree(e.path, ignore_errors=True)
            gone.append(Path(e.path))
        finally:
            os.close(fd)
    return gone
