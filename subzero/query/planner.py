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


def blocks_spanned(bm: np.ndarray) -> int:
    """``blocks_of`` a boolean bitmap of an array."""
    flat = bm.ravel()
    if flat.size <= KEY_BLOCK:
        return 1
    return int(np.count_nonzero(np.logical_or.reduceat(flat, np.arange(0, flat.size, KEY_BLOCK))))
