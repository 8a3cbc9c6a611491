"""The Spark engine: a workflow's operators as Spark jobs over tiles.

Per operator, in topological order, the driver launches one job:

* elementwise and stencil operators (declared ``tiling``) run one task per
  tile — the Zarr chunks of the output — reading their input tiles (plus a
  halo of the stencil radius) straight from the run's Zarr arrays and
  writing their output tile back; nothing but lineage and statistics comes
  back to the driver;
* operators declared global, or whose inputs do not tile alike, run as one
  task on the whole arrays (the run log says so).

Lineage is captured inside the tasks with the same ``ctx``/``lwrite`` as
the local engine; the runtime translates tile-local cells to array cells and
keeps only the lineage of the tile's own output cells.  Pairs travel back as
task *results*, so only attempts that succeeded contribute: a retried or
speculative attempt can neither duplicate nor lose lineage.  The driver
encodes and writes them to the run's LMDB environment in one transaction per
operator and strategy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import xarray as xr

from subzero.capture.buffer import Pairs
from subzero.capture.runner import run_operator, shape_of
from subzero.capture.tiles import Tile, concat_pairs, globalize, tiles_for
from subzero.engines.lineage import store_lineage
from subzero.engines.session import SparkError, ship_workflow_modules
from subzero.engines.stats import OpStats
from subzero.errors import OperatorError, SubZeroError
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow
from subzero.storage.arrays import ArrayStore
from subzero.storage.lineage import LineageStore

MARK = "@@subzero@@"


@dataclass
class TaskResult:
    index: tuple[int, ...]
    full: Pairs | None
    pay: Pairs | None
    out_shape: tuple[int, ...]
    dtype: str
    run_s: float
    lwrite_s: float


def _aggregates(op, in_shapes, strategies) -> bool:
    """Run as a Spark aggregation: declared so, one input, all-to-all, and only
    Full (or no) lineage asked for (its pair is written by the runtime)."""
    return (getattr(op.tiling, "kind", "") == "aggregate" and len(in_shapes) == 1
            and all(hasattr(op, f) for f in ("partial", "merge", "finish"))
            and op.is_all_to_all(0)
            and all(s.mode.value in ("full", "map", "blackbox") for s in strategies))


def tile_plan(op, in_shapes) -> int | None:
    """The halo radius when the operator can run per tile, else None (global)."""
    kind = getattr(op.tiling, "kind", "global")
    if kind not in ("elementwise", "stencil") or not in_shapes:
        return None
    if any(tuple(s) != tuple(in_shapes[0]) for s in in_shapes):
        return None
    try:
        declared = op.output_shape(*in_shapes)
    except Exception:
        declared = None
    if declared is not None and tuple(declared) != tuple(in_shapes[0]):
        return None
    return int(op.tiling.radius) if kind == "stencil" else 0


def _fail(name: str, where: str, e: BaseException):
    msg = str(e) if isinstance(e, SubZeroError) else f"operator {name!r} failed: {type(e).__name__}: {e}"
    return RuntimeError(f"{MARK}{msg} (on {where}){MARK}")


def _tile_task(run_dir: str, tile_size, name: str, op, inputs: list[str], strategies,
               capture: bool, out_shape, in_shapes, tile: Tile) -> TaskResult:
    """One tile of a tile-parallel operator, on a Spark executor."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    where = f"tile {tile.describe()}"
    try:
        ins = [arrays.read_region(a, tile.read_slices()) for a in inputs]
        t0 = time.perf_counter()
        out, full, pay, ctx = run_operator(name, op, ins, strategies, capture)
        run_s = time.perf_counter() - t0
        out = np.asarray(out.data if isinstance(out, xr.DataArray) else out)
        if out.shape != tile.read_shape():
            raise OperatorError(f"operator {name!r} is declared {op.tiling.kind} but returned shape "
                                f"{out.shape} for an input tile of shape {tile.read_shape()}; "
                                f"declare it global")
        arrays.write_region(name, tile.core_slices(), out[tile.core_in_read()])
        local = [tile.read_shape()] * len(inputs)
        full = globalize(full, tile, out_shape, in_shapes, local)
        pay = globalize(pay, tile, out_shape, in_shapes, local)
    except Exception as e:
        raise _fail(name, where, e) from None
    return TaskResult(tile.index, full, pay, tuple(out_shape), str(out.dtype), run_s, ctx.lwrite_seconds)


def _global_task(run_dir: str, tile_size, name: str, op, inputs: list[str], strategies,
                 capture: bool, _index) -> TaskResult:
    """A global operator: one task on the whole arrays."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    try:
        ins = [arrays.read_value(a) for a in inputs]
        t0 = time.perf_counter()
        out, full, pay, ctx = run_operator(name, op, ins, strategies, capture)
        run_s = time.perf_counter() - t0
        arrays.write(name, out)
        arr = out.data if isinstance(out, xr.DataArray) else out
    except Exception as e:
        raise _fail(name, "the whole array", e) from None
    return TaskResult((0,), full, pay, shape_of(out), str(arr.dtype), run_s, ctx.lwrite_seconds)


def _partial_task(run_dir: str, tile_size, name: str, op, inputs: list[str], tile: Tile):
    """One tile's partial result of an aggregating operator (e.g. a whole-array sum)."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    try:
        return op.partial(*[arrays.read_region(a, tile.read_slices()) for a in inputs])
    except Exception as e:
        raise _fail(name, f"tile {tile.describe()}", e) from None


def _aggregate(sc, name, op, inputs, in_shapes, strategies, arrays: ArrayStore, capture: bool):
    """A whole-array reduction as a Spark aggregation: partials per tile, merged
    on the executors in a tree, finished on the driver.  Its lineage is one
    all-to-all pair, written by the runtime."""
    from subzero.capture.buffer import LineageBuffer
    from subzero.capture.context import Context
    from subzero.capture.runner import normalise_output
    tiles = tiles_for(in_shapes[0], arrays.tile, 0)
    fn = partial(_partial_task, str(arrays.dir.parent), arrays.tile, name, op, list(inputs))
    rdd = sc.parallelize(tiles, len(tiles)).map(fn)
    try:
        state = rdd.treeReduce(op.merge)
    except Exception as e:
        _raise_from_spark(e, name)
    t0 = time.perf_counter()
    out = normalise_output(name, op, op.finish(state))
    arrays.write(name, out)
    full = None
    if capture and any(s.stored for s in strategies):
        buf = LineageBuffer(name, len(inputs), out.ndim, [len(s) for s in in_shapes])
        ctx = Context(name, op, frozenset(s.mode for s in strategies if s.stored), in_shapes,
                      out.shape, buf)
        every = [np.argwhere(np.ones(s, bool)) for s in in_shapes]
        ctx.lwrite(np.argwhere(np.ones(out.shape, bool)), *every)
        full, _ = buf.finish(out.shape, in_shapes)
    arr = out.data if isinstance(out, xr.DataArray) else out
    return [TaskResult((0,), full, None, shape_of(out), str(arr.dtype), time.perf_counter() - t0, 0.0)]


def _raise_from_spark(e: Exception, name: str):
    text = str(e)
    if MARK in text:
        msg = text.split(MARK)[1]
        raise OperatorError(f"{msg} [Spark engine; --engine local runs it in-process]") from None
    raise SparkError(f"Spark failed while running operator {name!r}: {_reason(text, e)}; "
                     f"try --engine local") from None


def _collect(rdd, name: str) -> list[TaskResult]:
    """Run a job; an operator failure in a task becomes one clear line."""
    try:
        return rdd.collect()
    except Exception as e:
        _raise_from_spark(e, name)


def _reason(text: str, e: Exception) -> str:
    """The informative line of a Py4J error: Spark's stage failure or root cause."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for key in ("Job aborted due to stage failure", "Caused by:", "Exception:"):
        for ln in lines:
            if key in ln and "Py4JJavaError" not in ln:
                return ln[:300]
    return (lines[0] if lines else type(e).__name__)[:300]


def run_spark(wf: Workflow, input_values: dict[str, Any], strategies: dict[str, tuple[Strategy, ...]],
              arrays: ArrayStore, lineage: LineageStore | None, spark, capture: bool = True,
              log: Callable[[str], None] | None = None, progress=None) -> list[OpStats]:
    """Run every operator of ``wf`` as Spark jobs; store arrays and lineage; return statistics."""
    sc = spark.sparkContext
    ship_workflow_modules(wf)
    run_dir = str(arrays.dir.parent)
    log = log or (lambda msg: None)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, v in input_values.items():
        arrays.write(name, v)
        shapes[name] = shape_of(v)
    stats = []
    for name in wf.order():
        step = wf.steps[name]
        op = step.operator
        in_shapes = [shapes[a] for a in step.inputs]
        strat = strategies[name]
        halo = tile_plan(op, in_shapes)
        t0 = time.perf_counter()
        if _aggregates(op, in_shapes, strat):
            log(f"{name}: aggregation over {len(tiles_for(in_shapes[0], arrays.tile))} tile(s), "
                f"merged in a tree")
            results = _aggregate(sc, name, op, step.inputs, in_shapes, strat, arrays, capture)
        elif halo is None:
            log(f"{name}: {op.tiling.kind} operator, one task on the whole array")
            fn = partial(_global_task, run_dir, arrays.tile, name, op, list(step.inputs), strat, capture)
            results = _collect(sc.parallelize([0], 1).map(fn), name)
        else:
            out_shape = in_shapes[0]
            tiles = tiles_for(out_shape, arrays.tile, halo)
            dtype = _probe_dtype(name, op, arrays, step.inputs, tiles[0], strat)
            arrays.create(name, out_shape, dtype)
            log(f"{name}: {len(tiles)} tile task(s) of up to {arrays.tile} cells per axis"
                + (f", halo {halo}" if halo else ""))
            fn = partial(_tile_task, run_dir, arrays.tile, name, op, list(step.inputs), strat, capture,
                         out_shape, in_shapes)
            results = _collect(sc.parallelize(tiles, len(tiles)).map(fn), name)
        wall = time.perf_counter() - t0
        out_shape = results[0].out_shape
        shapes[name] = out_shape
        full = concat_pairs([r.full for r in results], len(in_shapes))
        pay = concat_pairs([r.pay for r in results], len(in_shapes))
        st = OpStats(name, type(op).__name__, list(step.inputs), [str(s) for s in strat], out_shape,
                     dtype=results[0].dtype, nbytes=int(np.prod(out_shape)) * np.dtype(results[0].dtype).itemsize,
                     run_s=wall, lwrite_s=sum(r.lwrite_s for r in results))
        t1 = time.perf_counter()
        if capture and lineage is not None:
            st.pairs = (full.n if full else 0) + (pay.n if pay else 0)
            store_lineage(name, op, strat, full, pay, out_shape, in_shapes, lineage, st)
        st.lineage_s = time.perf_counter() - t1
        stats.append(st)
        if progress is not None:
            progress.update(1)
    return stats


def _probe_dtype(name, op, arrays: ArrayStore, inputs, tile: Tile, strategies) -> np.dtype:
    """The output dtype, from running the operator on the first tile in the driver
    (tasks write into an array that must exist with its dtype before they start)."""
    ins = [arrays.read_region(a, tile.read_slices()) for a in inputs]
    try:
        out, _, _, _ = run_operator(name, op, ins, (), capture=False)
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"operator {name!r} failed on tile {tile.describe()}: "
                            f"{type(e).__name__}: {e}") from None
    return np.asarray(out.data if isinstance(out, xr.DataArray) else out).dtype
