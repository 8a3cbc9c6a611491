"""The local engine: runs a workflow's operators in topological order,
in-process, capturing lineage as each operator runs.

It works on plain data (arrays in, arrays and statistics out) and the two
stores it is handed, so the same step function can run inside a Spark task.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import xarray as xr

from .arraystore import ArrayStore
from .capture import LineageBuffer, empty_pairs
from .context import Context
from .cells import as_cells, first_out_of_bounds, fmt_cell
from .errors import LineageError, OperatorError, SubZeroError
from .lineagestore import LineageStore
from .strategy import Strategy, modes_needed
from .workflow import Workflow


@dataclass
class OpStats:
    name: str
    cls: str
    inputs: list[str]
    strategies: list[str]
    shape: tuple[int, ...]
    dtype: str = ""
    nbytes: int = 0
    run_s: float = 0.0          # operator wall time, lwrite calls included
    lwrite_s: float = 0.0       # time spent inside lwrite (buffering)
    lineage_s: float = 0.0      # validation, encoding and writing of lineage
    pairs: int = 0
    lineage_bytes: int = 0
    per_strategy: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"name": self.name, "class": self.cls, "inputs": self.inputs,
                "strategies": self.strategies, "shape": list(self.shape), "run_s": self.run_s,
                "lwrite_s": self.lwrite_s, "lineage_s": self.lineage_s, "pairs": self.pairs,
                "lineage_bytes": self.lineage_bytes, "per_strategy": self.per_strategy}


def shape_of(value) -> tuple[int, ...]:
    s = tuple(int(x) for x in np.shape(value))
    return s if s else (1,)


def normalise_output(name: str, op, value):
    if value is None:
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) returned None; run() must "
                            f"return its output array")
    if isinstance(value, xr.DataArray):
        return value if value.ndim else value.expand_dims("dim_0")
    arr = np.asarray(value)
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


def store_lineage(name: str, op, strategies, full, pay, out_shape, in_shapes,
                  lineage: LineageStore, stats: OpStats) -> None:
    """Encode and write every stored strategy of one operator."""
    mctx = mapping_context(name, op, in_shapes, out_shape)

    def map_p_pairs(cells, off, payloads, pay_ids, i):
        """map_p at capture time (forward-keyed payload strategies), checked like at query time."""
        res, owner = op.map_p_pairs(cells, off, payloads, pay_ids, i, mctx)
        res = as_cells(res, len(in_shapes[i])) if len(res) else np.zeros((0, len(in_shapes[i])), np.int64)
        bad = first_out_of_bounds(res, in_shapes[i])
        if bad is not None:
            raise LineageError(f"operator {name!r}: map_p returned cell {fmt_cell(res[bad])} outside "
                               f"input {i} (shape {tuple(in_shapes[i])})")
        return res, np.asarray(owner, np.int64)

    for s in strategies:
        if not s.stored:
            continue
        pairs = pay if s.payload else full
        if pairs is None:
            pairs = empty_pairs(len(in_shapes), s.payload)
        w = lineage.write(name, s, pairs, out_shape, in_shapes, map_p_pairs)
        stats.per_strategy.append({"strategy": str(s), "bytes": w.bytes, "write_s": w.seconds,
                                   "pairs": w.pairs})
        stats.lineage_bytes += w.bytes


def run_local(wf: Workflow, input_values: dict[str, Any], strategies: dict[str, tuple[Strategy, ...]],
              arrays: ArrayStore, lineage: LineageStore | None, capture: bool = True,
              on_array: Callable | None = None, progress=None) -> list[OpStats]:
    """Run every operator of ``wf``; store arrays and lineage; return statistics."""
    values: dict[str, Any] = {}
    for name, v in input_values.items():
        values[name] = v if isinstance(v, xr.DataArray) else np.asarray(v)
        arrays.write(name, values[name])
        if on_array:
            on_array(name, "input", values[name])
    stats = []
    for name in wf.order():
        step = wf.steps[name]
        op = step.operator
        ins = [values[a] for a in step.inputs]
        strat = strategies[name]
        t0 = time.perf_counter()
        out, full, pay, ctx = run_operator(name, op, ins, strat, capture)
        run_s = time.perf_counter() - t0
        out_shape = shape_of(out)
        arr = out.data if isinstance(out, xr.DataArray) else out
        st = OpStats(name, type(op).__name__, list(step.inputs), [str(s) for s in strat], out_shape,
                     dtype=str(arr.dtype), nbytes=int(arr.nbytes), run_s=run_s,
                     lwrite_s=ctx.lwrite_seconds)
        t1 = time.perf_counter()
        if capture and lineage is not None:
            st.pairs = (full.n if full else 0) + (pay.n if pay else 0)
            store_lineage(name, op, strat, full, pay, out_shape, [shape_of(x) for x in ins],
                          lineage, st)
        st.lineage_s = time.perf_counter() - t1
        arrays.write(name, out)
        values[name] = out
        if on_array:
            on_array(name, "output", out)
        stats.append(st)
        if progress is not None:
            progress.update(1)
    return stats
