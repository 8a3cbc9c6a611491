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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from subzero.errors import OperatorError, SubZeroError
from subzero.model.grid import Grid
from subzero.model.modes import Mode
from subzero.model.statistic import Box, Statistic


class TilingKind(StrEnum):
    """How an operator can be split over tiles (see :class:`Tiling`).  A ``str``
    enum: a kind compares equal to its name (``TilingKind.AGGREGATE == "aggregate"``)."""

    #: tile-local: an output tile depends on the same tile of every input
    ELEMENTWISE = "elementwise"
    #: tile-local with a halo of ``Tiling.radius`` cells
    STENCIL = "stencil"
    #: a whole-array reduction combined from per-tile partial results (:class:`Aggregating`)
    AGGREGATE = "aggregate"
    #: connected regions of a foreground mask, labelled per tile and merged (:class:`Labelling`)
    COMPONENTS = "components"
    #: structural: an output tile reads the input box its cells come from (:class:`Gathering`)
    GATHER = "gather"
    #: needs the whole array
    GLOBAL = "global"

    @property
    def tile_local(self) -> bool:
        """Whether an output tile is computed from the same tile of the inputs (plus a
        halo): the operator can run, and re-run, tile by tile."""
        return self in (TilingKind.ELEMENTWISE, TilingKind.STENCIL)


@dataclass(frozen=True)
class Tiling:
    """How an operator can be split over tiles (used by the engines and by tile
    re-execution).

    kind: a :class:`TilingKind` (its name as a string is accepted):
    ``"elementwise"`` (tile-local), ``"stencil"`` (tile-local with a halo
    of ``radius`` cells), ``"aggregate"`` (a whole-array reduction combined from
    per-tile partial results: the operator implements ``partial(*tiles)``,
    ``merge(a, b)`` and ``finish(state)``, and ``merge`` must make the result
    independent of the tiling: :class:`Aggregating`), ``"components"`` (connected
    regions of a foreground mask, labelled per tile and merged across tile
    borders: :class:`Labelling`, as
    :class:`subzero.operators.components.ConnectedComponents` is), ``"gather"``
    (structural: each cell of the output is one cell of the input, so a tile
    of the output reads the box of the input its cells come from; the operator
    implements ``input_box(out_box, in_shape)``, ``gather(block, box, out_box,
    in_shape)`` and, for stored Full lineage, ``emit_tile(ctx, out_box)``, as
    :class:`subzero.operators.Slice` does: :class:`Gathering`) or
    ``"global"`` (needs the whole array).
    """

    kind: TilingKind = TilingKind.GLOBAL
    radius: int = 0

    def __post_init__(self) -> None:
        try:
            kind = TilingKind(self.kind)
        except ValueError as err:
            raise ValueError(f"unknown tiling {self.kind!r}") from err
        object.__setattr__(self, "kind", kind)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled (a run's ``workflow.pkl``) with its kind a :class:`TilingKind`:
        pickles made before there was one hold the kind's name."""
        self.__dict__.update(state)
        object.__setattr__(self, "kind", TilingKind(self.kind))


ELEMENTWISE = Tiling(TilingKind.ELEMENTWISE)
AGGREGATE = Tiling(TilingKind.AGGREGATE)
GLOBAL = Tiling(TilingKind.GLOBAL)
COMPONENTS = Tiling(TilingKind.COMPONENTS)
GATHER = Tiling(TilingKind.GATHER)


def stencil(radius: int) -> Tiling:
    return Tiling(TilingKind.STENCIL, int(radius))


# -- what an operator sees while it runs ---------------------------------------------------
class OperatorContext(Protocol):
    """``ctx``: what an operator sees while it runs and when its mapping functions
    are called.  :class:`subzero.capture.context.Context` implements it; the model
    names only what operators use, so it needs nothing from the capture layer."""

    #: the lineage modes the run needs from the operator (skip lineage code for others)
    modes: frozenset[Mode]

    @property
    def n_inputs(self) -> int: ...

    def input_shape(self, i: int) -> tuple[int, ...]: ...

    @property
    def output_shape(self) -> tuple[int, ...]: ...

    @property
    def origin(self) -> tuple[int, ...]:
        """Where this data begins in the whole array (zeros unless run per tile)."""
        ...

    @property
    def array_shape(self) -> tuple[int, ...] | None:
        """The whole output array's shape when run per tile, else None."""
        ...

    @property
    def statistic(self) -> Any:
        """The value of the operator's declared :attr:`Operator.statistic`."""
        ...

    def lwrite(self, outcells: Any, *incells: Any, payload: Any = None, each: bool = False) -> None:
        """Record lineage: region pairs (``incells``) or payload pairs (``payload``)."""
        ...

    def lwrite_groups(self, outcells: Any, out_groups: Any, *ins: Any, payload: Any = None) -> None:
        """Many multi-cell pairs in one call: cells labelled by pair id."""
        ...


# -- what an operator may be able to do, beyond run (the engines check these) ---------------
@runtime_checkable
class Aggregating(Protocol):
    """A whole-array reduction the Spark engine runs as an aggregation (declared
    :attr:`TilingKind.AGGREGATE`, one input, all-to-all): :meth:`partial` per tile,
    the partials merged in a tree by :meth:`merge` (which must make the result
    independent of the tiling), the output from :meth:`finish`.  An operator that
    declares the kind without these runs as one task on the whole array."""

    def partial(self, tile: np.ndarray, /) -> Any:
        """The partial state of one tile of the input."""
        ...

    def merge(self, a: Any, b: Any, /) -> Any:
        """Two partial states merged (associative)."""
        ...

    def finish(self, state: Any, /) -> Any:
        """The output array from the merged state."""
        ...


@runtime_checkable
class Gathering(Protocol):
    """A structural operator of one input (declared :attr:`TilingKind.GATHER`): each
    output cell is one input cell, so the Spark engine computes each output tile from
    the input box it reads (:meth:`input_box`, :meth:`gather`), and a task writes
    the tile's Full lineage itself (:meth:`emit_tile`)."""

    def input_box(self, out_box: Box, in_shape: tuple[int, ...], /) -> Box:
        """The box of the input that the output box ``out_box`` reads."""
        ...

    def gather(self, block: np.ndarray, box: Box, out_box: Box, in_shape: tuple[int, ...], /,
               ) -> np.ndarray:
        """The output over ``out_box`` from ``block``, the input over ``box``."""
        ...

    def emit_tile(self, ctx: OperatorContext, out_box: Box, /) -> None:
        """Full lineage of the output cells in ``out_box`` (array coordinates), with
        ``ctx.lwrite``."""
        ...


@runtime_checkable
class Labelling(Protocol):
    """Connected components of a foreground mask (declared
    :attr:`TilingKind.COMPONENTS`, one input): the engines decide each cell with
    :meth:`foreground`, label the regions per tile and merge them across tile
    borders, and record each region's lineage through :meth:`write_lineage`.
    An optional ``min_size`` attribute (default 1) drops smaller regions."""

    #: ``"full"`` (8-connected in 2-D) or ``"faces"`` (4-connected)
    connectivity: str

    def foreground(self, values: np.ndarray, stat: Any, /) -> np.ndarray:
        """The boolean mask of ``values`` (a tile or the whole array), cell by cell;
        ``stat``: the declared statistic's value (None without one)."""
        ...

    def write_lineage(self, ctx: OperatorContext, cells: np.ndarray, ids: np.ndarray,
                      background: Callable[[], np.ndarray], /) -> None:
        """One pair per region (``cells`` labelled ``ids``), and the background's."""
        ...


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
    deterministic  re-running on the same inputs gives the same output; black-box
                   re-execution requires it, and checks it: a re-run's output must
                   equal the stored output where the trace uses it.
    deterministic_lineage
                   re-running on the same inputs writes the same lineage (the
                   pairs of ``ctx.lwrite``) as well -- a separate promise, since
                   an operator may compute its output exactly and still draw its
                   lineage at random (a sampled window, an unseeded choice), and
                   no stored output can show that.  ``None`` (the default: not
                   declared): a black-box trace step re-runs the operator twice and
                   compares the two relations on the query's cells; a difference
                   stops the trace naming the operator.  ``True``: declared (for
                   lineage computed from the inputs, the output or coordinates
                   alone), so one re-run, its output checked, is trusted -- half the
                   re-execution cost.  ``False``: its lineage cannot be recomputed,
                   so it must be stored (``subzero run`` refuses strategies that
                   leave it to re-execution, before anything runs).
    map_p_batched  ``map_p`` distributes over cells: map_p(A ∪ B) equals
                   map_p(A) ∪ map_p(B) for one payload, so the executor may
                   call it once for many pairs that share a payload.
    default_strategy  strategy spec used when the user gives none (e.g.
                   ``"comp:payone:backward"``); None = SubZero's default rule.
    statistic      a :class:`~subzero.model.statistic.Statistic` of the first
                   input that ``run`` needs whole (``ctx.statistic``): engines
                   that run the operator per tile compute it over the tiles
                   first, so every tile sees the whole array's value.
    labels_objects the output names objects by value: 0 is none, k is object k
                   (a star's id in a label image).  An impact query then lists
                   the ids of the objects its answer touches.
    statistic_margin  cells beyond a tile's read region that :meth:`uses_statistic`
                   is shown (what it needs to decide exactly, such as the reach of
                   a mask its statistic grows).
    payload_reach  for payload lineage on inputs that share the output's coordinates:
                   every input cell ``map_p`` gives a pair lies within this many cells
                   (along every axis) of one of the pair's output cells -- an int, or
                   one int (or None) per input.  A forward trace step then reads only
                   the pairs near its cells instead of scanning them all
                   (:mod:`subzero.model.reach`).  Checked on every pair a run stores:
                   a pair that reaches farther stops the run with an error naming it.
                   None (the default): not declared, forward steps scan.
    """

    all_to_all: bool | Sequence[bool] | None = None
    tiling: Tiling = GLOBAL
    deterministic: bool = True
    deterministic_lineage: bool | None = None
    map_p_batched: bool = False
    default_strategy: str | None = None
    statistic: Statistic | None = None
    labels_objects: bool = False
    statistic_margin: int = 0
    payload_reach: int | Sequence[int | None] | None = None

    # -- what the operator does -------------------------------------------
    def run(self, ctx: OperatorContext, *inputs: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        """The output array from the inputs (numpy arrays or DataArrays); lineage through
        ``ctx.lwrite`` for the modes in ``ctx.modes``.  (``*Any, **Any``: an operator
        overrides it with its own inputs, as :meth:`output_shape` explains.)"""
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

    def uses_statistic(self, inputs: Sequence[Any], output: np.ndarray, block: Box,
                       read: Box, shape: tuple[int, ...]) -> bool:
        """Whether a tile could come out differently if its :attr:`statistic` had another
        value, all its inputs unchanged: a re-run whose statistic changed runs again only
        the tiles that say so (:mod:`subzero.engines.incremental`).

        ``inputs`` and ``output`` are the parent run's values over ``block`` (the
        tile's read region ``read`` grown by :attr:`statistic_margin`, clipped at the
        array's edges ``shape``); ``output`` is what the tile computed with the old
        value.  Each input is read only where it is looked at: ``np.asarray(x)`` reads
        it over the whole block, ``x[box]`` (slices) only that box.

        The default, True, is always right: every tile runs again.  An operator that
        uses its statistic only somewhere (L.A.Cosmic's sky median only fills fully
        masked windows) says so, and must never answer False for a tile
        whose output the value can reach: the re-run would keep a stale tile."""
        return True

    # -- lineage ----------------------------------------------------------
    def supported_modes(self) -> set[Mode]:
        """Lineage modes this operator can provide (BLACKBOX is always possible)."""
        modes = {Mode.BLACKBOX}
        if self.has_mapping():
            modes.add(Mode.MAP)
        return modes

    def map_b(self, cells: np.ndarray, i: int, ctx: OperatorContext) -> np.ndarray:
        """Input-``i`` cells that the given output cells depend on."""
        return NotImplemented

    def map_f(self, cells: np.ndarray, i: int, ctx: OperatorContext) -> np.ndarray:
        """Output cells that depend on the given cells of input ``i``."""
        return NotImplemented

    def map_b_bitmap(self, bitmap: np.ndarray, i: int, ctx: OperatorContext) -> np.ndarray:
        """Optional whole-bitmap fast path of ``map_b``: a boolean mask of the
        output in, a boolean mask of input ``i`` out (or NotImplemented)."""
        return NotImplemented

    def map_f_bitmap(self, bitmap: np.ndarray, i: int, ctx: OperatorContext) -> np.ndarray:
        """Optional whole-bitmap fast path of ``map_f`` (input-``i`` mask in, output mask out)."""
        return NotImplemented

    def map_p(self, cells: np.ndarray, payload: bytes, i: int, ctx: OperatorContext) -> np.ndarray:
        """Input-``i`` cells of one payload pair whose output cells are ``cells``."""
        raise NotImplementedError(
            f"{type(self).__name__} writes payload lineage but does not implement map_p")

    def map_p_pairs(self, cells: np.ndarray, offsets: np.ndarray, payloads: Sequence[bytes],
                    pay_ids: np.ndarray, i: int, ctx: OperatorContext) -> tuple[np.ndarray, np.ndarray]:
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
    def output_grid(self, grids: Sequence[Grid | None], input_shapes: Sequence[Sequence[int]],
                    output_shape: Sequence[int]) -> Grid | None:
        """The :class:`~subzero.model.grid.Grid` (labelled axes, sky WCS) of the
        output, given each input's grid (None where it has none) and shape.

        The default follows xarray's rules.  The output sits on the grid of its
        first input of the same shape: true of elementwise, stencil and window
        operators and of most user functions of an image.  Else, when the output
        is a labelled input with axes reduced away (a maximum over time: the
        input's shape with some axes removed, or kept with length 1, matched in
        one way only), the remaining axes keep their labels, and the sky WCS when
        its axes remain.  An operator that moves, reorders or resamples cells
        while keeping the shape (a flip, a roll, a resampling) must override it,
        returning the moved grid or None; the built-in structural operators do.
        Called only at query time, never in a run."""
        out = tuple(output_shape)
        for g, s in zip(grids, input_shapes):
            if g is not None and tuple(s) == out:
                return g
        for g, s in zip(grids, input_shapes):
            kept = reduced_axes(tuple(s), out) if g is not None else None
            if g is not None and kept is not None:
                return g.reduced(kept, out)
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


class own_code:
    """``with own_code(name, op, fn):`` around a call of one of operator ``name``'s own
    functions (``fn``: ``map_b``, ``map_f``, ``map_p``...) for a trace or a capture:
    whatever it raises is one :class:`~subzero.errors.OperatorError` naming the
    operator and the function (the workflow's code is wrong, not SubZero); SubZero's
    own errors pass as they are.  A class, not a generator: it sits on every mapping
    step of a trace, and entering it costs well under a microsecond."""

    __slots__ = ("name", "op", "fn")

    def __init__(self, name: str, op: Operator, fn: str):
        self.name, self.op, self.fn = name, op, fn

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if ev is None or not isinstance(ev, Exception) or isinstance(ev, SubZeroError):
            return False
        fn = self.fn
        if fn == "map_p_pairs" and type(self.op).map_p_pairs is Operator.map_p_pairs:
            fn = "map_p"            # the default map_p_pairs calls the operator's map_p
        raise OperatorError(f"operator {self.name!r} ({type(self.op).__name__}): its {fn} "
                            f"raised {type(ev).__name__}: {ev}") from ev


def reruns(op: Operator) -> int:
    """How many times a black-box trace step re-runs ``op``: once when it declares its
    lineage deterministic, else twice, to compare the two relations (see
    ``Operator.deterministic_lineage``)."""
    return 1 if op.deterministic_lineage else 2


def map_p_vectorized(op: Operator) -> bool:
    """Whether ``op`` has a ``map_p_pairs`` of its own (a vectorized ``map_p`` over many
    pairs), not the default's call of ``map_p`` per pair."""
    return type(op).map_p_pairs is not Operator.map_p_pairs


def lineage_reproducible(op: Operator) -> bool:
    """Whether re-running ``op`` may recompute its lineage: its output is deterministic
    and its lineage is not declared otherwise."""
    return bool(op.deterministic) and op.deterministic_lineage is not False


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


def reduced_axes(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...] | None:
    """The axes of ``shape`` an output of shape ``out`` keeps when it is ``shape`` with
    axes reduced away -- removed, or kept with length 1 (``keepdims``) -- in the one
    way that fits; None when none does, or several do ((5, 5, 5) -> (5, 5))."""
    if out == shape:
        return None
    if len(out) == len(shape):          # keepdims: reduced axes have length 1
        if all(o == n or o == 1 for o, n in zip(out, shape)):
            return tuple(d for d, (o, n) in enumerate(zip(out, shape)) if o == n)
        return None
    if len(out) > len(shape):
        return None
    import itertools
    fits = [k for k in itertools.combinations(range(len(shape)), len(out))
            if all(shape[d] == o for d, o in zip(k, out))]
    if len(fits) != 1:
        return None
    return fits[0]
