"""A trace's options and its answer, as values.

The options of one query travel down to every step as a :class:`TraceOptions`
value, so an executor (shared by every query of a run) holds no per-query state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from subzero.errors import QueryError
from subzero.model.cellset import CellSet
from subzero.model.grid import Grid
from subzero.query.planner import Planner, StepStat

if TYPE_CHECKING:
    import xarray as xr


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
    """Cells of ``target`` reached from ``cells`` of ``start``.

    ``cellset`` holds them in a form whose cost follows the answer; ``cells`` lists
    them, ``values`` reads only the region of the target array they span, and
    ``bitmap`` (a mask of the whole target array) is built only when asked for."""

    run_id: int
    start: str
    target: str
    direction: str
    cellset: CellSet
    steps: list[StepStat]
    seconds: float
    #: ``_values(region)`` reads a region of the target array (None: all of it)
    _values: Callable[..., object] | None = field(default=None, repr=False)
    #: ``_grid(array)`` gives an array's labels and sky WCS (set by ``Run.trace``)
    _grid: Callable[[str], Grid | None] | None = field(default=None, repr=False)
    #: the start cells of the query (None: not known, e.g. a result built by hand)
    query: CellSet | None = field(default=None, repr=False)
    #: ``_like()`` opens the target array lazily: its dims, coords and attrs, no data read
    _like: Callable[[], xr.DataArray] | None = field(default=None, repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        """The target array's shape."""
        return self.cellset.shape

    @property
    def cells(self) -> np.ndarray:
        """``(N, ndim)`` coordinates of the answer, in C order."""
        return self.cellset.cells()

    @property
    def bitmap(self) -> np.ndarray:
        """A boolean mask of the target array's shape (costs the array's size)."""
        return self.cellset.bitmap()

    @property
    def values(self) -> np.ndarray:
        """Values of the target array at the result cells (same order as ``cells``);
        reads the answer's bounding box, not the whole array."""
        if self._values is None:
            raise QueryError("this trace result carries no array values")
        box = self.cellset.bounds()
        if box is None:
            return np.asarray(self._values(tuple(slice(0, 0) for _ in self.shape))).reshape(-1)
        if self.cellset.is_entire:
            return np.asarray(self._values()).reshape(-1)
        lo, hi = box
        region = np.asarray(self._values(tuple(slice(a, b) for a, b in zip(lo, hi))))
        c = self.cells - np.asarray(lo, np.int64)
        return region[tuple(c.T)]

    def to_xarray(self, name: str | None = None) -> xr.DataArray:
        """The answer as a labelled boolean mask over the target array: True on the
        answer's cells, with the target's dims, coordinates and attrs (a FITS/WCS
        header survives) and ``subzero_*`` attrs describing the query (run, start
        array and cells, direction, each step's method, count).  Costs the target's
        size in memory, as :attr:`bitmap` does; the target's data is not read."""
        from subzero.export.mask import labelled  # the export layer builds it
        return labelled(self, name)

    def __len__(self) -> int:
        return len(self.cellset)

    def _box(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        box = self.cellset.bounds()
        if box is None:
            raise QueryError(f"the trace reached no cells of {self.target!r}, so it has no region")
        return tuple(int(v) for v in box[0]), tuple(int(v) for v in box[1])

    def grid(self) -> Grid | None:
        """The target array's labels and sky WCS (None when it has neither)."""
        if self._grid is None:
            raise QueryError("this trace result does not know its run's coordinates "
                             "(trace through Run.trace)")
        return self._grid(self.target)

    def sky_region(self) -> dict:
        """Where the answer lies on the sky: the centre, corners and RA/Dec ranges (degrees,
        ICRS) of its bounding box.  An error when the target array has no sky WCS."""
        from subzero.coords.sky import footprint
        lo, hi = self._box()
        return footprint(self.grid(), lo, hi, self.target)

    def label_region(self) -> dict[str, list]:
        """For each labelled axis of the target, the first and last label the answer spans."""
        from subzero.coords.labels import label_bounds
        lo, hi = self._box()
        return label_bounds(self.grid(), lo, hi)
