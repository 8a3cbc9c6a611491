"""The query-time planner as the executor sees it: a declared protocol.

Before a step the executor tells the planner what it knows (:class:`StepInfo`)
and the step's methods in the simple rule's order; the planner answers with
the order to try them in and, when the first reads stored lineage, the seconds
after which to give up on it for re-execution.  After the step it observes
what happened (:class:`StepStat`).  The optimizer implements it
(``subzero.optimizer.planner.QueryPlanner``); the core never imports that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from subzero.model.cells import run_starts
from subzero.model.cellset import CellSet
from subzero.query.methods import Method
from subzero.tuning import KEY_BITS

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


@dataclass(frozen=True)
class StepInfo:
    """What a query-time planner knows about a step before it runs."""

    op: str
    input: int
    backward: bool
    cells_in: int
    blocks_in: int              # distinct 2**KEY_BITS-cell blocks of the input cells
    loaded: bool                # the operator's inputs are already in memory (re-execution)
    #: the share of the operator's tiles a re-execution would run: tile-parallel operators
    #: re-run only the tiles the query touches (1.0: a whole re-run)
    tiles: float = 1.0
    #: runs of consecutive cells along the last axis: the probes an R-tree lookup makes
    runs_in: int = 0


class Planner(Protocol):
    """Orders a step's methods by predicted cost and learns from observed steps."""

    def plan(self, step: StepInfo,
             methods: Sequence[Method]) -> tuple[Sequence[Method], float | None]:
        """The methods to try, in order, and the seconds a stored read first in that
        order may take before the step switches to re-execution (None: no limit)."""
        ...

    def observe(self, stat: StepStat) -> None:
        """A step that ran (not the empty and all-to-all ones)."""
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
