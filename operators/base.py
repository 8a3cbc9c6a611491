"""The common skeleton of the built-in operators.

Every built-in operator's lineage is a relation computed from coordinates
alone, so one base class gives them all three ways to answer a trace:

* Map mode: ``map_b``/``map_f`` (vectorized, from :meth:`MappedOperator.backward`
  and :meth:`MappedOperator.forward`);
* Full mode: ``run`` emits the very same relation as region pairs with a few
  batched ``lwrite`` calls (:func:`emit_full`), so stored and re-executed
  lineage never disagree with the mapping functions;
* black-box re-execution, through Full mode.

A subclass implements ``compute`` (the numpy work), ``backward`` (input cells
of each output cell, labelled by the output row they belong to) and
``forward``; it declares ``all_to_all``, ``tiling`` and ``output_shape``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from subzero import GLOBAL, LineageError, Mode, Operator
from subzero.model.cells import as_cells, box, unpack
from subzero.tuning import EMIT_BATCH_CELLS

Shape = tuple[int, ...]

#: Upper bound on the input cells one ``lwrite`` batch may hold (memory, not semantics).


def as_array(x) -> np.ndarray:
    """numpy view of an input (xarray DataArrays included); 0-d becomes shape (1,),
    the engine's convention for scalars."""
    a = np.asarray(x)
    return a.reshape(1) if a.ndim == 0 else a


def all_cells(shape: Shape) -> np.ndarray:
    """Every cell of an array, C order."""
    return box((0,) * len(shape), tuple(shape))


def no_cells(ndim: int) -> np.ndarray:
    return np.zeros((0, ndim), np.int64)


def rows(n: int, k: int) -> np.ndarray:
    """Owner labels for n rows with k cells each: 0,0,..,1,1,.."""
    return np.repeat(np.arange(n, dtype=np.int64), k)


def grid_product(cells: np.ndarray, free_dims: Sequence[int], free_sizes: Sequence[int],
                 ndim: int, fixed_dims: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``cells`` (coordinates of ``fixed_dims``), every cell whose
    ``free_dims`` range over ``free_sizes``: an ``(N*F, ndim)`` array and owners.

    The shared shape of axis reductions, broadcasting and matrix rows/columns.
    """
    n = len(cells)
    g = box((0,) * len(free_dims), tuple(free_sizes))
    f = len(g)
    out = np.empty((n, f, ndim), np.int64)
    if len(fixed_dims):
        out[:, :, list(fixed_dims)] = cells[:, None, :]
    if len(free_dims):
        out[:, :, list(free_dims)] = g[None, :, :]
    return out.reshape(n * f, ndim), rows(n, f)


class MappedOperator(Operator):
    """Base class: lineage from coordinates, available as Map and as Full pairs.

    Subclasses set ``arity`` (number of inputs, None for any number) and
    implement ``compute``, ``backward`` and ``forward``.  All-to-all inputs
    need neither: the base answers "the whole array" for them.
    """

    arity: int | None = 1
    tiling = GLOBAL
    deterministic = True
    deterministic_lineage = True       # the relation is computed from coordinates alone
    all_to_all: bool | Sequence[bool] | None = False     # the declared type of Operator.all_to_all

    # -- running ----------------------------------------------------------------
    # (*arrays: Any, **kwargs: Any): subclasses take their own fixed inputs
    def compute(self, *arrays: Any, **kwargs: Any) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, ctx, *inputs):
        arrays = [as_array(x) for x in inputs]
        out = as_array(self.compute(*arrays))
        if Mode.FULL in ctx.modes:
            if tuple(ctx.output_shape) != out.shape:
                raise LineageError(
                    f"operator {ctx.name!r} ({type(self).__name__}) declared output shape "
                    f"{tuple(ctx.output_shape)} but produced {out.shape}")
            self.emit_full(ctx)
        return out

    def n_inputs(self) -> int | None:
        return self.arity

    def supported_modes(self) -> set[Mode]:
        return {Mode.FULL, Mode.MAP, Mode.BLACKBOX}

    # -- the relation ----------------------------------------------------------------
    def backward(self, cells: np.ndarray, i: int, ctx) -> tuple[np.ndarray, np.ndarray | None]:
        """Input-``i`` cells of each output cell, and for each the row of ``cells``
        it belongs to, grouped by row in row order (None when row k maps to
        exactly input cell k)."""
        raise NotImplementedError(f"{type(self).__name__}.backward")

    def forward(self, cells: np.ndarray, i: int, ctx) -> np.ndarray:
        """Output cells that depend on the input-``i`` ``cells`` (duplicates allowed)."""
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def map_b(self, cells, i, ctx):
        """Input-``i`` cells of the output ``cells`` (all of them for an all-to-all input)."""
        cells = as_cells(cells, len(ctx.output_shape))
        if self.is_all_to_all(i):
            return all_cells(ctx.input_shape(i)) if len(cells) else no_cells(len(ctx.input_shape(i)))
        return self.backward(cells, i, ctx)[0]

    def map_f(self, cells, i, ctx):
        """Output cells of the input-``i`` ``cells`` (all of them for an all-to-all input)."""
        cells = as_cells(cells, len(ctx.input_shape(i)))
        if self.is_all_to_all(i):
            return all_cells(ctx.output_shape) if len(cells) else no_cells(len(ctx.output_shape))
        return self.forward(cells, i, ctx)

    def emit_full(self, ctx) -> None:
        """Write the mapping relation as region pairs (override for a more compact form)."""
        emit_full(self, ctx)


def emit_full(op: MappedOperator, ctx, region=None) -> None:
    """Emit ``op``'s relation as Full pairs, batched and vectorized.

    An all-to-all input gets one pair (every output cell, every cell of that
    input, nothing of the others).  The other inputs share one pair per output
    cell, built from ``op.backward`` in batches of output cells: when every
    output cell has the same number of input cells (per input) the batch is
    one ``lwrite(each=True)`` of ``(N, K, ndim)`` arrays, otherwise one
    ``lwrite_groups``, where output cells that depend on nothing get no pair.

    ``region`` (``(lo, hi)`` per output axis): only the output cells in it (one tile's
    share of the relation, in array coordinates).
    """
    out_shape = tuple(ctx.output_shape)
    lo = np.zeros(len(out_shape), np.int64) if region is None else np.array([a for a, _ in region], np.int64)
    span = out_shape if region is None else tuple(b - a for a, b in region)
    n_in = ctx.n_inputs
    shapes = [ctx.input_shape(i) for i in range(n_in)]
    a2a = [op.is_all_to_all(i) for i in range(n_in)]
    n_out = int(np.prod(span, dtype=np.int64))
    if n_out == 0:
        return
    for i in range(n_in):
        if a2a[i] and int(np.prod(shapes[i], dtype=np.int64)):
            ins = [no_cells(len(s)) for s in shapes]
            ins[i] = all_cells(shapes[i])
            ctx.lwrite(all_cells(span) + lo, *ins)
    rest = [i for i in range(n_in) if not a2a[i]]
    if not rest:
        return
    centre = np.asarray(out_shape, np.int64)[None, :] // 2      # usually an interior cell
    fan_in = max(1, sum(len(op.backward(centre, i, ctx)[0]) for i in rest))
    step = max(1, EMIT_BATCH_CELLS // fan_in)
    for a in range(0, n_out, step):
        out = unpack(np.arange(a, min(n_out, a + step), dtype=np.int64), span) + lo
        _emit_batch(op, ctx, out, shapes, a2a)


def _emit_batch(op: MappedOperator, ctx, out: np.ndarray, shapes, a2a) -> None:
    n = len(out)
    rel = []
    for i, shape in enumerate(shapes):
        if a2a[i]:
            rel.append((no_cells(len(shape)), np.zeros(0, np.int64), np.zeros(n, np.int64)))
            continue
        cells, owner = op.backward(out, i, ctx)
        owner = np.arange(n, dtype=np.int64) if owner is None else np.asarray(owner, np.int64)
        rel.append((cells, owner, np.bincount(owner, minlength=n)))
    uniform = all(r[2].min() == r[2].max() for r in rel)
    if uniform:                              # fixed K per input: no grouping needed
        if sum(int(r[2][0]) for r in rel):
            ctx.lwrite(out, *[c.reshape(n, int(ln[0]), len(s))
                              for (c, _, ln), s in zip(rel, shapes)], each=True)
        return
    used = np.flatnonzero(sum(r[2] for r in rel))
    if used.size:
        ctx.lwrite_groups(out[used], used, *[(c, g) for c, g, _ in rel])
