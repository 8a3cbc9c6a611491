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
from .cells import as_cells, first_out_of_bounds, fmt_cell, pack
from .encodings import KEY_BITS
from .errors import LineageError, OperatorError, SubZeroError
from .lineagestore import LineageStore
from .modes import Mode
from .strategy import BLACKBOX, MAP, Strategy, modes_needed
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

    budget: DiskBudget | None = getattr(lineage, "budget", None)
    expanded: dict[int, dict] = {}

    def counted(cells, off, payloads, pay_ids, i):
        res, owner = map_p_pairs(cells, off, payloads, pay_ids, i)
        packed = pack(res, in_shapes[i]) if len(res) else np.zeros(0, np.int64)
        expanded[i] = {"key_cells": int(packed.size), "key_blocks": _key_blocks(packed),
                       "pairs": int(np.unique(owner).size) if len(owner) else 0}
        return res, owner

    dropped = []
    for s in strategies:
        if not s.stored:
            continue
        pairs = pay if s.payload else full
        if pairs is None:
            pairs = empty_pairs(len(in_shapes), s.payload)
        predicted = budget.predicted.get((name, str(s))) if budget is not None else None
        if predicted is not None and not budget.fits(predicted):
            budget.downgrade(name, s, predicted, None)
            dropped.append(s)
            continue
        expanded.clear()
        w = lineage.write(name, s, pairs, out_shape, in_shapes, counted)
        if budget is not None and not budget.fits(w.bytes):
            lineage.drop(name, s)          # this operator's own write, never earlier lineage
            budget.downgrade(name, s, predicted, w.bytes)
            dropped.append(s)
            continue
        if budget is not None:
            budget.used += w.bytes
        stats.per_strategy.append({"strategy": str(s), "bytes": w.bytes, "write_s": w.seconds,
                                   "pairs": w.pairs,
                                   "spaces": space_stats(s, pairs, out_shape, in_shapes, expanded)})
        stats.lineage_bytes += w.bytes
    if dropped:
        kept = [s for s in strategies if s not in dropped]
        if not any(s.stored or s.mode is Mode.MAP for s in kept):
            kept = [MAP if Mode.MAP in op.supported_modes() and op.has_mapping() else BLACKBOX]
        stats.strategies = [str(s) for s in kept]


@dataclass
class DiskBudget:
    """A run's lineage disk budget, enforced while lineage is written.

    Operators are written in workflow order.  A strategy that would take the
    total over ``max_bytes`` is not kept: the operator is downgraded to its
    other strategies, else to mapping functions or black-box re-execution, and
    the event is kept in ``downgrades`` (the catalog records it).  Lineage
    already written is never dropped, so earlier operators keep what they got.
    ``predicted`` maps (operator, strategy) to the plan's predicted bytes, so
    an overflow is usually seen before anything is encoded.
    """

    max_bytes: int
    predicted: dict[tuple[str, str], int] = field(default_factory=dict)
    used: int = 0
    downgrades: list[dict] = field(default_factory=list)

    def fits(self, nbytes: int) -> bool:
        return self.used + int(nbytes) <= self.max_bytes

    def downgrade(self, op: str, s: Strategy, predicted: int | None, needed: int | None) -> None:
        left = self.max_bytes - self.used
        size = needed if needed is not None else predicted
        self.downgrades.append({
            "op": op, "strategy": str(s), "predicted_bytes": predicted, "needed_bytes": needed,
            "reason": f"operator {op!r}: {s} needs {size} bytes but only {left} of the "
                      f"{self.max_bytes}-byte disk budget are left; not stored"})


def _key_blocks(packed: np.ndarray) -> int:
    """Key-index blocks (2**KEY_BITS consecutive cells) that packed key cells fall in."""
    return int(np.count_nonzero(np.bincount(packed >> KEY_BITS))) if packed.size else 0


def space_stats(s: Strategy, pairs, out_shape, in_shapes, expanded: dict | None = None) -> dict:
    """Sizes of what one stored strategy holds, per key side ("b", "f0", ...): pairs,
    key cells and the key blocks they fall in, value cells, record cells, distinct
    payloads.  The query cost model prices lookups and scans from these; they are
    counts only (one bincount per key side), cheap enough to take at every capture."""
    nonempty = np.diff(pairs.out_off) > 0
    many = not s.encoding.startswith(("fullone", "payone"))
    if s.direction == "backward":
        vals = 0 if s.payload else int(sum(a.size for a in pairs.ins))
        rec = vals + (int(pairs.out.size) if (many or s.payload) else 0)
        d = {"pairs": int(np.count_nonzero(nonempty)), "key_cells": int(pairs.out.size),
             "key_blocks": _key_blocks(pairs.out), "key_size": int(np.prod(out_shape)),
             "value_cells": vals, "record_cells": rec}
        if s.payload:
            d["payloads"] = int(np.unique(pairs.pay_ids).size) if pairs.n else 0
            d["covered"] = int(pairs.out.size)
        return {"b": d}
    out = {}
    lens_out = np.diff(pairs.out_off)
    for i, shp in enumerate(in_shapes):
        if s.payload:
            e = (expanded or {}).get(i, {"key_cells": 0, "key_blocks": 0, "pairs": 0})
            kc, kb, p = e["key_cells"], e["key_blocks"], e["pairs"]
            vals = int(lens_out.sum())
        else:
            has = (np.diff(pairs.in_offs[i]) > 0) & nonempty
            kc, kb, p = int(pairs.ins[i].size), _key_blocks(pairs.ins[i]), int(np.count_nonzero(has))
            vals = int(lens_out[has].sum())
        out[f"f{i}"] = {"pairs": p, "key_cells": kc, "key_blocks": kb,
                        "key_size": int(np.prod(shp)), "value_cells": vals,
                        "record_cells": vals + (kc if many or s.payload else 0)}
    return out


def run_local(wf: Workflow, input_values: dict[str, Any], strategies: dict[str, tuple[Strategy, ...]],
              arrays: ArrayStore, lineage: LineageStore | None, capture: bool = True,
              on_array: Callable | None = None, progress=None,
              profiler: Callable | None = None) -> list[OpStats]:
    """Run every operator of ``wf``; store arrays and lineage; return statistics.

    ``profiler(name, op, inputs, output, run_s)``, when given, is called after each
    operator runs (the optimizer's profiling mode measures lineage there)."""
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
        if profiler is not None:
            profiler(name, op, ins, out, run_s)
        arrays.write(name, out)
        values[name] = out
        if on_array:
            on_array(name, "output", out)
        stats.append(st)
        if progress is not None:
            progress.update(1)
    return stats
