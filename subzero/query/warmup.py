"""First-use costs of a trace, kept apart from the steps that happen to pay them.

The first step that reads stored lineage opens the run's LMDB environment and the
strategy's reader; the first that needs an array imports zarr and opens it.  That
costs from milliseconds to a second on a cold process (a 0.25-1.1 s zarr import was
once charged to a first step), is paid once per executor whatever method runs, and
says nothing about what the method costs.  Charged to the step, it teaches the cost
model that the method is slow and can make the query-time planner give up a read
that was about to finish.  So the executor runs each such piece of work through
:meth:`Warmup.first` and subtracts what it took from the step's wall and CPU time
(``StepStat.warmup`` reports it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

T = TypeVar("T")


class Warmup:
    """Wall and CPU seconds spent on first uses, and which were made already."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu = 0.0
        self._done: set[Hashable] = set()
        self._depth = 0
        #: first uses made that open or load something a read then finds cold (the
        #: lineage store, a reader, an array), as opposed to imports alone
        self.caches = 0

    def first(self, key: Hashable, fn: Callable[[], T], cache: bool = True) -> T:
        """``fn()``, timed as warm-up the first time ``key`` is asked for (later calls
        are the caller's own work: whatever ``fn`` caches is warm by then).  ``cache``:
        the first use opens or loads what the step then reads (counted in ``caches``),
        not only an import."""
        if key not in self._done and cache:
            self.caches += 1
        if key in self._done or self._depth:       # done, or inside a first use timed already
            self._done.add(key)
            return fn()
        t, c = time.perf_counter(), time.thread_time()
        self._depth += 1
        try:
            return fn()
        finally:
            self._depth -= 1
            self._done.add(key)
            self.seconds += time.perf_counter() - t
            self.cpu += time.thread_time() - c

    def forget(self, keys: Iterable[Hashable]) -> None:
        """Count these first uses as not made yet: what they opened was closed, and the
        next use opens it again, as a first use."""
        self._done.difference_update(keys)

    def made(self) -> frozenset[Hashable]:
        """The first uses made so far (their keys): what a step no longer pays."""
        return frozenset(self._done)

    def mark(self) -> tuple[float, float]:
        """The totals so far, to subtract a step's share: ``since(mark())``."""
        return self.seconds, self.cpu

    def since(self, mark: tuple[float, float]) -> tuple[float, float]:
        """Wall and CPU seconds of warm-up since ``mark``."""
        return self.seconds - mark[0], self.cpu - mark[1]


def import_arrays() -> None:
    """The array store's backend, imported (zarr and the codecs it loads lazily on a first
    read): what the first array a trace opens would otherwise wait for."""
    import zarr  # noqa: F401
    import zarr.codecs  # noqa: F401
