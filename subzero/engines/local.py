"""The local engine: runs a workflow's operators in topological order,
in-process, capturing lineage as each operator runs.

It works on plain data (arrays in, arrays and statistics out) and the two
stores it is handed, so the same step function can run inside a Spark task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from subzero.capture.runner import run_operator, shape_of
from subzero.engines.lineage import store_lineage
from subzero.engines.stats import OpStats
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow
from subzero.storage.arrays import ArrayStore
from subzero.storage.lineage import LineageStore


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
