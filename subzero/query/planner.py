"""The query-time planner as the executor sees it: a declared protocol.

Before a step the executor tells the planner what it knows (:class:`StepInfo`)
and the step's methods in the simple rule's order; the planner answers with
the order to try them in and, when the first reads stored lineage, when to give
up on it for re-execution (a :class:`ReadBudget`).  After the step it observes
what happened (:class:`StepStat`).  The optimizer implements it
(``subzero.optimizer.planner.QueryPlanner``); the core never imports that.

Times a planner sees are the step's own work: first-use costs (imports, opening
the lineage store, a reader, an array) are kept apart (``StepStat.warmup``), a
step that made such a first use met cold caches and is not learnt from
(``StepStat.cold``), and a read's budget is counted in the CPU time of its own
thread, which a busy machine does not stretch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

from subzero.model.cells import run_starts
from subzero.model.cellset import CellSet
from subzero.query.methods import Method
from subzero.tuning import KEY_BITS, MOST_DONE, SWITCH_MARGIN, SWITCH_WORST

KEY_BLOCK = 1 << KEY_BITS


@dataclass
class StepStat:
    """What one trace step did (kept in the catalog's trace log: the cost model
    learns from it).  ``method`` is a method's name, or what re-execution fell back
    to, or ``"empty"`` / ``"all-to-all"``."""

    op: str
    input: int
    direction: str
    method: str
    cells_in: int
    cells_out: int
    seconds: float
    blocks_in: int = 0          # key blocks the input cells span (taken when a planner runs)
    note: str = ""              # e.g. why the planner switched to re-execution
    runs_in: int = 0            # runs of consecutive cells of the input (taken with blocks_in)
    #: CPU seconds of the step's method (this thread's, without the planner's pricing):
    #: what the cost model learns from, since waiting for a busy machine's cores is not
    #: the method's cost
    cpu: float = 0.0
    #: seconds of first-use costs the step waited for (imports, opening the lineage store,
    #: a reader or an array), left out of ``seconds`` and ``cpu``
    warmup: float = 0.0
    #: the stored method given up for re-execution ("" when none) ...
    abandoned: str = ""
    #: ... the CPU seconds it ran first (part of ``cpu``) ...
    abandoned_s: float = 0.0
    #: ... and the share of its work it had done (0: not measured)
    done: float = 0.0
    #: the step made a first use (opened the lineage store, its reader or an array): its
    #: read met cold caches -- pages this process never touched, blocks never decoded --
    #: which cost it more than the method does once they are warm.  Its times are
    #: reported, but neither the planner nor the trace log's corrections learn from them.
    #: Also set on the steps the optimizer measures in a run's own process, whose caches
    #: the run warmed (``optimizer.workloads.measure``)
    cold: bool = False


@dataclass(frozen=True)
class StepInfo:
    """What a query-time planner knows about a step before it runs."""

    op: str
    input: int
    backward: bool
    cells_in: int
    blocks_in: int              # distinct 2**KEY_BITS-cell blocks of the input cells
    loaded: bool                # the operator's inputs are already in memory (re-execution)
    #: the share of the operator's tiles a re-execution would run (:attr:`tiles`), or
    #: what works it out when asked: only pricing a re-execution needs it, and working it
    #: out (the tiling module's import, the operator's tile plan) was 1.7 ms of a fresh
    #: process's first step, which a planner that priced the step's read alone never used
    share: float | Callable[[], float] = 1.0
    #: runs of consecutive cells along the last axis: the probes an R-tree lookup makes
    runs_in: int = 0

    @cached_property
    def tiles(self) -> float:
        """The share of the operator's tiles a re-execution would run: tile-parallel
        operators re-run only the tiles the query touches (1.0: a whole re-run).  Worked
        out once, when first asked."""
        return float(self.share()) if callable(self.share) else float(self.share)


@dataclass(frozen=True)
class ReadBudget:
    """When a stored read should be given up for re-execution.  Counted in CPU seconds
    of the read's own work (its thread's), so a busy machine does not trip it.

    Nothing is given up before ``after`` (the read's pessimistic price: within it the
    model chose well), nor once the read is ``most_done`` through its work.  Past
    ``after`` the read switches when switching costs at most ``worst`` times staying
    whatever is left of it (its time so far is at least ``reexec / (worst - 1)``), or
    when its measured progress says that what is left costs at least ``margin`` times
    ``reexec`` (the pessimistic price of the re-execution a switch runs)."""

    after: float
    reexec: float = 0.0
    worst: float = SWITCH_WORST
    margin: float = SWITCH_MARGIN
    most_done: float = MOST_DONE

    def switch(self, spent: float, done: float | None) -> bool:
        """Whether a read that has run ``spent`` CPU seconds and done the share
        ``done`` of its work (None: not measured yet) should be given up now."""
        if spent < self.after or (done is not None and done >= self.most_done):
            return False
        if spent + self.reexec <= self.worst * spent:
            return True
        if done:
            return spent * (1.0 - done) / done >= self.margin * self.reexec
        return False


def as_budget(budget: ReadBudget | float | None) -> ReadBudget | None:
    """A planner's answer as a budget: a number is the CPU seconds after which the read is
    given up (with nothing else to weigh)."""
    if budget is None or isinstance(budget, ReadBudget):
        return budget
    return ReadBudget(after=float(budget))


class Planner(Protocol):
    """Orders a step's methods by predicted cost and learns from observed steps."""

    def plan(self, step: StepInfo,
             methods: Sequence[Method]) -> tuple[Sequence[Method], ReadBudget | float | None]:
        """The methods to try, in order, and when a stored read first in that order is
        given up for re-execution: a :class:`ReadBudget`, or a number of CPU seconds
        (None: never)."""
        ...

    def observe(self, stat: StepStat) -> None:
        """A step that ran (not the empty and all-to-all ones), a switched one with what
        its abandoned read had cost and done."""
        ...


def blocks_of(q: CellSet) -> int:
    """Distinct key blocks (2**KEY_BITS consecutive cells) a query's cells touch: how
    clustered they are, which decides how many stored blocks a lookup decodes.  Costs
    the cells held, or one pass over a dense set's bitmap."""
    if q.is_entire:
        return -(-q.size // KEY_BLOCK)
    bits = q.dense_bitmap()
    if bits is None:
        return int(np.count_nonzero(run_starts(q.ids() >> KEY_BITS)))
    return blocks_spanned(bits)


def runs_of(q: CellSet) -> int:
    """Runs of consecutive cells along the last axis (a row of a box is one run): the
    probes an R-tree lookup makes, since it asks one box per run.  Costs the cells held,
    or one pass over a dense set's bitmap."""
    if q.is_entire:
        return int(np.prod(q.shape[:-1], dtype=np.int64)) if len(q.shape) > 1 else 1
    last = q.shape[-1] if q.shape else 1
    bits = q.dense_bitmap()
    if bits is None:
        ids = q.ids()
        if ids.size == 0:
            return 0
        return 1 + int(np.count_nonzero((np.diff(ids) != 1) | (ids[1:] % last == 0)))
    b = bits.reshape(-1, last)
    starts = np.count_nonzero(b[:, 1:] & ~b[:, :-1]) if last > 1 else 0
    return int(starts + np.count_nonzero(b[:, 0]))


def blocks_spanned(bm: np.ndarray) -> int:
    """``blocks_of`` a boolean bitmap of an array."""
    flat = bm.ravel()
    if flat.size <= KEY_BLOCK:
        return 1
    return int(np.count_nonzero(np.logical_or.reduceat(flat, np.arange(0, flat.size, KEY_BLOCK))))
