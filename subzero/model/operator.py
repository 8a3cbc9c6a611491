"""The operator API: what a user subclasses to add a step to a workflow.

An operator implements ``run(ctx, *inputs)``; lineage is opt-in.  Mapping
functions (``map_b``/``map_f``) give lineage computed from coordinates alone
(Map mode); ``ctx.lwrite`` records region pairs (Full) or payload pairs
(Pay / Comp) which ``map_p`` turns back into input cells.  An operator that
implements nothing beyond ``run`` is treated as all-to-all black-box: every
output cell depends on every input cell.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from subzero.model.modes import Mode
from subzero.model.statistic import Statistic


@dataclass(frozen=True)
class Tiling:
    """How an operator can be split over tiles (used by the Spark engine).

    kind: ``"elementwise"`` (tile-local), ``"stencil"`` (tile-local with a halo
    of ``radius`` cells), ``"aggregate"`` (a whole-array reduction combined from
    per-tile partial results: the operator implements ``partial(*tiles)``,
    ``merge(a, b)`` and ``finish(state)``, and ``merge`` must make the result
    independent of the tiling), ``"components"`` (connected regions of a
    foreground mask, labelled per tile and merged across tile borders: see
    :class:`subzero.operators.components.ConnectedComponents`), ``"gather"``
    (structural: each cell of the output is one cell of the input, so a tile
    of the output reads the box of the input its cells come from; the operator
    implements ``input_box(out_box, in_shape)``, ``gather(block, box, out_box,
    in_shape)`` and, for stored Full lineage, ``emit_tile(ctx, out_box)``, as
    :class:`subzero.operators.Slice` does) or
    ``"global"`` (needs the whole array).
    """

    kind: str = "global"
    radius: int = 0

    def __post_init__(self):
        if self.kind not in ("elementwise", "stencil", "aggregate", "components", "gather", "global"):
            raise ValueError(f"unknown tiling {self.kind!r}")


ELEMENTWISE = Tiling("elementwise")
AGGREGATE = Tiling("aggregate")
GLOBAL = Tiling("global")
COMPONENTS = Tiling("components")
GATHER = Tiling("gather")


def stencil(radius: int) -> Tiling:
    return Tiling("stencil", int(radius))


class Operator:
    """Base class of every workflow operator.

    Class attributes an operator may override (declarations the engines and
    the query planner rely on):

    all_to_all     bool, or one bool per input: every output cell depends on
                   every cell of that input, so a trace step through it may
                   short-cut to the entire array.  Default: True for a pure
                   black-box operator (no mapping functions, no lwrite modes),
                   otherwise False.
    tiling         :class:`Tiling` (elementwise, stencil(r), or global).
    deterministic  re-running on the same inputs gives the same output and
                   lineage; black-box re-execution requires it.
    map_p_batched  ``map_p`` distributes over cells: map_p(A ∪ B) equals
                   map_p(A) ∪ map_p(B) for one payload, so the executor may
                   call it once for many pairs that share a payload.
    default_strategy  strategy spec used when the user gives none (e.g.
                   ``"comp:payone:backward"``); None = SubZero's default rule.
    statistic      a :class:`~subzero.model.statistic.Statistic` of the first
                   input that ``run`` needs whole (``ctx.statistic``): engines
                   that run the operator per tile compute it over the tiles
                   first, so every tile sees the whole array's value.
    """

    all_to_all: bool | Sequence[bool] | None = None
    tiling: Tiling = GLOBAL
    deterministic: bool = True
    map_p_batched: bool = False
    default_strategy: str | None = None
    statistic: Statistic | None = None

    # -- what the operator does -------------------------------------------
    def run(self, ctx, *inputs) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement run(ctx, *inputs)")

    def output_shape(self, *input_shapes: Any, **kwargs: Any) -> Sequence[int] | None:
        """Shape of the output for given input shapes, when known before running.

        Only used for ``ctx.output_shape`` inside ``run``; None means unknown.
        The default guesses the first input's shape: lineage never relies on
        it (it is checked against the real output once ``run`` returns), and
        a run that read the guess in ``run`` fails if the output's shape
        differs.  The engine calls it with one positional shape tuple per
        input and no keywords.

        Why ``*Any, **Any``: type checkers read that signature as "any
        parameters", so an operator may override it with fixed arity
        (``def output_shape(self, shape)`` or ``(self, a, b)``), which the
        public API allows, without an incompatible-override error.
        """
        return tuple(input_shapes[0]) if input_shapes else None

    # -- lineage ----------------------------------------------------------
    def supported_modes(self) -> set[Mode]:
        """Lineage modes this operator can provide (BLACKBOX is always possible)."""
        modes = {Mode.BLACKBOX}
        if self.has_mapping():
            modes.add(Mode.MAP)
        return modes

    def map_b(self, cells: np.ndarray, i: int, ctx) -> np.ndarray:
        """Input-``i`` cells that the given output cells depend on."""
        return NotImplemented

    def map_f(self, cells: np.ndarray, i: int, ctx) -> np.ndarray:
        """Output cells that depend on the given cells of input ``i``."""
        return NotImplemented

    def map_b_bitmap(self, bitmap: np.ndarray, i: int, ctx):
        """Optional whole-bitmap fast path of ``map_b``: a boolean mask of the
        output in, a boolean mask of input ``i`` out (or NotImplemented)."""
        return NotImplemented

    def map_f_bitmap(self, bitmap: np.ndarray, i: int, ctx):
        """Optional whole-bitmap fast path of ``map_f`` (input-``i`` mask in, output mask out)."""
        return NotImplemented

    def map_p(self, cells: np.ndarray, payload: bytes, i: int, ctx) -> np.ndarray:
        """Input-``i`` cells of one payload pair whose output cells are ``cells``."""
        raise NotImplementedError(
            f"{type(self).__name__} writes payload lineage but does not implement map_p")

    def map_p_pairs(self, cells: np.ndarray, offsets: np.ndarray, payloads: Sequence[bytes],
                    pay_ids: np.ndarray, i: int, ctx) -> tuple[np.ndarray, np.ndarray]:
        """Apply ``map_p`` to many pairs at once, keeping track of which pair each
        input cell came from (forward queries over payload lineage need that).

        ``cells[offsets[k]:offsets[k+1]]`` are pair k's output cells and
        ``payloads[pay_ids[k]]`` its payload.  Returns ``(incells, pair)``.
        The default calls ``map_p`` once per pair; operators with many small
        payload pairs should override it with a vectorized version.
        """
        from subzero.model.cells import as_cells
        ndim = len(ctx.input_shape(i))
        outs, owners = [], []
        for k in range(len(offsets) - 1):
            res = as_cells(self.map_p(cells[offsets[k]:offsets[k + 1]],
                                      payloads[pay_ids[k]], i, ctx), ndim)
            outs.append(res)
            owners.append(np.full(len(res), k, np.int64))
        if not outs:
            return np.zeros((0, ndim), np.int64), np.zeros(0, np.int64)
        return np.concatenate(outs), np.concatenate(owners)

    # -- coordinates ------------------------------------------------------
    def output_grid(self, grids: Sequence[Any], input_shapes: Sequence[Sequence[int]],
                    output_shape: Sequence[int]) -> Any:
        """The :class:`~subzero.model.grid.Grid` (labelled axes, sky WCS) of the
        output, given each input's grid (None where it has none) and shape.

        The default says the output sits on the grid of its first input of the
        same shape: true of elementwise, stencil and window operators and of
        most user functions of an image.  An operator that moves, reorders or
        resamples cells while keeping the shape (a flip, a roll, a resampling)
        must override it, returning the moved grid or None; the built-in
        structural operators do.  Called only at query time, never in a run."""
        for g, s in zip(grids, input_shapes):
            if g is not None and tuple(s) == tuple(output_shape):
                return g
        return None

    # -- derived declarations ----------------------------------------------
    def has_mapping(self) -> bool:
        cls = type(self)
        return cls.map_b is not Operator.map_b and cls.map_f is not Operator.map_f

    def n_inputs(self) -> int | None:
        """Number of inputs ``run`` takes, or None for ``*inputs``."""
        params = list(inspect.signature(self.run).parameters.values())[1:]  # skip ctx
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return None
        return sum(1 for p in params
                   if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                   and p.default is p.empty)

    def is_all_to_all(self, i: int) -> bool:
        a = self.all_to_all
        if a is None:
            return self.supported_modes() <= {Mode.BLACKBOX}
        if isinstance(a, bool):
            return a
        return bool(a[i])

    def describe(self) -> str:
        return type(self).__name__


def rerun_mode(op: Operator) -> Mode | None:
    """The lineage mode a re-execution asks ``op`` for: the richest one it has.

    COMP needs the fewest pairs (mapping functions cover the default), then
    FULL, then PAY.  None means the operator has no lwrite lineage at all, so a
    trace never re-runs it (its mapping functions or all-to-all answer)."""
    modes = op.supported_modes()
    if Mode.COMP in modes and op.has_mapping():
        return Mode.COMP
    if Mode.FULL in modes:
        return Mode.FULL
    if Mode.PAY in modes:
        return Mode.PAY
    return None
