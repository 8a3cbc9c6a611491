"""A trace's options and its answer, as values.

The options of one query travel down to every step as a :class:`TraceOptions`
value, so an executor (shared by every query of a run) holds no per-query state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from subzero.errors import QueryError
from subzero.model.cells import cells_from_bitmap
from subzero.query.planner import Planner, StepStat


@dataclass(frozen=True)
class TraceOptions:
    """``prefer``: a method every step uses when it can ("map", "reexec" or a strategy
    spec); ``shortcut``: operators declared all-to-all on an input answer with the
    whole array; ``planner``: prices each step's methods (ignored with ``prefer``)."""

    prefer: str | None = None
    shortcut: bool = True
    planner: Planner | None = None

    @property
    def pricing(self) -> Planner | None:
        """The planner the steps consult: none when a method is forced."""
        return None if self.prefer else self.planner


@dataclass
class TraceResult:
    """Cells of ``target`` reached from ``cells`` of ``start``."""

    run_id: int
    start: str
    target: str
    direction: str
    bitmap: np.ndarray
    steps: list[StepStat]
    seconds: float
    _values: Callable[[], object] | None = field(default=None, repr=False)

    @property
    def cells(self) -> np.ndarray:
        return cells_from_bitmap(self.bitmap)

    @property
    def values(self) -> np.ndarray:
        """Values of the target array at the result cells (same order as ``cells``)."""
        if self._values is None:
            raise QueryError("this trace result carries no array values")
        arr = np.asarray(self._values())
        return arr[self.bitmap]

    def __len__(self) -> int:
        return int(np.count_nonzero(self.bitmap))
