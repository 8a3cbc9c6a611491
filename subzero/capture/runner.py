"""Run one operator and capture its lineage in memory: the step every engine
(and every Spark task) shares."""

from __future__ import annotations

import numpy as np
import xarray as xr

from subzero.capture.buffer import LineageBuffer
from subzero.capture.context import Context
from subzero.errors import OperatorError, SubZeroError
from subzero.model.strategy import Strategy, modes_needed


def shape_of(value) -> tuple[int, ...]:
    s = tuple(int(x) for x in np.shape(value))
    return s if s else (1,)


def normalise_output(name: str, op, value):
    if value is None:
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) returned None; run() must "
                            f"return its output array")
    if isinstance(value, xr.DataArray):
        return value if value.ndim else value.expand_dims("dim_0")
    # C order, as arrays come back from the store: numpy's sums depend on memory layout,
    # and both engines (and re-execution) must see bit-identical inputs
    arr = np.ascontiguousarray(value)
    if arr.dtype == object:
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) returned a "
                            f"{type(value).__name__} that is not a numeric array")
    return arr.reshape(1) if arr.ndim == 0 else arr


def mapping_context(name: str, op, in_shapes, out_shape) -> Context:
    return Context(name, op, frozenset(), in_shapes, out_shape)


def run_operator(name: str, op, inputs: list, strategies: tuple[Strategy, ...],
                 capture: bool = True):
    """Run one operator and capture its lineage in memory.

    Returns (output, full pairs, payload pairs, ctx).  Operator exceptions
    become :class:`OperatorError` naming the operator.
    """
    in_shapes = [shape_of(x) for x in inputs]
    modes = modes_needed(strategies) if capture else frozenset()
    try:
        declared = op.output_shape(*in_shapes)
    except Exception:
        declared = None
    buf = LineageBuffer(name, len(inputs), len(declared) if declared else None,
                        [len(s) for s in in_shapes]) if modes else None
    ctx = Context(name, op, modes, in_shapes, declared, buf)
    try:
        out = op.run(ctx, *inputs)
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) failed: "
                            f"{type(e).__name__}: {e}") from e
    out = normalise_output(name, op, out)
    full = pay = None
    if buf is not None:
        full, pay = buf.finish(shape_of(out), in_shapes)
    return out, full, pay, ctx
