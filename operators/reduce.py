"""Reductions: sum, mean, median, min, max, count (or any ``f(x, axis=...)``)
along chosen axes or over the whole array.

A whole-array reduction outputs shape (1,) and is all-to-all: a trace
through it short-cuts to the entire input, and its Full lineage is one pair.
An axis reduction maps each output cell to the line (or slab) it reduces.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .base import MappedOperator, grid_product


def _count(x: np.ndarray, axis=None) -> np.ndarray:
    """Cells that hold a value (not NaN), like SciDB ``count``."""
    valid = ~np.isnan(x) if np.issubdtype(x.dtype, np.inexact) else np.ones(x.shape, bool)
    return np.sum(valid, axis=axis)


_FUNCS: dict[str, Callable] = {"sum": np.sum, "mean": np.mean, "median": np.median,
                               "min": np.min, "max": np.max, "count": _count}


class Reduce(MappedOperator):
    """Reduce with ``func`` (a name or a callable taking ``axis=``) over ``axis``:
    None for the whole array, an int or a tuple of ints."""

    arity = 1

    def __init__(self, func: str | Callable = "sum", axis: int | Sequence[int] | None = None):
        if isinstance(func, str) and func not in _FUNCS:
            raise ValueError(f"Reduce: func must be one of {', '.join(_FUNCS)} or a callable, "
                             f"not {func!r}")
        self.func = func
        self.axis = None if axis is None else (
            (int(axis),) if np.ndim(axis) == 0 else tuple(int(a) for a in axis))
        self.all_to_all = axis is None

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

    def compute(self, x):
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
