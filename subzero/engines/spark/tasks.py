"""Executor side of the Spark engine: the functions a Spark task runs.

Each task reads its input regions straight from the run's Zarr arrays, runs
the operator on its tile (or stage of operators, or whole array) with the same
``ctx``/``lwrite`` as the in-process engine, writes its output region back,
and encodes its share of the lineage into shards named for its attempt
(:mod:`subzero.storage.shards`); only a small :class:`TaskResult` goes back to
the driver.  A failure is raised as :class:`~subzero.errors.TaskFailed`
carrying a :class:`~subzero.engines.spark.failures.TaskFailure` record, so
that Spark may retry the attempt and the driver can raise the error the
in-process engine would; it is raised ``from None`` because the record
already carries the original traceback (the driver makes it the cause).

Everything here is plain functions of plain data (paths, the run's uid, tile
boxes, operators): they are pickled into the tasks; nothing reaches back to the
driver's objects.  The run's uid (``run_uid``) binds what a task writes to the
run (its lineage shards) and checks what it reads (the arrays' sidecars).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.capture.components import TileComponents, TileLabels, region_cells, tile_components
from subzero.capture.runner import array_context, run_operator, run_tile, shape_of
from subzero.capture.tiles import Shape, Tile, input_slices
from subzero.engines.lineage import TileShard, write_tile_shards
from subzero.engines.spark.failures import failed
from subzero.engines.spark.stages import Box, Member, last_readers, plan_boxes, within
from subzero.model.labelled import is_dataarray
from subzero.model.modes import Mode
from subzero.model.operator import Aggregating, Gathering, Labelling, Operator, OperatorContext
from subzero.model.statistic import Statistic, block_around
from subzero.model.strategy import Strategy, modes_needed
from subzero.storage.arrays import ArrayStore
from subzero.storage.inputs import RegionReadable


@dataclass
class TaskResult:
    index: tuple[int, ...]
    full: Pairs | None
    pay: Pairs | None
    out_shape: tuple[int, ...]
    dtype: str
    run_s: float
    lwrite_s: float
    #: peak resident memory of the Python worker that ran the task, in bytes (a reused
    #: worker's largest task so far): tasks are bounded by tiles and halos, not images
    rss: int = 0
    #: the task attempt that wrote the output whole (global tasks), for the driver to commit
    attempt: int | None = None
    #: the lineage the task wrote as shards (then ``full`` and ``pay`` are None)
    shards: list[TileShard] | None = None
    #: pairs the task captured
    pairs: int = 0


def _lineage(lineage_dir: str | None, tile_index: tuple[int, ...], name: str, op: Operator,
             strategies: tuple[Strategy, ...], full: Pairs | None, pay: Pairs | None, out_shape: Shape,
             in_shapes: Sequence[Shape], run_uid: str | None) -> dict[str, Any]:
    """The lineage part of a task's result: with the run's lineage folder, the task
    encodes its pairs into shards there itself (committed by the driver for the
    attempt whose result it receives; bound to the run ``run_uid`` when it has one)
    and returns only what it wrote; without one, the pairs themselves."""
    n = (full.n if full is not None else 0) + (pay.n if pay is not None else 0)
    if lineage_dir is None:
        return {"full": full, "pay": pay, "pairs": n}
    stem = "t" + "-".join(str(int(i)) for i in tile_index)
    shards = write_tile_shards(lineage_dir, stem, attempt_id(), name, op, strategies, full, pay,
                               out_shape, in_shapes, run_uid)
    return {"full": None, "pay": None, "shards": shards, "pairs": n}


def peak_rss() -> int:
    """This process's peak resident memory in bytes (0 where it cannot be told)."""
    try:
        import resource
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return 0
    return int(kb) * (1 if sys.platform == "darwin" else 1024)


def tile_task(run_dir: str, tile_size: int, run_uid: str | None, lineage_dir: str | None, name: str, op: Operator,
               inputs: list[str], strategies: tuple[Strategy, ...], capture: bool, out_shape: Shape,
               in_shapes: list[Shape], stat: Any, tile: Tile) -> TaskResult:
    """One tile of a tile-parallel operator, on a Spark executor (``stat``: the
    operator's statistic, computed over all tiles beforehand)."""
    arrays = ArrayStore(run_dir, tile=tile_size, run_uid=run_uid)
    where = f"tile {tile.describe()}"
    try:
        ins = [arrays.read_region(a, input_slices(tile, s)) for a, s in zip(inputs, in_shapes)]
        done = run_tile(name, op, ins, strategies, capture, tile, out_shape, in_shapes,
                        statistic=stat)
        arrays.write_region(name, tile.core_slices(), done.core)
        lin = _lineage(lineage_dir, tile.index, name, op, strategies, done.full, done.pay,
                       out_shape, in_shapes, run_uid)
    except Exception as e:
        raise failed(name, where, e) from None
    return TaskResult(tile.index, out_shape=tuple(out_shape), dtype=str(done.core.dtype),
                      run_s=done.run_s, lwrite_s=done.lwrite_s, rss=peak_rss(), **lin)


def stage_task(run_dir: str, tile_size: int, run_uid: str | None, lineage_dir: str | None, members: list[Member],
                capture: bool, shape: Shape, tile: Tile) -> list[TaskResult]:
    """One tile of a fused stage (:mod:`subzero.engines.stages`), on an executor."""
    return run_members(ArrayStore(run_dir, tile=tile_size, run_uid=run_uid), members, capture, shape, tile, True,
                       lineage_dir)


def run_members(arrays: ArrayStore, members: list[Member], capture: bool, shape: Shape, tile: Tile,
                write: bool, lineage_dir: str | None = None) -> list[TaskResult]:
    """A stage's operators on one tile, in workflow order; an intermediate stays in
    memory while operators of the stage still read it; with ``write`` every core
    goes to its Zarr array (off: the driver's dtype probe)."""
    boxes = plan_boxes(members, tile.core, shape)
    last = last_readers(members)
    held: dict[str, tuple[Box, np.ndarray]] = {}
    results = []
    for k, m in enumerate(members):
        need, read = boxes[m.name]
        try:
            ins = []
            for a, sh in zip(m.inputs, m.in_shapes):
                if a in held:
                    box, data = held[a]
                    ins.append(np.array(data[within(read, box)]))
                else:
                    ins.append(arrays.read_region(a, input_slices(tile, sh, read)))
            done = run_tile(m.name, m.op, ins, m.strategies, capture, Tile(tile.index, tile.core, read),
                            tuple(shape), [tuple(x) for x in m.in_shapes])
            del ins
            if write:
                arrays.write_region(m.name, tile.core_slices(), done.core)
            lin = _lineage(lineage_dir if write else None, tile.index, m.name, m.op, m.strategies,
                           done.full, done.pay, shape, m.in_shapes, arrays.run_uid)
        except Exception as e:
            raise failed(m.name, f"tile {tile.describe()}", e) from None
        if last[m.name] > k:
            assert done.whole is not None
            held[m.name] = (need, done.whole[within(need, read)])
        for a in [a for a in held if last[a] <= k]:
            del held[a]
        results.append(TaskResult(tile.index, out_shape=tuple(shape),
                                  dtype=str(_native(done.core.dtype)), run_s=done.run_s,
                                  lwrite_s=done.lwrite_s, rss=peak_rss(), **lin))
    return results


def _native(dtype: np.dtype) -> np.dtype:
    """The dtype as the store keeps it (native byte order)."""
    return dtype if dtype.byteorder in ("=", "|") else dtype.newbyteorder("=")


def copy_task(run_dir: str, tile_size: int, run_uid: str | None,
              jobs: list[tuple[str, RegionReadable, Tile]]) -> int:
    """Copy one tile of each of several inputs from their sources into the run's store."""
    arrays = ArrayStore(run_dir, tile=tile_size, run_uid=run_uid)
    for name, source, tile in jobs:
        try:
            arrays.write_region(name, tile.core_slices(), source.read_region(tile.core_slices()))
        except Exception as e:
            raise failed(f"(input {name})", f"tile {tile.describe()}", e) from None
    return len(jobs)


def global_task(run_dir: str, tile_size: int, run_uid: str | None, lineage_dir: str | None, name: str,
                op: Operator, inputs: list[str], strategies: tuple[Strategy, ...], capture: bool,
                _index: int) -> TaskResult:
    """A global operator: one task on the whole arrays."""
    arrays = ArrayStore(run_dir, tile=tile_size, run_uid=run_uid)
    try:
        ins = [arrays.read_value(a) for a in inputs]
        t0 = time.perf_counter()
        out, full, pay, ctx = run_operator(name, op, ins, strategies, capture)
        run_s = time.perf_counter() - t0
        attempt = attempt_id()
        arrays.write(name, out, attempt=attempt)     # moved into place by the driver
        arr = out.data if is_dataarray(out) else out
        lin = _lineage(lineage_dir, (0,), name, op, strategies, full, pay, shape_of(out),
                       [shape_of(v) for v in ins], run_uid)
    except Exception as e:
        raise failed(name, "the whole array", e) from None
    return TaskResult((0,), out_shape=shape_of(out), dtype=str(arr.dtype), run_s=run_s,
                      lwrite_s=ctx.lwrite_seconds, rss=peak_rss(), attempt=attempt, **lin)


def globals_task(run_dir: str, tile_size: int, run_uid: str | None, lineage_dir: str | None, capture: bool,
                  job: tuple[str, Operator, list[str], tuple[Strategy, ...]]) -> TaskResult:
    """One of several independent global operators run as one job: ``job`` is
    (name, operator, inputs, strategies)."""
    name, op, inputs, strategies = job
    return global_task(run_dir, tile_size, run_uid, lineage_dir, name, op, inputs, strategies, capture, 0)


def attempt_id() -> int:
    """This Spark task attempt's id, unique in the application (0 outside Spark)."""
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        return int(ctx.taskAttemptId()) if ctx is not None else 0
    except ImportError:
        return 0


def partial_task(run_dir: str, tile_size: int, run_uid: str | None, name: str, op: Aggregating,
                 inputs: list[str], tile: Tile) -> Any:
    """One tile's partial result of an aggregating operator (e.g. a whole-array sum)."""
    arrays = ArrayStore(run_dir, tile=tile_size, run_uid=run_uid)
    try:
        return op.partial(*[arrays.read_region(a, tile.read_slices()) for a in inputs])
    except Exception as e:
        raise failed(name, f"tile {tile.describe()}", e) from None


def gather_task(run_dir: str, tile_size: int, run_uid: str | None, lineage_dir: str | None, name: str,
                op: Operator, source: str, strategies: tuple[Strategy, ...], capture: bool,
                out_shape: Sequence[int], in_shape: Sequence[int], tile: Tile) -> TaskResult:
    """One output tile of a gather operator: it reads the input box its cells come
    from, writes its chunk, and returns the lineage of its cells."""
    assert isinstance(op, Gathering)        # run_step sends only Gathering operators here
    arrays = ArrayStore(run_dir, tile=tile_size, run_uid=run_uid)
    out_shape, in_shape = tuple(out_shape), tuple(in_shape)
    try:
        t0 = time.perf_counter()
        box = op.input_box(tile.core, in_shape)
        out = op.gather(arrays.read_region(source, tuple(slice(a, b) for a, b in box)), box,
                        tile.core, in_shape)
        arrays.write_region(name, tile.core_slices(), out)
        run_s = time.perf_counter() - t0
        modes = modes_needed(strategies) if capture else frozenset()
        full, pay, lwrite_s = _emitted(name, op, modes if Mode.FULL in modes else frozenset(),
                                       [in_shape], out_shape, lambda ctx: op.emit_tile(ctx, tile.core))
        lin = _lineage(lineage_dir, tile.index, name, op, strategies, full, pay, out_shape, [in_shape],
                       run_uid)
    except Exception as e:
        raise failed(name, f"tile {tile.describe()}", e) from None
    return TaskResult(tile.index, out_shape=out_shape, dtype=str(out.dtype), run_s=run_s,
                      lwrite_s=lwrite_s, rss=peak_rss(), **lin)


def _emitted(name: str, op: Operator, modes: frozenset[Mode], in_shapes: list[Shape], out_shape: Shape,
             emit: Callable[[OperatorContext], None]) -> tuple[Pairs | None, Pairs | None, float]:
    """Lineage a task writes itself in array coordinates (``emit(ctx)``, for operators
    whose task is not a plain ``run``): (full pairs, payload pairs, seconds in lwrite),
    nothing when no ``modes`` are asked for."""
    if not modes:
        return None, None, 0.0
    ctx = array_context(name, op, modes, in_shapes, out_shape)
    emit(ctx)
    full, pay = ctx.finish(out_shape)
    return full, pay, ctx.lwrite_seconds


def stat_task(run_dir: str, tile_size: int, run_uid: str | None, name: str, stat: Statistic, source: str,
              shape: Sequence[int], prior: Any, tile: Tile) -> Any:
    """One tile's partial of an operator's whole-array statistic (one round)."""
    arrays = ArrayStore(run_dir, tile=tile_size, run_uid=run_uid)
    try:
        box, core = block_around(tile.core, int(stat.halo), shape)
        block = arrays.read_region(source, tuple(slice(a, b) for a, b in box))
        return stat.partial(block, core, tuple(a for a, _ in box), tuple(shape), prior)
    except Exception as e:
        raise failed(name, f"tile {tile.describe()}", e) from None


def label_task(run_dir: str, tile_size: int, run_uid: str | None, name: str, op: Labelling, source: str,
               shape: Sequence[int], stat: Any, tile: Tile) -> TileComponents:
    """One tile's regions, labelled on its core alone, summarised for the merge."""
    arrays = ArrayStore(run_dir, tile=tile_size, run_uid=run_uid)
    try:
        mask = op.foreground(arrays.read_region(source, tile.core_slices()), stat)
        return tile_components(mask, tile.core, shape, op.connectivity, tile.index)[1]
    except Exception as e:
        raise failed(name, f"tile {tile.describe()}", e) from None


def relabel_task(run_dir: str, tile_size: int, run_uid: str | None, lineage_dir: str | None, name: str,
                 op: Operator, source: str, shape: Sequence[int], stat: Any,
                 strategies: tuple[Strategy, ...], capture: bool,
                 job: tuple[Tile, TileLabels]) -> TaskResult:
    """One tile's final labels, written to its chunk, and the lineage of its cells:
    the regions inside its core, the regions spanning tiles that it owns (gathered
    from their bounding boxes) and, unless composite, its background cells."""
    assert isinstance(op, Labelling)        # _components sends only Labelling operators here
    tile, answer = job
    arrays = ArrayStore(run_dir, tile=tile_size, run_uid=run_uid)
    shape = tuple(shape)
    try:
        t0 = time.perf_counter()
        mask = op.foreground(arrays.read_region(source, tile.core_slices()), stat)
        local, _ = tile_components(mask, tile.core, shape, op.connectivity, tile.index)
        out = answer.relabel[local]
        arrays.write_region(name, tile.core_slices(), out)
        run_s = time.perf_counter() - t0

        def emit(ctx: OperatorContext) -> None:
            origin = np.asarray(tile.origin, np.int64)
            inside = (out > 0) & ~np.isin(out, answer.spanning)
            cells, ids = [np.argwhere(inside) + origin], [out[inside]]
            for r in answer.owned:
                box = tuple(slice(a, b + 1) for a, b in zip(r.lo, r.hi))
                got = region_cells(op.foreground(arrays.read_region(source, box), stat), r.lo,
                                   r.first, shape, op.connectivity)
                cells.append(got)
                ids.append(np.full(len(got), r.label, np.int32))
            op.write_lineage(ctx, np.concatenate(cells), np.concatenate(ids),
                             lambda: np.argwhere(out == 0) + origin)

        full, pay, lwrite_s = _emitted(name, op, modes_needed(strategies) if capture else frozenset(),
                                       [shape], shape, emit)
        lin = _lineage(lineage_dir, tile.index, name, op, strategies, full, pay, shape, [shape], run_uid)
    except Exception as e:
        raise failed(name, f"tile {tile.describe()}", e) from None
    return TaskResult(tile.index, out_shape=shape, dtype=str(out.dtype), run_s=run_s,
                      lwrite_s=lwrite_s, rss=peak_rss(), **lin)


