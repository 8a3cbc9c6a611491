"""Run one operator and capture its lineage in memory: the step every engine
(and every Spark task) shares."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from subzero.capture.buffer import LineageBuffer, Pairs
from subzero.capture.context import Context
from subzero.capture.tiles import Shape, Tile, globalize
from subzero.errors import OperatorError, SubZeroError
from subzero.model.exits import described, ends_process
from subzero.model.labelled import is_dataarray
from subzero.model.modes import Mode
from subzero.model.operator import Operator
from subzero.model.statistic import whole
from subzero.model.strategy import Strategy, modes_needed

if TYPE_CHECKING:
    import xarray as xr

NOT_GIVEN: Any = object()      # run_operator's statistic was not computed by the engine


def _plain(value: Any) -> np.ndarray:
    return np.asarray(value.data if is_dataarray(value) else value)


def _known(value: Any) -> Any:
    return value


def statistic_source(op: Operator, inputs: Sequence[Any], statistic: Any = NOT_GIVEN,
                     ) -> Callable[[], Any] | None:
    """How ``ctx.statistic`` gets the operator's statistic (the ``statistic`` argument
    of :class:`Context`): the engine's value when it computed one over tiles, else
    computed from ``inputs`` (the whole arrays) on first use; None when the operator
    declares none."""
    if statistic is not NOT_GIVEN:
        return partial(_known, statistic)
    if op.statistic is not None and inputs:
        return partial(whole, op.statistic, _plain(inputs[0]))
    return None


def array_context(name: str, op: Operator, modes: Iterable[Mode], in_shapes: list[Shape], out_shape: Shape,
                  ) -> Context:
    """A ``ctx`` in array coordinates, with its buffer: for lineage a task writes for
    its share of an array (cells already placed in the whole arrays' shapes)."""
    buf = LineageBuffer(name, len(in_shapes), len(out_shape), [len(s) for s in in_shapes])
    return Context(name, op, frozenset(modes), in_shapes, out_shape, buf)


def shape_of(value: Any) -> tuple[int, ...]:
    """The shape of a run's value (an array, a DataArray, an input read region by region;
    anything with a shape, or that numpy can make an array of), 0-d as one cell."""
    s = tuple(int(x) for x in np.shape(value))
    return s if s else (1,)


def normalise_output(name: str, op: Operator, value: Any) -> np.ndarray | xr.DataArray:
    if value is None:
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) returned None; run() must "
                            f"return its output array")
    if is_dataarray(value):
        return value if value.ndim else value.expand_dims("dim_0")
    # C order, as arrays come back from the store: numpy's sums depend on memory layout,
    # and both engines (and re-execution) must see bit-identical inputs
    arr = np.ascontiguousarray(value)
    if arr.dtype == object:
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) returned a "
                            f"{type(value).__name__} that is not a numeric array")
    return arr.reshape(1) if arr.ndim == 0 else arr


def mapping_context(name: str, op: Operator, in_shapes: Sequence[Sequence[int]], out_shape: Sequence[int],
                    ) -> Context:
    return Context(name, op, frozenset(), in_shapes, out_shape)


def told_output_shape(op: Operator, in_shapes: Sequence[Shape]) -> tuple[tuple[int, ...] | None, bool]:
    """(the output shape ``run`` is told as ``ctx.output_shape``, whether it is
    only a guess).  An operator's own ``output_shape`` is a declaration; the
    base class's (the first input's shape) is a guess, never used to read or
    validate lineage -- shape-changing operators need not declare anything
    to write lineage."""
    try:
        told = op.output_shape(*in_shapes)
        shape = tuple(int(x) for x in told) if told is not None else None
    except Exception:          # a declaration that fails is no declaration
        shape = None
    declared = type(op).output_shape is not Operator.output_shape
    return shape, not declared or shape is None


def run_operator(name: str, op: Operator, inputs: Sequence[np.ndarray | xr.DataArray],
                 strategies: tuple[Strategy, ...], capture: bool = True, origin: tuple[int, ...] | None = None,
                 array_shape: tuple[int, ...] | None = None, statistic: Any = NOT_GIVEN,
                 ) -> tuple[np.ndarray | xr.DataArray, Pairs | None, Pairs | None, Context]:
    """Run one operator and capture its lineage in memory.

    ``statistic``: the operator's declared statistic, computed by the engine over
    the whole array; when not given, ``ctx.statistic`` computes it from the first
    input on first use (the inputs are then the whole arrays).

    Returns (output, full pairs, payload pairs, ctx).  Operator exceptions
    become :class:`OperatorError` naming the operator.
    """
    in_shapes = [shape_of(x) for x in inputs]
    modes = modes_needed(strategies) if capture else frozenset()
    declared, guessed = told_output_shape(op, in_shapes)
    buf = LineageBuffer(name, len(inputs), None if guessed or declared is None else len(declared),
                        [len(s) for s in in_shapes]) if modes else None
    ctx = Context(name, op, modes, in_shapes, declared, buf, tile_origin=origin,
                  output_guessed=guessed, array_shape=array_shape,
                  statistic=statistic_source(op, inputs, statistic))
    try:
        out = op.run(ctx, *inputs)
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) failed: "
                            f"{type(e).__name__}: {e}") from e
    except (SystemExit, KeyboardInterrupt) as e:
        if not ends_process(e):
            raise                                  # a real Ctrl-C: the run is interrupted
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) {described(e)} in run(); "
                            f"an operator returns its output or raises an exception") from e
    out = normalise_output(name, op, out)
    full, pay = ctx.finish(shape_of(out))
    return out, full, pay, ctx


@dataclass
class TileOutput:
    """One tile of a tile-parallel operator: the core of its output and the lineage
    of the core's cells, in array coordinates."""

    core: np.ndarray
    full: Pairs | None
    pay: Pairs | None
    run_s: float
    lwrite_s: float
    #: the output over the whole read region (core and halo): a fused stage hands its
    #: halo on to the operators after it
    whole: np.ndarray | None = None


def run_tile(name: str, op: Operator, ins: Sequence[np.ndarray], strategies: tuple[Strategy, ...], capture: bool,
             tile: Tile, out_shape: Shape, in_shapes: list[Shape], statistic: Any = NOT_GIVEN) -> TileOutput:
    """Run a tile-parallel operator on one tile's read region (``ins``: each input's
    core plus halo) and keep the core: the step both engines share per tile.

    ``ctx`` describes the tile (its shapes), as the operator would see a small array.
    An operator with a ``statistic`` needs the whole array's value (``statistic``):
    the tile's own would differ."""
    if statistic is NOT_GIVEN and op.statistic is not None:
        raise OperatorError(f"operator {name!r} declares a statistic: its tiles need the whole "
                            f"array's value, computed before they run")
    t0 = time.perf_counter()
    out, full, pay, ctx = run_operator(name, op, ins, strategies, capture, origin=tile.origin,
                                       array_shape=tuple(out_shape), statistic=statistic)
    run_s = time.perf_counter() - t0
    out = np.asarray(out.data if is_dataarray(out) else out)
    if out.shape != tile.read_shape():
        raise OperatorError(f"operator {name!r} is declared {op.tiling.kind} but returned shape "
                            f"{out.shape} for an input tile of shape {tile.read_shape()}; "
                            f"declare it global")
    local = [shape_of(x) for x in ins]          # a one-cell input is read whole
    return TileOutput(out[tile.core_in_read()], globalize(full, tile, out_shape, in_shapes, local),
                      globalize(pay, tile, out_shape, in_shapes, local), run_s, ctx.lwrite_seconds,
                      whole=out)
