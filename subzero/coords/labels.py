"""Label selections (``time=2020-01-03``, ``lat=10:20``) to cells, and back.

Selections follow xarray's ``.sel``: a slice of labels includes both ends; a
single label must match exactly, except on numeric and time axes where the
nearest label is taken (within one step of the axis's ends, not beyond).
Axes not named are taken whole, so a selection is always a box of cells.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from subzero.errors import QueryError
from subzero.model.cells import box
from subzero.model.grid import Grid

if TYPE_CHECKING:
    import pandas as pd


def parse_sel(items: Iterable[str]) -> dict[str, Any]:
    """``["time=2020-01-03", "lat=10:20"]`` -> ``{"time": "2020-01-03", "lat": slice("10", "20")}``
    (labels stay text until the axis says what they are)."""
    out: dict[str, Any] = {}
    for item in items:
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value:
            raise QueryError(f"cannot read selection {item!r}: write NAME=LABEL or NAME=FROM:TO, "
                             f"e.g. time=2020-01-03 or lat=10:20")
        if name in out:
            raise QueryError(f"coordinate {name!r} is selected twice")
        if ":" in value and not _looks_like_time(value):
            a, _, b = value.partition(":")
            out[name] = slice(a.strip() or None, b.strip() or None)
        else:
            out[name] = value
    return out


def _looks_like_time(text: str) -> bool:
    """``2020-01-03T12:00`` holds a colon but is one label, not a range."""
    return "T" in text and text[:4].isdigit() and text.count("-") >= 2 and ".." not in text


def cells_for(grid: Grid | None, shape: Sequence[int], sel: Mapping[str, Any], array: str) -> np.ndarray:
    """The box of cells a label selection names."""
    if not sel:
        raise QueryError("an empty label selection names no cells")
    dims = grid.dims if grid is not None else ()
    lo, hi = [0] * len(shape), [int(n) for n in shape]
    for name, want in sel.items():
        if name not in dims:
            labelled = [d for d in dims if grid is not None and d in grid.coords]
            raise QueryError(f"array {array!r} has no coordinate {name!r}; its axes are "
                             f"{', '.join(dims) or 'unnamed'}"
                             f"{' (labelled: ' + ', '.join(labelled) + ')' if labelled else ' (none labelled)'}")
        assert grid is not None
        d = dims.index(name)
        if name not in grid.coords:
            raise QueryError(f"axis {name!r} of array {array!r} has no labels to select by; "
                             f"use `cells` with indices")
        import pandas as pd  # labels only: pandas costs a trace by index nothing
        index = pd.Index(np.asarray(grid.coords[name]))
        a, b = _positions(index, want, name, array)
        lo[d], hi[d] = a, b
    return box(lo, hi)


def _positions(index: pd.Index, want, name: str, array: str) -> tuple[int, int]:
    if isinstance(want, slice):
        if want.step is not None:
            raise QueryError(f"selection of {name!r}: label slices take no step")
        start, stop = (_typed(index, v, name) if v is not None else None for v in (want.start, want.stop))
        if not (index.is_monotonic_increasing or index.is_monotonic_decreasing):
            raise QueryError(f"coordinate {name!r} of array {array!r} is not sorted: select "
                             f"single labels, not ranges")
        try:
            s = index.slice_indexer(start, stop)
        except (KeyError, TypeError) as e:
            raise QueryError(f"cannot select {name}={_show(want)} in array {array!r}: {e}") from e
        a, b, _ = s.indices(len(index))
        if a >= b:
            raise QueryError(f"{name}={_show(want)} selects no cells of array {array!r} "
                             f"(its {name} runs {_show_label(index[0])}..{_show_label(index[-1])})")
        return a, b
    value = _typed(index, want, name)
    hits = np.flatnonzero(index == value)
    if len(hits):
        return int(hits[0]), int(hits[0]) + 1
    numeric = index.dtype.kind in "iufmM"
    if not numeric or not (index.is_monotonic_increasing or index.is_monotonic_decreasing):
        sample = ", ".join(_show_label(v) for v in index[:5])
        raise QueryError(f"array {array!r} has no {name} label {want!r} (its labels: {sample}"
                         f"{', ...' if len(index) > 5 else ''})")
    k = int(index.get_indexer([value], method="nearest")[0])
    step = abs(index[1] - index[0]) * (1 + 1e-9) if len(index) > 1 else None   # float slack
    lo, hi = min(index[0], index[-1]), max(index[0], index[-1])
    if step is not None and (value < lo - step or value > hi + step):
        raise QueryError(f"{name}={want} is outside array {array!r} "
                         f"(its {name} runs {_show_label(index[0])}..{_show_label(index[-1])})")
    return k, k + 1


def _typed(index: pd.Index, value, name: str):
    """A label in the axis's own type (text from the command line becomes a number
    or a time where the axis holds those)."""
    if not isinstance(value, str):
        return value
    import pandas as pd
    kind = index.dtype.kind
    typed: Any = value
    try:
        if kind in "iuf":
            typed = float(value)
        elif kind == "M":
            typed = pd.Timestamp(value)
        elif kind == "m":
            typed = pd.Timedelta(value)
    except ValueError as err:
        raise QueryError(f"label {value!r} of {name!r} is not a {index.dtype} value") from err
    if kind in "iufmM" and (pd.isna(typed) or (kind in "iuf" and not np.isfinite(typed))):
        # NaN, infinity, NaT: no label is nearest to them
        raise QueryError(f"label {value!r} of {name!r} is not a {index.dtype} value")
    return typed


def label_bounds(grid: Grid | None, lo: Sequence[int], hi: Sequence[int]) -> dict[str, list]:
    """For each labelled axis, the first and last label of the box ``[lo, hi)``."""
    if grid is None:
        return {}
    out = {}
    for d, name in enumerate(grid.dims):
        if name in grid.coords:
            values = np.asarray(grid.coords[name])
            out[name] = [_plain(values[int(lo[d])]), _plain(values[int(hi[d]) - 1])]
    return out


def labels_of(grid: Grid | None, cells: np.ndarray) -> dict[str, list]:
    """For each labelled axis, the distinct labels of ``cells`` (an ``(N, ndim)`` array)
    along it, in the axis's order: the rows of a catalog an answer touches, by label."""
    if grid is None or not len(cells):
        return {}
    out = {}
    for d, name in enumerate(grid.dims):
        if name in grid.coords:
            values = np.asarray(grid.coords[name])
            out[name] = [_plain(v) for v in values[np.unique(cells[:, d])]]
    return out


def _plain(v):
    """A label as JSON-friendly plain data."""
    if isinstance(v, np.datetime64):
        import pandas as pd
        return str(pd.Timestamp(v).isoformat())
    if isinstance(v, np.timedelta64):
        import pandas as pd
        return str(pd.Timedelta(v))
    if isinstance(v, np.generic):
        return v.item()
    return v


def _show_label(v) -> str:
    return str(_plain(np.asarray(v)[()] if not isinstance(v, (str, bytes)) else v))


def _show(s: slice) -> str:
    return f"{s.start if s.start is not None else ''}:{s.stop if s.stop is not None else ''}"
