"""Structural operators: they move cells around without mixing values
(slice, subarray, subsample, concatenate, transpose, pad) or they merge whole
blocks (rebin).  Lineage is exact coordinate arithmetic.

Concatenation is *not* all-to-all: a cell of input 1 lands in one place of
the output, and an output cell reads from exactly one input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from subzero.model.cells import box
from subzero.model.operator import GATHER

from .base import MappedOperator, Shape, emit_full, rows
from .boundary import Neighbourhood, mode_from_numpy


def _per_axis(value, ndim: int, what: str) -> np.ndarray:
    a = np.asarray(value, np.int64)
    if a.ndim == 0:
        return np.full(ndim, int(a), np.int64)
    if a.shape != (ndim,):
        raise ValueError(f"{what} has {a.size} entries but the array has {ndim} dimensions")
    return a


# -- slicing ------------------------------------------------------------------------

class Slice(MappedOperator):
    """``x[key]`` for a key of slices (any start/stop/step, negative steps too)
    and integers (which drop their axis), e.g. ``Slice(np.s_[1:4, ::-2])``.
    Axes beyond the key are kept whole.

    Tiles as a gather: a tile of the output reads only the box of the input
    its cells come from (:meth:`input_box`), so no task holds the whole input."""

    tiling = GATHER

    def __init__(self, key: Any):
        key = key if isinstance(key, tuple) else (key,)
        for k in key:
            if not isinstance(k, (slice, int, np.integer)):
                raise TypeError(f"Slice: key entries must be slices or integers, got {k!r}")
        self.key = tuple(int(k) if isinstance(k, np.integer) else k for k in key)

    def _key(self, ndim: int) -> tuple:
        if len(self.key) > ndim:
            raise ValueError(f"{type(self).__name__}: key {self.key} has {len(self.key)} entries "
                             f"for a {ndim}-dimensional array")
        return self.key + (slice(None),) * (ndim - len(self.key))

    def _plan(self, shape: Shape):
        """Per input axis: start, step, length; and the axes the output keeps."""
        start, step, length, kept = [], [], [], []
        for d, (k, n) in enumerate(zip(self._key(len(shape)), shape)):
            if isinstance(k, slice):
                a, b, s = k.indices(n)
                start.append(a)
                step.append(s)
                length.append(len(range(a, b, s)))
                kept.append(d)
            else:
                if not -n <= k < n:
                    raise IndexError(f"{type(self).__name__}: index {k} is outside axis {d} "
                                     f"of length {n}")
                start.append(k % n)
                step.append(1)
                length.append(1)
        return (np.array(start, np.int64), np.array(step, np.int64),
                np.array(length, np.int64), kept)

    def output_shape(self, shape):
        _, _, length, kept = self._plan(shape)
        return tuple(int(length[d]) for d in kept) or (1,)

    def output_grid(self, grids, input_shapes, output_shape):
        if grids[0] is None:
            return None
        start, step, length, kept = self._plan(tuple(input_shapes[0]))
        return grids[0].sliced(start.tolist(), step.tolist(), length.tolist(), kept) if kept else None

    def compute(self, x):
        return x[self._key(x.ndim)].reshape(self.output_shape(x.shape))

    # -- per output tile -------------------------------------------------------------
    def _indices(self, out_box, in_shape) -> list[np.ndarray]:
        """Per input axis, the input index of each output index in ``out_box``."""
        start, step, _, kept = self._plan(tuple(in_shape))
        rng = dict(zip(kept, out_box))
        return [start[d] + np.arange(*rng[d], dtype=np.int64) * step[d] if d in rng
                else np.array([start[d]], np.int64) for d in range(len(in_shape))]

    def input_box(self, out_box, in_shape):
        """The box (``(lo, hi)`` per axis) of the input that the output box reads."""
        return tuple((int(i.min()), int(i.max()) + 1) if i.size else (0, 0)
                     for i in self._indices(out_box, in_shape))

    def gather(self, block, box, out_box, in_shape):
        """The output over ``out_box`` from ``block``, the input over ``box``."""
        idx = [i - lo for i, (lo, _) in zip(self._indices(out_box, in_shape), box)]
        return np.asarray(block)[np.ix_(*idx)].reshape(tuple(b - a for a, b in out_box))

    def emit_tile(self, ctx, out_box) -> None:
        """Full lineage of the output cells in ``out_box`` (array coordinates)."""
        emit_full(self, ctx, out_box)

    def backward(self, cells, i, ctx):
        shape = ctx.input_shape(0)
        start, step, _, kept = self._plan(shape)
        full = np.zeros((len(cells), len(shape)), np.int64)
        if kept:
            full[:, kept] = cells
        return start + full * step, None

    def forward(self, cells, i, ctx):
        start, step, length, kept = self._plan(ctx.input_shape(0))
        q = cells - start
        pos = q // step
        ok = np.all((q % step == 0) & (pos >= 0) & (pos < length), axis=1)
        pos = pos[ok]
        return pos[:, kept] if kept else np.zeros((len(pos), 1), np.int64)


class Subarray(Slice):
    """The half-open box ``[lo, hi)`` (SciDB ``subarray``)."""

    def __init__(self, lo: Sequence[int], hi: Sequence[int]):
        if len(lo) != len(hi):
            raise ValueError(f"Subarray: lo {tuple(lo)} and hi {tuple(hi)} differ in length")
        super().__init__(tuple(slice(int(a), int(b)) for a, b in zip(lo, hi)))


class Subsample(Slice):
    """Every ``step``-th cell along each axis, starting at ``offset`` (int or per axis)."""

    def __init__(self, step: int | Sequence[int], offset: int | Sequence[int] = 0):
        self.step, self.offset = step, offset
        self.key = ()

    def _key(self, ndim):
        st = _per_axis(self.step, ndim, "Subsample step")
        of = _per_axis(self.offset, ndim, "Subsample offset")
        if np.any(st <= 0) or np.any(of < 0):
            raise ValueError(f"Subsample: steps must be positive and offsets non-negative, "
                             f"got step={self.step}, offset={self.offset}")
        return tuple(slice(int(o), None, int(s)) for o, s in zip(of, st))


# -- concatenation -------------------------------------------------------------------

class Concat(MappedOperator):
    """Concatenate any number of inputs along ``axis``."""

    arity = None

    def __init__(self, axis: int = 0):
        self.axis = axis

    def _axis(self, ndim: int) -> int:
        if not -ndim <= self.axis < ndim:
            raise ValueError(f"Concat: axis {self.axis} is out of range for {ndim} dimensions")
        return self.axis % ndim

    def output_shape(self, *shapes):
        ax = self._axis(len(shapes[0]))
        for s in shapes[1:]:
            if len(s) != len(shapes[0]) or any(a != b for d, (a, b) in enumerate(zip(s, shapes[0]))
                                               if d != ax):
                raise ValueError(f"Concat: input shapes {[tuple(x) for x in shapes]} differ off "
                                 f"axis {ax}")
        out = list(shapes[0])
        out[ax] = sum(s[ax] for s in shapes)
        return tuple(out)

    def output_grid(self, grids, input_shapes, output_shape):
        return None     # the inputs' grids need not continue one another

    def compute(self, *arrays):
        self.output_shape(*[a.shape for a in arrays])
        return np.concatenate(arrays, axis=self._axis(arrays[0].ndim))

    def _start(self, i: int, ctx) -> tuple[int, int, int]:
        ax = self._axis(len(ctx.output_shape))
        start = sum(ctx.input_shape(k)[ax] for k in range(i))
        return ax, start, ctx.input_shape(i)[ax]

    def backward(self, cells, i, ctx):
        ax, start, n = self._start(i, ctx)
        sel = np.flatnonzero((cells[:, ax] >= start) & (cells[:, ax] < start + n))
        out = cells[sel].copy()
        out[:, ax] -= start
        return out, sel

    def forward(self, cells, i, ctx):
        ax, start, _ = self._start(i, ctx)
        out = cells.copy()
        out[:, ax] += start
        return out


# -- axis permutation -------------------------------------------------------------------

class Transpose(MappedOperator):
    """``x.transpose(axes)``; ``axes=None`` reverses the axes."""

    def __init__(self, axes: Sequence[int] | None = None):
        self.axes = None if axes is None else tuple(int(a) for a in axes)

    def _axes(self, ndim: int) -> list[int]:
        if self.axes is None:
            return list(range(ndim))[::-1]
        axes = [a % ndim if -ndim <= a < ndim else -1 for a in self.axes]
        if sorted(axes) != list(range(ndim)):
            raise ValueError(f"Transpose: axes {self.axes} are not a permutation of {ndim} axes")
        return axes

    def output_shape(self, shape):
        return tuple(shape[a] for a in self._axes(len(shape)))

    def compute(self, x):
        return x.transpose(self._axes(x.ndim))

    def output_grid(self, grids, input_shapes, output_shape):
        return None if grids[0] is None else grids[0].transposed(self._axes(len(input_shapes[0])))

    def backward(self, cells, i, ctx):
        out = np.empty_like(cells)
        out[:, self._axes(cells.shape[1])] = cells
        return out, None

    def forward(self, cells, i, ctx):
        return cells[:, self._axes(cells.shape[1])]


# -- padding -----------------------------------------------------------------------------

class Pad(MappedOperator):
    """``numpy.pad(x, pad_width, mode)`` for modes constant, edge, reflect,
    symmetric and wrap: a padded cell depends on the input cell it copies."""

    def __init__(self, pad_width: Any, mode: str = "constant", constant_values: Any = 0):
        self.pad_width, self.mode, self.constant_values = pad_width, mode, constant_values
        self._edge = mode_from_numpy(mode)

    def _widths(self, ndim: int) -> np.ndarray:
        w = np.broadcast_to(np.asarray(self.pad_width, np.int64), (ndim, 2))
        if np.any(w < 0):
            raise ValueError(f"Pad: negative pad width in {self.pad_width!r}")
        return w

    def output_shape(self, shape):
        return tuple(int(n + a + b) for n, (a, b) in zip(shape, self._widths(len(shape))))

    def compute(self, x):
        kw = {"constant_values": self.constant_values} if self.mode == "constant" else {}
        # mode: a str checked by mode_from_numpy; numpy's stubs want their Literal of modes
        return np.pad(x, self._widths(x.ndim), mode=self.mode, **kw)  # type: ignore[call-overload]

    def output_grid(self, grids, input_shapes, output_shape):
        if grids[0] is None:
            return None
        return grids[0].shifted(self._widths(len(input_shapes[0]))[:, 0].tolist())

    def _rel(self, ndim: int) -> Neighbourhood:
        return Neighbourhood(-self._widths(ndim)[:, 0][None, :], self._edge)

    def backward(self, cells, i, ctx):
        return self._rel(cells.shape[1]).backward(cells, ctx.input_shape(0))

    def forward(self, cells, i, ctx):
        return self._rel(cells.shape[1]).forward(cells, ctx.input_shape(0), ctx.output_shape)


# -- block rebinning -------------------------------------------------------------------------

_REBIN = {"sum": np.add, "mean": np.add, "min": np.minimum, "max": np.maximum}


class Rebin(MappedOperator):
    """Merge blocks of ``factor`` cells (int or per axis) with ``func`` — sum,
    mean, min or max (SciDB ``regrid``).  A partial block at the end of an
    axis is kept and reduces the cells it has."""

    def __init__(self, factor: int | Sequence[int], func: str = "sum"):
        if func not in _REBIN:
            raise ValueError(f"Rebin: func must be one of {', '.join(_REBIN)}, not {func!r}")
        self.factor, self.func = factor, func

    def _factor(self, ndim: int) -> np.ndarray:
        f = _per_axis(self.factor, ndim, "Rebin factor")
        if np.any(f <= 0):
            raise ValueError(f"Rebin: factors must be positive, got {self.factor}")
        return f

    def output_grid(self, grids, input_shapes, output_shape):
        return None     # a block's labels and sky position are not one input cell's

    def output_shape(self, shape):
        f = self._factor(len(shape))
        return tuple(int(-(-n // b)) for n, b in zip(shape, f))

    def compute(self, x):
        f = self._factor(x.ndim)
        out = x.astype(float) if self.func == "mean" else x
        if self.func == "sum" and x.dtype == bool:
            out = x.astype(np.int64)               # np.add on bools would be a logical or
        count = np.ones((1,) * x.ndim)
        for d, b in enumerate(f):
            starts = np.arange(0, x.shape[d], b)
            out = _REBIN[self.func].reduceat(out, starts, axis=d)
            shape = [1] * x.ndim
            shape[d] = len(starts)
            count = count * np.diff(np.append(starts, x.shape[d])).reshape(shape)
        return out / count if self.func == "mean" else out

    def backward(self, cells, i, ctx):
        shape = np.asarray(ctx.input_shape(0), np.int64)
        f = self._factor(len(shape))
        block = box((0,) * len(f), tuple(f))
        v = (cells * f)[:, None, :] + block[None, :, :]
        ok = np.all(v < shape, axis=2).ravel()
        return v.reshape(-1, len(f))[ok], rows(len(cells), len(block))[ok]

    def forward(self, cells, i, ctx):
        return cells // self._factor(cells.shape[1])
