"""A trace's options and its answer, as values.

The options of one query travel down to every step as a :class:`TraceOptions`
value, so an executor (shared by every query of a run) holds no per-query state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from subzero.errors import QueryError, warn
from subzero.model.cellset import CellSet, spec
from subzero.model.grid import Grid
from subzero.query.mask import labelled_mask
from subzero.query.planner import Planner, StepStat

if TYPE_CHECKING:
    import xarray as xr

#: ``read(region)``: a region of an array (one slice per axis; None: all of it)
RegionReader = Callable[[tuple[slice, ...] | None], ArrayLike]
#: ``grids(array)``: an array's labels and sky WCS (None when it has neither)
GridLookup = Callable[[str], Grid | None]


#: the method of a step left out because its input is all-to-all (``exclude_all_to_all``)
EXCLUDED = "excluded (all-to-all)"


@dataclass(frozen=True)
class TraceOptions:
    """``prefer``: a method every step uses when it can ("map", "reexec" or a strategy
    spec); ``shortcut``: operators declared all-to-all on an input answer with the
    whole array; ``planner``: prices each step's methods (ignored with ``prefer``);
    ``exclude_all_to_all``: those steps answer nothing."""

    prefer: str | None = None
    shortcut: bool = True
    planner: Planner | None = None
    #: answer without the steps through an input an operator declares all-to-all (an
    #: overscan mean, a global statistic): they bring in every cell of that input
    exclude_all_to_all: bool = False

    @property
    def pricing(self) -> Planner | None:
        """The planner the steps consult: none when a method is forced."""
        return None if self.prefer else self.planner


@dataclass
class TraceResult:
    """Cells of ``target`` reached from ``cells`` of ``start``.

    ``cellset`` holds them in a form whose cost follows the answer; ``cells`` lists
    them, ``values`` reads only the region of the target array they span, and
    ``bitmap`` (a mask of the whole target array) is built only when asked for.

    What the result can reach of its run is given to it: ``read_target``,
    ``grids`` and ``open_target`` (each None for a result built by hand, which
    then answers without them where it can)."""

    run_id: int
    start: str
    target: str
    direction: str
    cellset: CellSet
    steps: list[StepStat]
    seconds: float
    #: ``read_target(region)`` reads a region of the target array (None: all of it)
    read_target: RegionReader | None = field(default=None, repr=False)
    #: ``grids(array)`` gives an array's labels and sky WCS (the run's :meth:`Run.grid
    #: <subzero.api.Run.grid>`)
    grids: GridLookup | None = field(default=None, repr=False)
    #: the start cells of the query (None: not known, e.g. a result built by hand)
    query: CellSet | None = field(default=None, repr=False)
    #: ``open_target()`` opens the target array lazily: its dims, coords and attrs, no data read
    open_target: Callable[[], xr.DataArray] | None = field(default=None, repr=False)
    #: the cells reached without any step through an all-to-all input (None: the same as
    #: the answer, or not known): the rest came only through such steps
    direct: CellSet | None = field(default=None, repr=False)
    #: True when the trace left out the steps through all-to-all inputs (``exclude_all_to_all``)
    excluded_all_to_all: bool = False

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
        read = self.read_target
        if read is None:
            raise QueryError("this trace result carries no array values")
        box = self.cellset.bounds()
        if box is None:
            return np.asarray(read(tuple(slice(0, 0) for _ in self.shape))).reshape(-1)
        if self.cellset.is_entire:
            return np.asarray(read(None)).reshape(-1)
        lo, hi = box
        region = np.asarray(read(tuple(slice(a, b) for a, b in zip(lo, hi))))
        c = self.cells - np.asarray(lo, np.int64)
        return region[tuple(c.T)]

    def to_xarray(self, name: str | None = None) -> xr.DataArray:
        """The answer as a labelled boolean mask over the target array: True on the
        answer's cells, with the target's dims, coordinates and attrs (a FITS/WCS
        header survives) and ``subzero_*`` attrs describing the query (run, start
        array and cells, direction, each step's method, count).  Costs the target's
        size in memory, as :attr:`bitmap` does; the target's data is not read."""
        like = self.open_target() if self.open_target is not None else None
        if like is not None and self.grids is not None:    # labels derived for numpy outputs
            from subzero.coords.grids import with_grid
            like = with_grid(like, self.grids(self.target))
        return labelled_mask(self.cellset, like, name or f"{self.target}_lineage", self.target,
                             self.query_attrs())

    def query_attrs(self) -> dict[str, Any]:
        """What the answer answers, as flat attrs every format can store (str and int):
        the mask's ``subzero_*`` attrs and its ``long_name``."""
        start = spec(self.query) if self.query is not None else "unknown"
        n_start = len(self.query) if self.query is not None else -1
        steps = "; ".join(f"{s.op}:{s.input} {s.direction} {s.method}" for s in self.steps)
        return {
            "long_name": f"cells of {self.target} in the {self.direction} lineage of "
                         f"{start} of {self.start} (SubZero run {self.run_id})",
            "subzero_run": int(self.run_id), "subzero_from": self.start,
            "subzero_cells": start, "subzero_start_count": int(n_start),
            "subzero_to": self.target, "subzero_direction": str(self.direction),
            "subzero_steps": steps, "subzero_count": int(len(self))}

    def __len__(self) -> int:
        return len(self.cellset)

    def _box(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        box = self.cellset.bounds()
        if box is None:
            raise QueryError(f"the trace reached no cells of {self.target!r}, so it has no region")
        return tuple(int(v) for v in box[0]), tuple(int(v) for v in box[1])

    def grid(self) -> Grid | None:
        """The target array's labels and sky WCS (None when it has neither)."""
        if self.grids is None:
            raise QueryError("this trace result does not know its run's coordinates "
                             "(trace through Run.trace)")
        return self.grids(self.target)

    def sky_region(self) -> dict:
        """Where the answer lies on the sky: the centre, corners and RA/Dec ranges (degrees,
        ICRS) of its bounding box.  An error when the target array has no sky WCS."""
        from subzero.coords.sky import footprint
        lo, hi = self._box()
        return footprint(self.grid(), lo, hi, self.target)

    def explain(self) -> dict[str, Any]:
        """Why these cells: how many were reached without a step through an all-to-all
        input (``direct``) and how many only through such steps (``all_to_all_only``,
        with the steps that took them: ``all_to_all_steps``, ``"op:input"``), and the
        steps that widened the answer most (``widest``: op, input, cells in and out;
        each at least doubling it).  Plain data, for people and ``--json``."""
        a2a = [f"{s.op}:{s.input}" for s in self.steps if s.method in ("all-to-all", EXCLUDED)]
        n = len(self)
        direct = n if self.direct is None else len(self.direct)
        widest = sorted((s for s in self.steps if s.method not in ("all-to-all", EXCLUDED, "empty")
                         and s.cells_out >= 2 * max(s.cells_in, 1)),
                        key=lambda s: s.cells_out / max(s.cells_in, 1), reverse=True)[:3]
        return {"count": n, "direct": direct, "all_to_all_only": n - direct,
                "all_to_all_steps": list(dict.fromkeys(a2a)),
                "excluded_all_to_all": self.excluded_all_to_all,
                "widest": [{"op": s.op, "input": s.input, "cells_in": s.cells_in,
                            "cells_out": s.cells_out} for s in widest]}

    def parts(self) -> list[dict[str, Any]]:
        """The answer in the parts that came different ways: the cells reached directly
        and those only through all-to-all steps, each with its count, bounding box
        (half-open) and, where the target has a sky WCS, the sky region of that box --
        so a star's window and a far-away overscan strip are not one box whose centre
        is neither.  One part when every cell came directly."""
        parts = [("direct", self.cellset if self.direct is None else self.direct)]
        if self.direct is not None and len(self.direct) < len(self):
            parts.append(("all-to-all only", self.cellset - self.direct))
        out = []
        for via, cs in parts:
            box = cs.bounds()
            if box is None:
                continue
            lo, hi = tuple(int(v) for v in box[0]), tuple(int(v) for v in box[1])
            d: dict[str, Any] = {"via": via, "count": len(cs), "box": [list(lo), list(hi)]}
            try:
                g = self.grid() if self.grids is not None else None
                if g is not None and g.wcs:
                    from subzero.coords.sky import footprint
                    d["sky"] = footprint(g, lo, hi, self.target)
            except QueryError:
                pass
            out.append(d)
        return out

    def where(self) -> dict[str, Any]:
        """The answer's region in the target's own terms: ``sky`` (RA/Dec of its bounding
        box) when the target has a sky WCS, ``labels`` (first and last label per labelled
        axis) when it has labels; empty for an empty answer.  A grid that cannot be made
        (a user operator's ``output_grid`` is wrong) is a warning: the cells still stand."""
        if not len(self):
            return {}
        try:
            g = self.grid()
        except QueryError as e:
            warn(f"{e}; the answer is given in cells only")
            return {}
        out: dict[str, Any] = {}
        if g is not None and g.wcs:
            try:
                out["sky"] = self.sky_region()
            except QueryError:
                pass            # WCS cards astropy cannot read: the answer stays in cells
        if g is not None and g.coords:
            out["labels"] = self.label_region()
        return out

    def label_region(self) -> dict[str, list]:
        """For each labelled axis of the target, the first and last label the answer spans."""
        from subzero.coords.labels import label_bounds
        lo, hi = self._box()
        return label_bounds(self.grid(), lo, hi)
