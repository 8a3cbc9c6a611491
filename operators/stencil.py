"""Stencils: convolution / correlation with any kernel, and sliding-window
filters (mean, median, min, max, or any function), with scipy.ndimage
semantics and edge modes (reflect, mirror, nearest, wrap, constant).

Output cell o depends on the input cells under the footprint placed at o
(kernel entries that are zero are not dependencies), folded back into the
array by the edge mode — see :mod:`operators.boundary`.  Tiling is a stencil
of the footprint's radius, except with ``wrap``: an edge tile then needs the
opposite edge of the array, so the operator declares global tiling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from subzero import GLOBAL, stencil

from .base import MappedOperator
from .boundary import Neighbourhood, check_mode


def _offsets(footprint: np.ndarray, origin) -> np.ndarray:
    """Offsets of the true footprint entries from the cell being computed
    (scipy: the centre is ``size // 2 + origin`` on each axis)."""
    shape = np.asarray(footprint.shape, np.int64)
    org = np.broadcast_to(np.asarray(origin, np.int64), shape.shape)
    if np.any(org < -(shape // 2)) or np.any(org > (shape - 1) // 2):
        raise ValueError(f"origin {origin!r} puts the footprint centre outside a footprint "
                         f"of shape {tuple(footprint.shape)}")
    return np.argwhere(footprint) - (shape // 2 + org)


class Stencil(MappedOperator):
    """Base of the neighbourhood operators: lineage from a footprint and an edge mode."""

    arity = 1

    def __init__(self, size: int | Sequence[int] | None = None, footprint=None,
                 mode: str = "reflect", cval: float = 0.0, origin: int | Sequence[int] = 0):
        if footprint is None and size is None:
            raise ValueError(f"{type(self).__name__}: give a size or a footprint")
        self.size = size
        self.footprint = None if footprint is None else np.asarray(footprint, bool)
        self.mode = check_mode(mode)
        self.cval, self.origin = cval, origin
        template = self._footprint(self._template_ndim())
        r = int(np.abs(_offsets(template, self._origin(template.ndim))).max(initial=0))
        self.tiling = GLOBAL if self.mode == "wrap" else stencil(r)

    def _template_ndim(self) -> int:
        """Dimensions to size the tiling radius by, before any array is seen."""
        if self.footprint is not None:
            return self.footprint.ndim
        for x in (self.size, self.origin):
            if x is not None and np.ndim(x) > 0:
                return len(np.atleast_1d(x))
        return 1

    def _origin(self, ndim: int):
        return np.broadcast_to(np.asarray(self.origin, np.int64), (ndim,))

    def _footprint(self, ndim: int) -> np.ndarray:
        if self.footprint is not None:
            fp = self.footprint
        else:
            fp = np.ones(tuple(np.broadcast_to(np.asarray(self.size, np.int64), (ndim,))), bool)
        if fp.ndim != ndim:
            raise ValueError(f"{type(self).__name__}: footprint has {fp.ndim} dimensions, "
                             f"the array has {ndim}")
        return fp

    def relation(self, ndim: int) -> Neighbourhood:
        fp = self._footprint(ndim)
        return Neighbourhood(_offsets(fp, self._origin(ndim)).reshape(-1, ndim), self.mode)

    def backward(self, cells, i, ctx):
        return self.relation(cells.shape[1]).backward(cells, ctx.input_shape(0))

    def forward(self, cells, i, ctx):
        return self.relation(cells.shape[1]).forward(cells, ctx.input_shape(0), ctx.output_shape)

    def _kw(self) -> dict:
        return {"mode": self.mode, "cval": self.cval, "origin": self.origin}


class Correlate(Stencil):
    """``scipy.ndimage.correlate(x, weights)``."""

    def __init__(self, weights, mode: str = "reflect", cval: float = 0.0,
                 origin: int | Sequence[int] = 0):
        self.weights = np.asarray(weights)
        super().__init__(footprint=self._support(), mode=mode, cval=cval, origin=origin)

    def _support(self) -> np.ndarray:
        return self.weights != 0

    def compute(self, x):
        self._footprint(x.ndim)                               # a clear error on a bad ndim
        from scipy import ndimage  # when filtering: a trace by index needs no scipy
        return ndimage.correlate(x, self.weights, **self._kw())


class Convolve(Correlate):
    """``scipy.ndimage.convolve(x, weights)``: a correlation with the kernel
    flipped and the origin mirrored (as scipy itself computes it)."""

    def __init__(self, weights, mode: str = "reflect", cval: float = 0.0,
                 origin: int | Sequence[int] = 0):
        w = np.asarray(weights)
        self.conv_origin = origin
        org = -np.broadcast_to(np.asarray(origin, np.int64), (w.ndim,))
        org = org - (np.asarray(w.shape) % 2 == 0)          # even sizes shift by one
        super().__init__(w, mode=mode, cval=cval, origin=tuple(int(o) for o in org))

    def _support(self) -> np.ndarray:
        return self.weights[(slice(None, None, -1),) * self.weights.ndim] != 0

    def compute(self, x):
        self._footprint(x.ndim)
        from scipy import ndimage  # when filtering: a trace by index needs no scipy
        return ndimage.convolve(x, self.weights, mode=self.mode, cval=self.cval,
                                origin=self.conv_origin)


_FILTERS = ("mean", "median", "min", "max")


class Filter(Stencil):
    """Sliding-window filter: ``func`` is mean, median, min, max, or a callable
    reducing the window's values to one (``scipy.ndimage.generic_filter``)."""

    def __init__(self, func: str | Callable, size: int | Sequence[int] | None = 3,
                 footprint=None, mode: str = "reflect", cval: float = 0.0,
                 origin: int | Sequence[int] = 0):
        self.func = func
        if isinstance(self.func, str) and self.func not in _FILTERS:
            raise ValueError(f"Filter: func must be one of {', '.join(_FILTERS)} or a callable, "
                             f"not {self.func!r}")
        super().__init__(size=None if footprint is not None else size, footprint=footprint,
                         mode=mode, cval=cval, origin=origin)

    def compute(self, x):
        fp = self._footprint(x.ndim)
        from scipy import ndimage  # when filtering: a trace by index needs no scipy
        kw = self._kw()
        if self.func == "mean":
            # a direct weighted sum per output cell (not uniform_filter's running sums):
            # the result is then bitwise the same whatever tile the cell is computed in
            return ndimage.correlate(x.astype(float), fp / fp.sum(), **kw)
        if self.func == "median":
            return ndimage.median_filter(x, footprint=fp, **kw)
        if self.func == "min":
            return ndimage.minimum_filter(x, footprint=fp, **kw)
        if self.func == "max":
            return ndimage.maximum_filter(x, footprint=fp, **kw)
        return ndimage.generic_filter(x, self.func, footprint=fp, **kw)


class _NamedFilter(Filter):
    func = "mean"

    def __init__(self, size: int | Sequence[int] | None = 3, footprint=None,
                 mode: str = "reflect", cval: float = 0.0, origin: int | Sequence[int] = 0):
        super().__init__(type(self).func, size, footprint, mode, cval, origin)


class MeanFilter(_NamedFilter):
    """Mean over the window (a direct weighted sum per cell: tiling-invariant)."""
    func = "mean"


class MedianFilter(_NamedFilter):
    """Median over the window."""
    func = "median"


class MinFilter(_NamedFilter):
    """Minimum over the window."""
    func = "min"


class MaxFilter(_NamedFilter):
    """Maximum over the window."""
    func = "max"
