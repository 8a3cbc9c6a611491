"""Run functions in forked children, a few at a time, with a timeout each.

``os.fork`` after the imports makes a case cost tens of milliseconds instead of a
new interpreter, and a child that segfaults, aborts or hangs takes only itself
down: the parent sees a signal (``crash``) or kills it at its deadline (``hang``).
A child's stdout and stderr (and ``faulthandler``'s dump on a fatal signal) go to
a log file whose tail is kept for the report.  Its address space is limited, so a
damaged length field that asks for terabytes fails inside the child instead of
pushing the machine into swap.
"""

from __future__ import annotations

import faulthandler
import json
import os
import resource
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: extra address space a child may map beyond what the parent had at the fork
MEMORY_HEADROOM = 2 << 30


@dataclass
class ChildOutcome:
    """How a child ended: ``ok`` (``result`` holds what the function returned),
    ``crash`` (a signal, or an exit without a result) or ``hang`` (killed at its
    deadline)."""

    status: str
    result: dict | None
    detail: str
    seconds: float
    log: str
    cpu: float = 0.0       # the child's user + system CPU seconds


def _vm_size() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_after_fork() -> None:
    """Thread pools made before the fork have no threads in the child: dask's default
    pool (xarray loads Zarr arrays through it) would wait for them forever.  Zarr
    resets its own event loop at a fork."""
    threaded = sys.modules.get("dask.threaded")
    if threaded is not None:
        threaded.default_pool = None
        threaded.pools.clear()
        threaded.pools_lock = threading.Lock()


def _child(fn: Callable[[Any], dict], task: Any, out: Path, log: Path, timeout: float) -> None:
    """The child's whole life: never returns (``os._exit``), whatever happens."""
    code = 3
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        logf = open(2, "w", closefd=False)  # noqa: SIM115 - lives until os._exit
        sys.stdout = sys.stderr = logf
        faulthandler.enable(file=logf)
        # a hang leaves the stacks of every thread in the log just before the kill
        faulthandler.dump_traceback_later(max(0.5, timeout - 1.0), file=logf)
        _reset_after_fork()
        vm = _vm_size()
        if vm:
            resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_HEADROOM, vm + MEMORY_HEADROOM))
        result = fn(task)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.rename(out)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
        finally:
            os._exit(code)


def _tail(path: Path, head: int = 1500, tail: int = 1500) -> str:
    """The start (the error, or faulthandler's "Fatal Python error" line) and the end
    of a child's log."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    if len(data) > head + tail:
        data = data[:head] + b"\n[...]\n" + data[-tail:]
    return data.decode(errors="replace")


def fork_map(tasks: Iterable[Any], fn: Callable[[Any], dict], workdir: Path, jobs: int = 2,
             timeout: float = 20.0,
             on_done: Callable[[Any, ChildOutcome], None] | None = None) -> list[ChildOutcome]:
    """``fn(task)`` for every task, each in a forked child (``jobs`` at once); the
    outcomes in task order.  ``fn`` must return a JSON-able dict."""
    workdir.mkdir(parents=True, exist_ok=True)
    todo = list(enumerate(tasks))
    outcomes: list[ChildOutcome | None] = [None] * len(todo)
    running: dict[int, tuple[int, int, float, Path, Path, Any]] = {}   # fd -> child
    nxt = 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        while nxt < len(todo) or running:
            while nxt < len(todo) and len(running) < jobs:
                k, task = todo[nxt]
                nxt += 1
                out, log = workdir / f"child-{k}.json", workdir / f"child-{k}.log"
                out.unlink(missing_ok=True)
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(r)
                    _child(fn, task, out, log, timeout)
                os.close(w)
                running[r] = (pid, k, time.monotonic(), out, log, task)
            now = time.monotonic()
            wait = max(0.0, min(t0 + timeout for _, _, t0, _, _, _ in running.values()) - now)
            ready, _, _ = select.select(list(running), [], [], wait)
            now = time.monotonic()
            for fd in list(running):
                pid, k, t0, out, log, task = running[fd]
                if fd in ready:
                    _, status, usage = os.wait4(pid, 0)
                    o = _ended(status, out, log, now - t0)
                    o.cpu = usage.ru_utime + usage.ru_stime
                elif now - t0 >= timeout:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    o = ChildOutcome("hang", None, f"no answer after {timeout:.0f} s", now - t0,
                                     _tail(log))
                else:
                    continue
                os.close(fd)
                del running[fd]
                out.unlink(missing_ok=True)
                log.unlink(missing_ok=True)
                outcomes[k] = o
                if on_done is not None:
                    on_done(task, o)
    finally:
        for fd, (pid, *_rest) in running.items():     # interrupted: leave no child behind
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
    return [o for o in outcomes if o is not None]


def _ended(status: int, out: Path, log: Path, seconds: float) -> ChildOutcome:
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        return ChildOutcome("crash", None, f"killed by {sig}", seconds, _tail(log))
    code = os.WEXITSTATUS(status)
    if code == 0 and out.exists():
        return ChildOutcome("ok", json.loads(out.read_text()), "", seconds, "")
    return ChildOutcome("crash", None, f"exited with status {code} and no result", seconds,
                        _tail(log))
