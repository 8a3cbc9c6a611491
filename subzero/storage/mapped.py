"""A run's LMDB file, mapped for reading, guarded against truncation under the reader.

LMDB reads through a memory map and checks page numbers against what its meta
page records, not against the file: pages past the end of a file truncated while
it is mapped are not an error but SIGBUS, which kills the process.  Python cannot
recover from SIGBUS in a mapped read, so the file must never shrink while a read
transaction is running.  :class:`MappedFile` makes sure of that, in layers:

1. *Opening.*  The data file is opened ``O_NOFOLLOW | O_NONBLOCK`` (a link, a
   FIFO or a device in its place is damage, never followed or waited on), checked
   to be a regular file at least as long as its meta pages say
   (:func:`~subzero.storage.integrity.lmdb_extent`), and LMDB opens *that* file
   (``/proc/self/fd/N``), not whatever the path names a moment later.
2. *Each read transaction* (:meth:`MappedFile.hold`) first takes a read lease on
   the file (Linux ``F_SETLEASE``), then checks its size again.  While the lease
   is held, anyone who opens the file for writing or truncates it waits (up to
   ``/proc/sys/fs/lease-break-time``, 45 s by default) until the transaction
   ends and the lease is given back; the next transaction then finds the file
   short and refuses to read it (:class:`~subzero.errors.CorruptLineage`).  A
   truncation keeps write access from before it breaks the lease until the file
   is cut, and no lease can be taken meanwhile: a reader refused a lease right
   after holding one waits for it (:meth:`MappedFile._take_lease`) rather than
   read unleased into the cut.  No window remains as long as one transaction
   lasts less than the lease-break time.  A lease is only held during a transaction, so a process that keeps a
   run open (the explorer) delays nobody while it is idle.
3. *Without a lease* -- the file is another user's (leases need its owner or
   ``CAP_LEASE``), it is open for writing elsewhere, or the file system has no
   leases (NFS) -- the size check before each transaction still stands: what
   remains is a truncation that lands *during* one transaction, a window as
   wide as that transaction (a key lookup or a batch of record blocks:
   microseconds to milliseconds).

The lease-break signal is redirected (``F_SETSIG``, before every lease: giving a
lease back resets it) to ``SIGURG``, whose default action is to ignore it: by
default the kernel would send ``SIGIO``, which terminates a process that has no
handler.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from subzero.errors import CorruptLineage, UnsafeFile
from subzero.storage.files import open_regular
from subzero.storage.integrity import lmdb_extent_of
from subzero.tuning import LEASE_WAIT_S

#: Linux's lease and lease-signal commands (0 where there are none: size checks only)
_LEASE: int = getattr(fcntl, "F_SETLEASE", 0)
_SETSIG: int = getattr(fcntl, "F_SETSIG", 0)

#: the signal a lease break is announced with: ignored unless someone handles it
_BREAK_SIGNAL = getattr(signal, "SIGURG", 0)


class MappedFile:
    """The data file of a read-only LMDB environment, held open to guard its reads."""

    def __init__(self, data: Path):
        self.path = Path(data)
        try:
            self.fd = open_regular(self.path, "lineage file")
        except UnsafeFile as e:
            raise CorruptLineage(f"{e} (damaged or replaced)") from e
        try:
            self.extent = lmdb_extent_of(self.fd)
            self.size = os.fstat(self.fd).st_size
            self._check(self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self._lock = threading.Lock()
        self._depth = 0
        self._leased = False
        self._can_lease = bool(_LEASE and _SETSIG and _BREAK_SIGNAL)
        #: whether the last lease asked for was granted (see :meth:`_take_lease`)
        self._had_lease = False

    @property
    def open_path(self) -> str:
        """The path LMDB should open: this very file (Linux's ``/proc/self/fd``), so a
        file swapped in after the checks is never the one mapped."""
        proc = f"/proc/self/fd/{self.fd}"
        return proc if os.path.exists(proc) else str(self.path)

    def _check(self, size: int) -> None:
        if self.extent is not None and size < self.extent:
            raise CorruptLineage(f"lineage file {self.path} is damaged: truncated to {size} "
                                 f"bytes, its header says {self.extent}")

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Around one read transaction: the file is leased (when it can be) and checked
        to be whole; see the module docstring."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def enter(self) -> None:
        """:meth:`hold`'s start (transactions call it directly: it is on every read)."""
        with self._lock:
            if self._depth == 0:
                self._leased = self._can_lease and self._take_lease()
            self._depth += 1
        try:
            self._check(os.fstat(self.fd).st_size)
        except BaseException:
            self.leave()
            raise

    def leave(self) -> None:
        """:meth:`hold`'s end: the last transaction out gives the lease back."""
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._leased:
                self._leased = False
                try:
                    fcntl.fcntl(self.fd, _LEASE, fcntl.F_UNLCK)
                except OSError:
                    pass

    def _take_lease(self) -> bool:
        """Lease the file for one transaction.  Refused because someone has it open for
        writing (EAGAIN) right after this reader held a lease, the refusal is most
        likely the one who broke that lease: a truncation holds write access from
        before it breaks the lease until after the file is cut, so reading now would
        map a file that shrinks under the read.  Then wait (up to
        :data:`~subzero.tuning.LEASE_WAIT_S`) for the lease; once it is granted the
        size check sees the cut.  A writer that stays costs that wait once."""
        delay, waited = 0.0005, 0.0
        while True:
            try:
                # before every lease: giving a lease back forgets the signal (Linux 6.18)
                fcntl.fcntl(self.fd, _SETSIG, _BREAK_SIGNAL)
                fcntl.fcntl(self.fd, _LEASE, fcntl.F_RDLCK)
            except OSError as e:
                if e.errno != errno.EAGAIN:      # not ours (EACCES), no leases here (EINVAL...):
                    self._can_lease = False      # that does not change; open for writing might
                    return False
                if not self._had_lease or waited >= LEASE_WAIT_S:
                    self._had_lease = False
                    return False
                time.sleep(delay)
                waited += delay
                delay = min(delay * 2, 0.05)
                continue
            self._had_lease = True
            return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class GuardedTxn:
    """An LMDB read transaction begun and ended inside :meth:`MappedFile.hold`."""

    __slots__ = ("_env", "_file", "_args", "_kwargs", "_txn")

    def __init__(self, env: Any, file: MappedFile, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self._env, self._file, self._args, self._kwargs = env, file, args, kwargs
        self._txn: Any = None

    def __enter__(self) -> Any:
        self._file.enter()
        try:
            self._txn = self._env.begin(*self._args, **self._kwargs)
            return self._txn.__enter__()
        except BaseException:
            self._file.leave()
            raise

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        try:
            return bool(self._txn.__exit__(kind, value, tb))
        finally:
            self._file.leave()


class GuardedEnv:
    """A read-only ``lmdb.Environment`` whose every read runs inside
    :meth:`MappedFile.hold`: ``begin`` (used with ``with``) and ``open_db``; the rest
    is the environment's own."""

    def __init__(self, env: Any, file: MappedFile):
        self._env, self.file = env, file

    def begin(self, *args: Any, **kwargs: Any) -> GuardedTxn:
        return GuardedTxn(self._env, self.file, args, kwargs)

    def open_db(self, *args: Any, **kwargs: Any) -> Any:
        with self.file.hold():
            return self._env.open_db(*args, **kwargs)

    def stat(self) -> Any:
        with self.file.hold():
            return self._env.stat()

    def close(self) -> None:
        try:
            self._env.close()
        finally:
            self.file.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def open_mapped(data: Path, **options: Any) -> GuardedEnv:
    """A read-only LMDB environment over the data file ``data`` (a run's
    ``lineage/data.mdb``), mapped no larger than the file and guarded as the module
    docstring says.  ``options`` go to ``lmdb.open`` (``max_dbs``...)."""
    import lmdb
    try:
        file = MappedFile(data)
    except OSError as e:
        raise CorruptLineage(f"cannot open lineage file {data}: {e.strerror or e}") from e
    try:
        env = lmdb.open(file.open_path, map_size=max(1 << 20, file.size), subdir=False,
                        readonly=True, lock=False, readahead=False, **options)
    except lmdb.Error as e:
        said = str(e).replace(f"{file.open_path}: ", "")
        file.close()
        raise CorruptLineage(f"lineage file {data} is damaged: {said}") from e
    except BaseException:
        file.close()
        raise
    return GuardedEnv(env, file)
