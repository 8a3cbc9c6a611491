"""A forked child that does one piece of a command's work and leaves its answer in a file.

The profiler prices strategies in children beside the run (``profile.Profiler._fork``),
a plan reads the samples it chose half in a child (``sampleread.Unread.read_all``), and
a run made from its profiling run encodes some of its lineage in one
(:mod:`subzero.runs.ahead`).  All fork the same way, which is what this module does
once: modules a child imports on first use are imported before the fork (a child forked
while another thread imported one would inherit it half made, and its import lock held
by a thread it does not have), buffered output is flushed (a child must not write it
again), and the child gives its inherited heap back before working (every block it
reused from there would first be copied), pickles what it made into ``result`` whole or
not at all, and leaves without running the parent's exit handlers.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from subzero.heap import release


def fork_child(result: Path, work: Callable[[], object], imports: Iterable[str] = ()) -> int | None:
    """Fork a child that runs ``work()`` and pickles what it returns into ``result`` (a
    file that exists only once it is whole: nothing when ``work`` failed or the child
    died); the child's pid, or None when no process could be made.  The caller waits
    for the child (``os.waitpid``) and reads ``result``."""
    for module in imports:                # never inherited half made
        importlib.import_module(module)
    for f in (sys.stdout, sys.stderr):    # nothing buffered is written twice
        try:
            f.flush()
        except Exception:
            pass
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:                          # the child: work, write, leave
        code = 0
        try:
            release()                     # its own pages, not copies of the parent's
            part = result.with_name(result.name + ".part")
            part.write_bytes(pickle.dumps(work()))
            os.replace(part, result)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def cpu_ticks(pid: int) -> tuple[int, bool] | None:
    """(CPU clock ticks used, waiting on the disk) of process ``pid``, or None where
    /proc cannot say: how a parent tells a child that works from one stuck on a lock it
    inherited."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12]), fields[0] == b"D"
    except (OSError, IndexError, ValueError):
        return None


def cores() -> int:
    """The processors this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ChildWatch:
    """Whether a forked child still runs and works: one that has used no CPU time for
    ``stall_s`` seconds while not waiting on the disk is stuck (on a lock it inherited)
    and is killed.  The caller polls :meth:`alive`."""

    def __init__(self, pid: int, stall_s: float):
        self.pid: int | None = pid
        self.stall_s = stall_s
        self._seen: tuple[int, float] | None = None

    def alive(self) -> bool:
        """False once the child has ended (reaped here) or was killed as stuck."""
        if self.pid is None:
            return False
        if os.waitpid(self.pid, os.WNOHANG)[0]:
            self.pid = None
            return False
        if self.stuck():
            self.stop()
            return False
        return True

    def stuck(self) -> bool:
        """Whether the child has used no CPU time for ``stall_s`` seconds while not
        waiting on the disk (as seen by the calls so far); never where /proc cannot say.
        Neither reaps nor kills it (a caller that reaps its children itself asks this)."""
        import time
        seen = cpu_ticks(self.pid) if self.pid is not None else None
        if seen is None:
            return False
        ticks, on_disk = seen
        now = time.monotonic()
        if self._seen is None or ticks != self._seen[0] or on_disk:
            self._seen = (ticks, now)
            return False
        return now - self._seen[1] >= self.stall_s

    def stop(self) -> None:
        """Kill the child if it still runs, and reap it."""
        import signal
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = None
