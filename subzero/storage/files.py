"""Reading a store's small files: a regular file in its place, read with a bound,
never blocking.

A store may come from elsewhere, and its files are read by ``subzero runs``,
``show`` and traces before anything has been proven about them.  A symbolic link
in a file's place could point anywhere (``/dev/zero`` is endless, another user's
file is not the store's), and a FIFO blocks its reader forever.  So every file
SubZero reads whole from a store -- signatures, ``workflow.pkl``, metadata and
digest files, the journal, lineage shards and R-tree files -- is opened here with
``O_NOFOLLOW | O_NONBLOCK``, checked with ``fstat`` to be a regular file, and
read only up to a limit (:mod:`subzero.tuning`) that no file SubZero writes
there comes near.

A file that is missing raises :class:`FileNotFoundError` as ``open`` would (callers
tell "missing" apart); one that is a link, not a regular file, or too big raises
:class:`~subzero.errors.UnsafeFile`, which the caller reports as damage of the
piece the file holds, in its own error class.
"""

from __future__ import annotations

import errno
import os
import stat

from subzero.errors import CorruptArray, UnsafeFile

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in a user's words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], what: str, follow: bool = False) -> int:
    """A read-only descriptor of the regular file at ``path`` (``what`` names it in
    errors: "the signature file").  A symbolic link is refused unless ``follow``;
    opening never blocks (a FIFO opens at once, and is then refused)."""
    p = os.fspath(path)
    try:
        fd = os.open(p, _FLAGS | (0 if follow else _NOFOLLOW))
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) and not follow:
            raise UnsafeFile(f"{what} {p} is a symbolic link, not a regular file") from e
        if e.errno == errno.ENXIO:         # a socket, or a device without its driver
            try:
                kind = kind_of(os.lstat(p).st_mode)
            except OSError:
                raise e from None
            raise UnsafeFile(f"{what} {p} is {kind}, not a regular file") from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{what} {p} is {kind_of(st.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int, expect: int | None = None) -> bytes:
    """At most ``limit + 1`` bytes of an open file, from where it stands (one more than
    the limit tells a file that is too big from one that fits).  ``expect``: the size
    the file had (``fstat``), so that a small file is read into a buffer of its size
    rather than one of the limit's (a file grown since is still read to the limit)."""
    parts, left = [], limit + 1
    ask = expect + 1 if expect is not None else 1 << 24
    while left > 0:
        chunk = os.read(fd, min(left, ask, 1 << 24))
        ask = max(ask * 2, 1 << 16)    # the end (usually), or a file that grew: read on
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_regular(path: str | os.PathLike[str], limit: int, what: str, follow: bool = False,
                 limit_name: str = "") -> bytes:
    """The bytes of the regular file at ``path``, which must hold at most ``limit``
    bytes (``limit_name``: the tuning constant, named in the error).  Raises
    FileNotFoundError when it is missing, :class:`~subzero.errors.UnsafeFile` when
    it is a link (unless ``follow``), not a regular file or too big, OSError when it
    cannot be read."""
    fd = open_regular(path, what, follow)
    try:
        size = os.fstat(fd).st_size
        data = b"" if size > limit else read_fd(fd, limit, size)
    finally:
        os.close(fd)
    if size > limit or len(data) > limit:
        bound = f" ({limit_name})" if limit_name else ""
        raise UnsafeFile(f"{what} {os.fspath(path)} holds {max(size, len(data))} bytes, more "
                         f"than SubZero ever writes there (at most {limit}{bound})")
    return data


def read_array_file(path: str | os.PathLike[str], limit: int, what: str, label: str,
                    limit_name: str = "") -> bytes | None:
    """A small file that belongs to a stored array (its checksum sidecar, a run's
    reference to an input stored once): its bytes, or None when there is none.  A file
    that is unsafe (a link, not a regular file, too big) or cannot be read is a
    :class:`~subzero.errors.CorruptArray` naming the array (``label``)."""
    try:
        return read_regular(path, limit, what, limit_name=limit_name)
    except FileNotFoundError:
        return None
    except UnsafeFile as e:
        raise CorruptArray(f"{label} is damaged: {e}") from e
    except OSError as e:
        raise CorruptArray(f"{label} cannot be read: {path}: {e.strerror or e}") from e


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a folder's entries durable (a rename into it, files made in it); a file
    system that cannot sync folders is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
