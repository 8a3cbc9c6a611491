"""Each array's :class:`~subzero.model.grid.Grid`: stored with it, or derived.

An input keeps the labels and FITS header it was read with; an operator's
output usually does not (operators return plain numpy).  Its grid is derived at
query time by asking each operator on the way from the inputs
(:meth:`~subzero.model.operator.Operator.output_grid`), so runs made before
this existed answer sky and label queries too, and nothing is copied per run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from subzero.errors import QueryError
from subzero.model.grid import Grid, stored_grid, wcs_keywords

__all__ = ["derive_grids", "stored_grid", "wcs_keywords", "with_grid"]

if TYPE_CHECKING:
    import xarray as xr

def with_grid(da: xr.DataArray, g: Grid | None) -> xr.DataArray:
    """``da`` labelled by grid ``g``: its dims renamed to the grid's (unless that would
    clash), the grid's labels added where ``da`` has none, its WCS cards added to the
    attrs ``da`` lacks.  How a stored array (or a mask over it) gets the coordinates an
    operator's numpy output did not keep."""
    if g is None:
        return da
    if tuple(da.dims) != g.dims and not set(g.dims) & set(da.dims) - set(g.dims):
        da = da.rename(dict(zip(da.dims, g.dims)))
    missing = {d: (d, np.asarray(v)) for d, v in g.coords.items() if d not in da.coords}
    if missing:
        da = da.assign_coords(missing)
    if g.wcs:
        da.attrs.update({k: v for k, v in g.wcs.items() if k not in da.attrs})
    return da


def derive_grids(producers: Mapping[str, Sequence[str]], shapes: Mapping[str, Sequence[int]],
                 stored: Callable[[str], Grid | None],
                 operator: Callable[[str], Any] | None) -> Callable[[str], Grid | None]:
    """A memoised ``grid(name)``: the array's stored grid, else what its operator's
    ``output_grid`` makes of its inputs' grids.  ``producers`` maps each operator's
    output to its inputs; ``operator(name)`` gives the operator (None: derived grids
    are not available, e.g. for a run whose code is not trusted)."""
    memo: dict[str, Grid | None] = {}
    kept: dict[str, Grid | None] = {}

    def _stored(name: str) -> Grid | None:
        if name not in kept:
            kept[name] = stored(name)
        return kept[name]

    def grid(name: str) -> Grid | None:
        if name in memo:
            return memo[name]
        stack = [name]
        while stack:                      # inputs first, without recursion
            top = stack[-1]
            ins = [i for i in producers.get(top, ()) if i not in memo]
            if top not in memo and operator is not None and ins and _stored(top) is None:
                stack.extend(ins)
                continue
            stack.pop()
            if top not in memo:
                memo[top] = _one(top)
        return memo[name]

    def _one(name: str) -> Grid | None:
        g = _stored(name)
        if g is not None or name not in producers or operator is None:
            return g
        ins = list(producers[name])
        op = operator(name)
        out = op.output_grid([memo.get(i) for i in ins], [tuple(shapes[i]) for i in ins],
                             tuple(shapes[name]))
        return _checked(out, name, tuple(shapes[name]))

    return grid


def _checked(g: Grid | None, name: str, shape: tuple[int, ...]) -> Grid | None:
    if g is None:
        return None
    if not isinstance(g, Grid) or len(g.dims) != len(shape):
        raise QueryError(f"the operator of {name!r} gave a grid of {getattr(g, 'dims', g)!r} "
                         f"for an array of {len(shape)} axes (output_grid must return a Grid or None)")
    for d, n in zip(g.dims, shape):
        if d in g.coords and len(g.coords[d]) != n:
            raise QueryError(f"the operator of {name!r} gave {len(g.coords[d])} labels for axis "
                             f"{d!r} of length {n} (output_grid)")
    return g
