"""Reductions: sum, mean, median, min, max, count (or any ``f(x, axis=...)``)
along chosen axes or over the whole array.

A whole-array reduction outputs shape (1,) and is all-to-all: a trace
through it short-cuts to the entire input, and its Full lineage is one pair.
An axis reduction maps each output cell to the line (or slab) it reduces.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from subzero import AGGREGATE

from .base import MappedOperator, grid_product


def _count(x: np.ndarray, axis=None) -> np.ndarray:
    """Cells that hold a value (not NaN), like SciDB ``count``."""
    valid = ~np.isnan(x) if np.issubdtype(x.dtype, np.inexact) else np.ones(x.shape, bool)
    return np.sum(valid, axis=axis)


_FUNCS: dict[str, Callable] = {"sum": np.sum, "mean": np.mean, "median": np.median,
                               "min": np.min, "max": np.max, "count": _count}
_AGGREGABLE = ("sum", "mean", "min", "max", "count")


def exact_sum_state(x: np.ndarray) -> dict:
    """The exact sum of a float array as integers per binary exponent.

    Each value is mantissa x 2**exp with a 53-bit integer mantissa, split in
    two 26-bit halves so that int64 sums over any tile cannot overflow; the
    halves are summed exactly per exponent.  States add up exactly in any
    order, so a sum combined from tiles equals the whole array's sum, bit for
    bit, and :func:`exact_sum_value` rounds it once, correctly.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    special = {"nan": bool(np.isnan(x).any()), "+inf": bool(np.isposinf(x).any()),
               "-inf": bool(np.isneginf(x).any())}
    x = x[np.isfinite(x) & (x != 0)]
    m, e = np.frexp(x)
    mi = np.ldexp(m, 53).astype(np.int64)
    hi = mi >> 26
    lo = mi - (hi << 26)
    order = np.argsort(e, kind="stable")
    es = e[order]
    exps, starts = np.unique(es, return_index=True)
    terms = {}
    if len(exps):
        hs = np.add.reduceat(hi[order], starts)
        ls = np.add.reduceat(lo[order], starts)
        terms = {int(k): (int(h) << 26) + int(l) for k, h, l in zip(exps, hs, ls)}
    return {"terms": terms, **special}


def merge_sum_states(a: dict, b: dict) -> dict:
    terms = dict(a["terms"])
    for k, v in b["terms"].items():
        terms[k] = terms.get(k, 0) + v
    return {"terms": terms, **{f: a[f] or b[f] for f in ("nan", "+inf", "-inf")}}


def exact_sum_value(state: dict) -> float:
    if state["nan"] or (state["+inf"] and state["-inf"]):
        return float("nan")
    if state["+inf"] or state["-inf"]:
        return float("inf") if state["+inf"] else float("-inf")
    if not state["terms"]:
        return 0.0
    low = min(state["terms"])
    total = sum(v << (k - low) for k, v in state["terms"].items())
    return math.ldexp(float(total), low - 53)      # int -> float rounds correctly, once


class Reduce(MappedOperator):
    """Reduce with ``func`` (a name or a callable taking ``axis=``) over ``axis``:
    None for the whole array, an int or a tuple of ints."""

    arity = 1

    def __init__(self, func: str | Callable = "sum", axis: int | Sequence[int] | None = None):
        if isinstance(func, str) and func not in _FUNCS:
            raise ValueError(f"Reduce: func must be one of {', '.join(_FUNCS)} or a callable, "
                             f"not {func!r}")
        self.func = func
        # atleast_1d: one axis or several, as numpy reads them (numpy integers included)
        self.axis = None if axis is None else tuple(int(a) for a in np.atleast_1d(axis))
        self.all_to_all = axis is None
        if axis is None and func in _AGGREGABLE:
            self.tiling = AGGREGATE        # the Spark engine combines per-tile partials

    def _axes(self, ndim: int) -> tuple[list[int], list[int]]:
        """(reduced axes, kept axes) for an ndim-dimensional input."""
        if self.axis is None:
            return list(range(ndim)), []
        axes = sorted({a % ndim for a in self.axis if -ndim <= a < ndim})
        if len(axes) != len(self.axis):
            raise ValueError(f"{type(self).__name__}: axis {self.axis} is out of range or repeated "
                             f"for {ndim} dimensions")
        return axes, [d for d in range(ndim) if d not in axes]

    def output_shape(self, shape):
        _, kept = self._axes(len(shape))
        return tuple(shape[d] for d in kept) or (1,)

    def output_grid(self, grids, input_shapes, output_shape):
        """The kept axes keep their labels (and a sky WCS whose axes are all kept)."""
        _, kept = self._axes(len(input_shapes[0]))
        if grids[0] is None or not kept:
            return None
        n = list(input_shapes[0])
        return grids[0].sliced([0] * len(n), [1] * len(n), n, kept)

    # -- whole-array aggregation: partial per tile, merge, finish ---------------------------
    def partial(self, x) -> dict:
        """Partial result of one tile (sums exact, see :func:`exact_sum_state`)."""
        x = np.asarray(x)
        state = {"count": int(np.asarray(_count(x))), "size": int(x.size),
                 "dtype": str(np.sum(x[:0]).dtype), "in_dtype": str(x.dtype)}
        if self.func in ("sum", "mean"):
            if np.issubdtype(x.dtype, np.inexact):
                state["sum"] = exact_sum_state(x)
            elif x.dtype.itemsize < 8:               # int64 accumulation is exact here
                state["isum"] = int(np.sum(x, dtype=np.int64))
            else:
                state["isum"] = int(np.sum(x.astype(object))) if x.size else 0
        if self.func in ("min", "max"):
            f = np.min if self.func == "min" else np.max
            state["ext"] = f(x) if x.size else None
        return state

    def merge(self, a: dict, b: dict) -> dict:
        out = dict(a, count=a["count"] + b["count"], size=a["size"] + b["size"])
        if "sum" in a:
            out["sum"] = merge_sum_states(a["sum"], b["sum"])
        if "isum" in a:
            out["isum"] = a["isum"] + b["isum"]
        if "ext" in a:
            vals = [v for v in (a["ext"], b["ext"]) if v is not None]
            out["ext"] = None if not vals else (np.minimum if self.func == "min" else np.maximum)(*vals) \
                if len(vals) == 2 else vals[0]
        return out

    def finish(self, state: dict) -> np.ndarray:
        f = self.func
        if f == "count":
            return np.asarray([state["count"]], dtype=np.int64)
        if f in ("min", "max"):
            return np.asarray([state["ext"]], dtype=state["in_dtype"])
        total = exact_sum_value(state["sum"]) if "sum" in state else state["isum"]
        if f == "sum":
            return np.asarray([total], dtype=state["dtype"])
        return np.asarray([total / state["size"]], dtype=np.float64)

    def compute(self, x):
        if self.tiling.kind == "aggregate":          # the same arithmetic as the tiled path
            return self.finish(self.partial(x))
        axes, _ = self._axes(x.ndim)
        f = _FUNCS[self.func] if isinstance(self.func, str) else self.func
        return np.asarray(f(x, axis=tuple(axes))).reshape(self.output_shape(x.shape))

    def backward(self, cells, i, ctx):
        shape = ctx.input_shape(0)
        axes, kept = self._axes(len(shape))
        fixed = cells if kept else cells[:, :0]
        return grid_product(fixed, axes, [shape[d] for d in axes], len(shape), kept)

    def forward(self, cells, i, ctx):
        _, kept = self._axes(cells.shape[1])
        return cells[:, kept] if kept else np.zeros((len(cells), 1), np.int64)


class _Named(Reduce):
    func = "sum"

    def __init__(self, axis: int | Sequence[int] | None = None):
        super().__init__(type(self).func, axis)


class Sum(_Named):
    """Sum."""
    func = "sum"


class Mean(_Named):
    """Arithmetic mean."""
    func = "mean"


class Median(_Named):
    """Median."""
    func = "median"


class Min(_Named):
    """Minimum."""
    func = "min"


class Max(_Named):
    """Maximum."""
    func = "max"


class Count(_Named):
    """Number of cells holding a value (not NaN)."""
    func = "count"
