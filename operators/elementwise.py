"""Elementwise operators: unary functions, array-scalar arithmetic, thresholds,
and binary arithmetic / comparisons.

Output cell c depends on cell c of every input.  Binary operators can also
broadcast (``broadcast="scalar"``: the second input holds one cell and every
output cell depends on it, so that input is declared all-to-all;
``broadcast="numpy"``: general numpy broadcasting, mapped exactly).
With ``"scalar"`` they still run per tile (every tile reads the one cell
whole); with ``"numpy"`` they declare global tiling: a tile of the output is
not computed from the same tile of every input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from subzero import ELEMENTWISE, GLOBAL

from .base import MappedOperator, Shape, grid_product

BROADCASTS = ("none", "scalar", "numpy")


def broadcast_backward(cells: np.ndarray, in_shape: Shape, out_shape: Shape) -> np.ndarray:
    """The input cell each output cell reads under numpy broadcasting (1:1)."""
    if tuple(in_shape) == tuple(out_shape):
        return cells
    c = cells[:, len(out_shape) - len(in_shape):]
    return np.where(np.asarray(in_shape) == 1, 0, c)


def broadcast_forward(cells: np.ndarray, in_shape: Shape, out_shape: Shape) -> np.ndarray:
    """Every output cell that reads the given input cells under numpy broadcasting."""
    if tuple(in_shape) == tuple(out_shape):
        return cells
    nd, lead = len(out_shape), len(out_shape) - len(in_shape)
    free = [d for d in range(nd) if d < lead or (in_shape[d - lead] == 1 and out_shape[d] != 1)]
    fixed = [d for d in range(lead, nd) if d not in free]
    out, _ = grid_product(cells[:, [d - lead for d in fixed]], free,
                          [out_shape[d] for d in free], nd, fixed)
    return out


def _resolve(op: Any, func: Callable | None, what: str) -> Callable:
    """The function an operator applies: the one passed in, else its class's default."""
    if func is None:
        func = getattr(type(op), "func", None)
    if func is None:
        raise TypeError(f"{type(op).__name__} needs {what}")
    return func


class Elementwise(MappedOperator):
    """Base of the cell-to-same-cell operators (with optional broadcasting)."""

    tiling = ELEMENTWISE
    broadcast = "none"

    def _set_broadcast(self, broadcast: str) -> None:
        if broadcast not in BROADCASTS:
            raise ValueError(f"{type(self).__name__}: broadcast must be one of "
                             f"{', '.join(BROADCASTS)}, not {broadcast!r}")
        self.broadcast = broadcast
        if broadcast == "numpy":
            self.tiling = GLOBAL     # a tile of the output is not a tile of every input
        # "scalar": the one-cell input is read whole by every tile (see capture.tiles)
        if broadcast == "scalar":
            if self.arity is None:
                raise TypeError(f"{type(self).__name__}: broadcast='scalar' needs a fixed number "
                                f"of inputs (arity)")
            self.all_to_all = (False,) * (self.arity - 1) + (True,)

    def check_shapes(self, *shapes: Shape) -> Shape:
        """The output shape, or a ValueError saying which broadcast to ask for."""
        name = type(self).__name__
        given = [tuple(s) for s in shapes]        # as tuples, in a list as the messages show
        if self.broadcast == "none":
            if any(s != given[0] for s in given):
                raise ValueError(f"{name}: input shapes {given} differ; pass broadcast='scalar' "
                                 f"(second input is one cell) or broadcast='numpy'")
            return given[0]
        if self.broadcast == "scalar":
            *front, last = given
            if int(np.prod(last)) != 1 or any(s != front[0] for s in front) \
                    or len(last) > len(front[0]):
                raise ValueError(f"{name}: broadcast='scalar' needs equal shapes and a one-cell "
                                 f"last input of at most {len(front[0])} dimensions, got {given}")
            return front[0]
        try:
            return tuple(np.broadcast_shapes(*given))
        except ValueError as err:
            raise ValueError(f"{name}: input shapes {given} do not broadcast") from err

    def output_shape(self, *input_shapes):
        return self.check_shapes(*input_shapes)

    def backward(self, cells, i, ctx):
        return broadcast_backward(cells, ctx.input_shape(i), ctx.output_shape), None

    def forward(self, cells, i, ctx):
        return broadcast_forward(cells, ctx.input_shape(i), ctx.output_shape)

    def map_b_bitmap(self, bitmap, i, ctx):
        """Same shapes: the relation is the identity, so the mask passes through."""
        if tuple(ctx.input_shape(i)) == tuple(ctx.output_shape) == bitmap.shape:
            return bitmap
        return NotImplemented

    def map_f_bitmap(self, bitmap, i, ctx):
        if tuple(ctx.input_shape(i)) == tuple(ctx.output_shape) == bitmap.shape:
            return bitmap
        return NotImplemented


# -- one input ---------------------------------------------------------------------

class Unary(Elementwise):
    """``func(x, *args, **kwargs)`` for an elementwise ``func`` (a numpy ufunc,
    ``np.clip``, or any callable that maps each cell on its own)."""

    arity = 1
    func: Callable           # a subclass's default (``Abs``...), else the one passed in

    def __init__(self, func: Callable | None = None, *args: Any, **kwargs: Any):
        self.func = _resolve(self, func, "an elementwise function")
        self.args, self.kwargs = args, kwargs

    def _apply(self, x):
        return self.func(x, *self.args, **self.kwargs)

    def compute(self, x):
        out = np.asarray(self._apply(x))
        if out.shape != x.shape:
            raise ValueError(f"{type(self).__name__}: {getattr(self.func, '__name__', self.func)} "
                             f"is not elementwise: shape {x.shape} became {out.shape}")
        return out


class Abs(Unary):
    """|x|."""
    func = staticmethod(np.abs)


class Negative(Unary):
    """-x."""
    func = staticmethod(np.negative)


class Sqrt(Unary):
    """sqrt(x)."""
    func = staticmethod(np.sqrt)


class Exp(Unary):
    """exp(x)."""
    func = staticmethod(np.exp)


class Log(Unary):
    """natural log(x)."""
    func = staticmethod(np.log)


class Clip(Unary):
    """x clipped to [lo, hi]."""

    def __init__(self, lo: float | None = None, hi: float | None = None):
        super().__init__(np.clip, lo, hi)


class ScalarOp(Unary):
    """``func(x, value)`` — an array with a Python scalar (``reverse``: ``func(value, x)``)."""

    def __init__(self, func: Callable, value: Any, reverse: bool = False):
        super().__init__(func)
        self.value, self.reverse = value, reverse

    def _apply(self, x):
        return self.func(self.value, x) if self.reverse else self.func(x, self.value)


_COMPARE = {"gt": np.greater, ">": np.greater, "ge": np.greater_equal, ">=": np.greater_equal,
            "lt": np.less, "<": np.less, "le": np.less_equal, "<=": np.less_equal,
            "eq": np.equal, "==": np.equal, "ne": np.not_equal, "!=": np.not_equal}


class Threshold(ScalarOp):
    """``x > value`` (or another comparison) as a bool array, or as ``dtype``."""

    def __init__(self, value: float, op: str = "gt", dtype: Any = bool):
        if op not in _COMPARE:
            raise ValueError(f"Threshold: unknown comparison {op!r}; use one of {', '.join(_COMPARE)}")
        super().__init__(_COMPARE[op], value)
        self.op, self.dtype = op, np.dtype(dtype)

    def compute(self, x):
        return super().compute(x).astype(self.dtype, copy=False)


# -- two inputs ------------------------------------------------------------------

class Binary(Elementwise):
    """``func(a, b)`` cell by cell.  ``broadcast``: ``"none"`` (equal shapes),
    ``"scalar"`` (b is one cell, all-to-all) or ``"numpy"``."""

    arity = 2
    func: Callable           # a subclass's default (``Add``...), else the one passed in

    def __init__(self, func: Callable | None = None, broadcast: str = "none"):
        self.func = _resolve(self, func, "a binary elementwise function")
        self._set_broadcast(broadcast)

    def compute(self, a, b):
        shape = self.check_shapes(a.shape, b.shape)
        out = np.asarray(self.func(a, b))
        if out.shape != shape:
            raise ValueError(f"{type(self).__name__}: {getattr(self.func, '__name__', self.func)} "
                             f"is not elementwise: expected shape {shape}, got {out.shape}")
        return out


class Add(Binary):
    """a + b."""
    func = staticmethod(np.add)


class Sub(Binary):
    """a - b."""
    func = staticmethod(np.subtract)


class Mul(Binary):
    """a * b."""
    func = staticmethod(np.multiply)


class Div(Binary):
    """a / b (true division)."""
    func = staticmethod(np.true_divide)


class Pow(Binary):
    """a ** b."""
    func = staticmethod(np.power)


class Minimum(Binary):
    """min(a, b) cell by cell (NaN propagates)."""
    func = staticmethod(np.minimum)


class Maximum(Binary):
    """max(a, b) cell by cell (NaN propagates)."""
    func = staticmethod(np.maximum)


class Lt(Binary):
    """a < b."""
    func = staticmethod(np.less)


class Le(Binary):
    """a <= b."""
    func = staticmethod(np.less_equal)


class Gt(Binary):
    """a > b."""
    func = staticmethod(np.greater)


class Ge(Binary):
    """a >= b."""
    func = staticmethod(np.greater_equal)


class Eq(Binary):
    """a == b."""
    func = staticmethod(np.equal)


class Ne(Binary):
    """a != b."""
    func = staticmethod(np.not_equal)
