"""The Spark engine: a workflow's operators as Spark jobs over tiles.

Per operator, in the order the driver loop (:mod:`subzero.engines.driver`)
gives, :class:`SparkEngine` launches one job:

* elementwise and stencil operators (declared ``tiling``) run one task per
  tile — the Zarr chunks of the output — reading their input tiles (plus a
  halo of the stencil radius) straight from the run's Zarr arrays and
  writing their output tile back; nothing but lineage and statistics comes
  back to the driver;
* operators declared global, or whose inputs do not tile alike, run as one
  task on the whole arrays (the run log says so);
* whole-array reductions run as per-tile partials merged in a tree;
* structural operators that pick cells (``gather`` tiling: slices) run one
  task per output tile, reading only the input box its cells come from;
* connected-component labelling (``components`` tiling) runs in passes over
  tiles: the mask's statistic (partials merged in a tree), per-tile labels
  merged across tile borders on the driver, then per-tile relabelling and
  lineage (:mod:`subzero.capture.components`).

Lineage is captured inside the tasks with the same ``ctx``/``lwrite`` as
the local engine; the runtime translates tile-local cells to array cells and
keeps only the lineage of the tile's own output cells.  Each task encodes its
pairs into a shard per stored strategy, named for its attempt
(:mod:`subzero.storage.shards`), and returns only what it wrote; the driver
loop commits the shards of the attempts whose results Spark delivered, so a
retried or speculative attempt can neither duplicate nor lose lineage.  (A
whole-array aggregation's one all-to-all pair is written by the driver.)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import xarray as xr

from subzero.capture.buffer import Pairs
from subzero.capture.components import TileComponents, TileLabels, merge_tiles, region_cells, tile_components
from subzero.capture.runner import array_context, run_operator, run_tile, shape_of
from subzero.capture.tiles import Tile, concat_pairs, input_slices, task_tile, tile_plan, tiles_for
from subzero.engines.base import StepResult
from subzero.engines.lineage import TileShard, write_tile_shards
from subzero.engines.progress import Progress
from subzero.engines.session import SparkError, jvm_log_hint, ship_workflow_modules
from subzero.engines.stages import Box, Member, last_readers, next_stage, plan_boxes, tiled_shape, within
from subzero.errors import OperatorError, SubZeroError
from subzero.model.modes import Mode
from subzero.model.statistic import Statistic, block_around
from subzero.model.strategy import BLACKBOX, Strategy, modes_needed
from subzero.model.workflow import Step, Workflow
from subzero.storage.arrays import ArrayStore
from subzero.storage.inputs import is_region_source
from subzero.tuning import PROBE_CELLS, PROGRESS_POLL_S, SPARK_CONCURRENT_JOBS, STAT_BLOCK_TILES

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
    #: peak resident memory of the Python worker that ran the task, in bytes (a reused
    #: worker's largest task so far): tasks are bounded by tiles and halos, not images
    rss: int = 0
    #: the task attempt that wrote the output whole (global tasks), for the driver to commit
    attempt: int | None = None
    #: the lineage the task wrote as shards (then ``full`` and ``pay`` are None)
    shards: list[TileShard] | None = None
    #: pairs the task captured
    pairs: int = 0


def _lineage(lineage_dir: str | None, tile_index, name: str, op, strategies, full: Pairs | None,
             pay: Pairs | None, out_shape, in_shapes) -> dict[str, Any]:
    """The lineage part of a task's result: with the run's lineage folder, the task
    encodes its pairs into shards there itself (committed by the driver for the
    attempt whose result it receives) and returns only what it wrote; without one,
    the pairs themselves."""
    n = (full.n if full is not None else 0) + (pay.n if pay is not None else 0)
    if lineage_dir is None:
        return {"full": full, "pay": pay, "pairs": n}
    stem = "t" + "-".join(str(int(i)) for i in tile_index)
    shards = write_tile_shards(lineage_dir, stem, _attempt_id(), name, op, strategies, full, pay,
                               out_shape, in_shapes)
    return {"full": None, "pay": None, "shards": shards, "pairs": n}


def peak_rss() -> int:
    """This process's peak resident memory in bytes (0 where it cannot be told)."""
    try:
        import resource
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return 0
    return int(kb) * (1 if sys.platform == "darwin" else 1024)


def _aggregates(op, in_shapes, strategies) -> bool:
    """Run as a Spark aggregation: declared so, one input, all-to-all, and only
    Full (or no) lineage asked for (its pair is written by the runtime)."""
    return (getattr(op.tiling, "kind", "") == "aggregate" and len(in_shapes) == 1
            and all(hasattr(op, f) for f in ("partial", "merge", "finish"))
            and op.is_all_to_all(0)
            and all(s.mode.value in ("full", "map", "blackbox") for s in strategies))


def _gathers(op, in_shapes) -> bool:
    """A structural operator of one input whose output tiles read input boxes."""
    return (getattr(op.tiling, "kind", "") == "gather" and len(in_shapes) == 1
            and all(hasattr(op, f) for f in ("input_box", "gather", "emit_tile")))


def _labels(op, in_shapes) -> bool:
    """Run as connected components over tiles: declared so, one input."""
    return (getattr(op.tiling, "kind", "") == "components" and len(in_shapes) == 1
            and all(hasattr(op, f) for f in ("foreground", "write_lineage", "connectivity")))


def _fail(name: str, where: str, e: BaseException):
    msg = str(e) if isinstance(e, SubZeroError) else f"operator {name!r} failed: {type(e).__name__}: {e}"
    return RuntimeError(f"{MARK}{msg} (on {where}){MARK}")


def _tile_task(run_dir: str, tile_size, lineage_dir: str | None, name: str, op, inputs: list[str],
               strategies, capture: bool, out_shape, in_shapes, stat, tile: Tile) -> TaskResult:
    """One tile of a tile-parallel operator, on a Spark executor (``stat``: the
    operator's statistic, computed over all tiles beforehand)."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    where = f"tile {tile.describe()}"
    try:
        ins = [arrays.read_region(a, input_slices(tile, s)) for a, s in zip(inputs, in_shapes)]
        done = run_tile(name, op, ins, strategies, capture, tile, out_shape, in_shapes,
                        statistic=stat)
        arrays.write_region(name, tile.core_slices(), done.core)
        lin = _lineage(lineage_dir, tile.index, name, op, strategies, done.full, done.pay,
                       out_shape, in_shapes)
    except Exception as e:
        raise _fail(name, where, e) from None
    return TaskResult(tile.index, out_shape=tuple(out_shape), dtype=str(done.core.dtype),
                      run_s=done.run_s, lwrite_s=done.lwrite_s, rss=peak_rss(), **lin)


def _stage_task(run_dir: str, tile_size, lineage_dir: str | None, members: list[Member],
                capture: bool, shape, tile: Tile) -> list[TaskResult]:
    """One tile of a fused stage (:mod:`subzero.engines.stages`), on an executor."""
    return run_members(ArrayStore(run_dir, tile=tile_size), members, capture, shape, tile, True,
                       lineage_dir)


def run_members(arrays: ArrayStore, members: list[Member], capture: bool, shape, tile: Tile,
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
                           done.full, done.pay, shape, m.in_shapes)
        except Exception as e:
            raise _fail(m.name, f"tile {tile.describe()}", e) from None
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


def _copy_task(run_dir: str, tile_size, jobs) -> int:
    """Copy one tile of each of several inputs from their sources into the run's store."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    for name, source, tile in jobs:
        try:
            arrays.write_region(name, tile.core_slices(), source.read_region(tile.core_slices()))
        except Exception as e:
            raise _fail(f"(input {name})", f"tile {tile.describe()}", e) from None
    return len(jobs)


def _global_task(run_dir: str, tile_size, lineage_dir: str | None, name: str, op,
                 inputs: list[str], strategies, capture: bool, _index) -> TaskResult:
    """A global operator: one task on the whole arrays."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    try:
        ins = [arrays.read_value(a) for a in inputs]
        t0 = time.perf_counter()
        out, full, pay, ctx = run_operator(name, op, ins, strategies, capture)
        run_s = time.perf_counter() - t0
        attempt = _attempt_id()
        arrays.write(name, out, attempt=attempt)     # moved into place by the driver
        arr = out.data if isinstance(out, xr.DataArray) else out
        lin = _lineage(lineage_dir, (0,), name, op, strategies, full, pay, shape_of(out),
                       [shape_of(v) for v in ins])
    except Exception as e:
        raise _fail(name, "the whole array", e) from None
    return TaskResult((0,), out_shape=shape_of(out), dtype=str(arr.dtype), run_s=run_s,
                      lwrite_s=ctx.lwrite_seconds, rss=peak_rss(), attempt=attempt, **lin)


def _globals_task(run_dir: str, tile_size, lineage_dir: str | None, capture: bool,
                  job) -> TaskResult:
    """One of several independent global operators run as one job: ``job`` is
    (name, operator, inputs, strategies)."""
    name, op, inputs, strategies = job
    return _global_task(run_dir, tile_size, lineage_dir, name, op, inputs, strategies, capture, 0)


def _attempt_id() -> int:
    """This Spark task attempt's id, unique in the application (0 outside Spark)."""
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        return int(ctx.taskAttemptId()) if ctx is not None else 0
    except ImportError:
        return 0


def _partial_task(run_dir: str, tile_size, name: str, op, inputs: list[str], tile: Tile):
    """One tile's partial result of an aggregating operator (e.g. a whole-array sum)."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    try:
        return op.partial(*[arrays.read_region(a, tile.read_slices()) for a in inputs])
    except Exception as e:
        raise _fail(name, f"tile {tile.describe()}", e) from None


def _aggregate(sc, name, op, inputs, in_shapes, strategies, arrays: ArrayStore, capture: bool,
               on_tasks: TaskCallback | None = None) -> list[TaskResult]:
    """A whole-array reduction as a Spark aggregation: partials per tile, merged
    on the executors in a tree, finished on the driver.  Its lineage is one
    all-to-all pair, written by the runtime."""
    from subzero.capture.runner import normalise_output
    tiles = tiles_for(in_shapes[0], arrays.tile, 0)
    fn = partial(_partial_task, str(arrays.dir.parent), arrays.tile, name, op, list(inputs))
    rdd = sc.parallelize(tiles, len(tiles)).map(fn)
    state = run_job(sc, name, lambda: rdd.treeReduce(op.merge), on_tasks)
    t0 = time.perf_counter()
    out = normalise_output(name, op, op.finish(state))
    arrays.write(name, out)
    full = None
    if capture and any(s.stored for s in strategies):
        ctx = array_context(name, op, {s.mode for s in strategies if s.stored}, in_shapes,
                            out.shape)
        every = [np.argwhere(np.ones(s, bool)) for s in in_shapes]
        ctx.lwrite(np.argwhere(np.ones(out.shape, bool)), *every)
        assert ctx.buffer is not None
        full, _ = ctx.buffer.finish(out.shape, in_shapes)
    arr = out.data if isinstance(out, xr.DataArray) else out
    return [TaskResult((0,), full, None, shape_of(out), str(arr.dtype), time.perf_counter() - t0, 0.0,
                       pairs=full.n if full is not None else 0)]


def _gather_task(run_dir: str, tile_size, lineage_dir: str | None, name: str, op, source: str,
                 strategies, capture: bool, out_shape, in_shape, tile: Tile) -> TaskResult:
    """One output tile of a gather operator: it reads the input box its cells come
    from, writes its chunk, and returns the lineage of its cells."""
    arrays = ArrayStore(run_dir, tile=tile_size)
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
        lin = _lineage(lineage_dir, tile.index, name, op, strategies, full, pay, out_shape, [in_shape])
    except Exception as e:
        raise _fail(name, f"tile {tile.describe()}", e) from None
    return TaskResult(tile.index, out_shape=out_shape, dtype=str(out.dtype), run_s=run_s,
                      lwrite_s=lwrite_s, rss=peak_rss(), **lin)


def _emitted(name: str, op, modes, in_shapes, out_shape,
             emit: Callable[[Any], None]) -> tuple[Pairs | None, Pairs | None, float]:
    """Lineage a task writes itself in array coordinates (``emit(ctx)``, for operators
    whose task is not a plain ``run``): (full pairs, payload pairs, seconds in lwrite),
    nothing when no ``modes`` are asked for."""
    if not modes:
        return None, None, 0.0
    ctx = array_context(name, op, modes, in_shapes, out_shape)
    emit(ctx)
    full, pay = ctx.finish(out_shape)
    return full, pay, ctx.lwrite_seconds


def _stat_task(run_dir: str, tile_size, name: str, stat: Statistic, source: str, shape, prior,
               tile: Tile):
    """One tile's partial of an operator's whole-array statistic (one round)."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    try:
        box, core = block_around(tile.core, int(stat.halo), shape)
        block = arrays.read_region(source, tuple(slice(a, b) for a, b in box))
        return stat.partial(block, core, tuple(a for a, _ in box), tuple(shape), prior)
    except Exception as e:
        raise _fail(name, f"tile {tile.describe()}", e) from None


def _label_task(run_dir: str, tile_size, name: str, op, source: str, shape, stat,
                tile: Tile) -> TileComponents:
    """One tile's regions, labelled on its core alone, summarised for the merge."""
    arrays = ArrayStore(run_dir, tile=tile_size)
    try:
        mask = op.foreground(arrays.read_region(source, tile.core_slices()), stat)
        return tile_components(mask, tile.core, shape, op.connectivity, tile.index)[1]
    except Exception as e:
        raise _fail(name, f"tile {tile.describe()}", e) from None


def _relabel_task(run_dir: str, tile_size, lineage_dir: str | None, name: str, op, source: str,
                  shape, stat, strategies, capture: bool, job: tuple[Tile, TileLabels]) -> TaskResult:
    """One tile's final labels, written to its chunk, and the lineage of its cells:
    the regions inside its core, the regions spanning tiles that it owns (gathered
    from their bounding boxes) and, unless composite, its background cells."""
    tile, answer = job
    arrays = ArrayStore(run_dir, tile=tile_size)
    shape = tuple(shape)
    try:
        t0 = time.perf_counter()
        mask = op.foreground(arrays.read_region(source, tile.core_slices()), stat)
        local, _ = tile_components(mask, tile.core, shape, op.connectivity, tile.index)
        out = answer.relabel[local]
        arrays.write_region(name, tile.core_slices(), out)
        run_s = time.perf_counter() - t0

        def emit(ctx) -> None:
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
        lin = _lineage(lineage_dir, tile.index, name, op, strategies, full, pay, shape, [shape])
    except Exception as e:
        raise _fail(name, f"tile {tile.describe()}", e) from None
    return TaskResult(tile.index, out_shape=shape, dtype=str(out.dtype), run_s=run_s,
                      lwrite_s=lwrite_s, rss=peak_rss(), **lin)


def _raise_from_spark(e: Exception, name: str) -> NoReturn:
    text = str(e)
    if MARK in text:
        msg = text.split(MARK)[1]
        raise OperatorError(f"{msg} [Spark engine; --engine local runs it in-process]") from None
    err = python_error(text)
    if err:
        hint = ""
        if err.startswith(("ModuleNotFoundError", "ImportError")):
            hint = ("; the Spark workers cannot import it: install it where they run or put its "
                    "folder on PYTHONPATH before starting SubZero")
        raise OperatorError(f"operator {name!r} failed in a Spark task: {err}{hint} "
                            f"[Spark engine; --engine local runs it in-process]") from None
    raise SparkError(f"Spark failed while running operator {name!r}: {_reason(text, e)}; "
                     f"try --engine local{jvm_log_hint()}") from None


def python_error(text: str) -> str:
    """``Type: message`` of the last Python traceback in a Spark error's text (a worker's
    exception, e.g. a module it cannot import), or empty when there is none."""
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return ""
    for ln in text[at:].splitlines()[1:]:
        if ln.strip() and not ln[:1].isspace():
            return ln.strip()[:300]
    return ""


#: ``on_tasks(done, total)``: a job's finished tasks, as they finish
TaskCallback = Callable[[int, int], None]


def collect(rdd, name: str, on_tasks: TaskCallback | None = None) -> list:
    """Run a job and return its results; an operator failure in a task becomes one
    clear line naming ``name`` (the operator).  ``on_tasks`` is told the job's
    finished tasks while it runs."""
    return run_job(rdd.context, name, rdd.collect, on_tasks)


def run_job(sc, name: str, action: Callable[[], Any], on_tasks: TaskCallback | None = None) -> Any:
    """``action()`` (a Spark action: collect, treeReduce) with :func:`collect`'s errors."""
    with _CtrlC(sc) as ctrl_c:
        try:
            if on_tasks is None:
                out = action()
            else:
                with _TaskWatch(sc, on_tasks):
                    out = action()
        except Exception as e:
            if ctrl_c.hit:
                raise KeyboardInterrupt from None
            _raise_from_spark(e, name)
    if ctrl_c.hit:          # the job ended before the cancellation reached it
        raise KeyboardInterrupt
    return out


class _CtrlC:
    """While a job runs, Ctrl-C cancels Spark's jobs from another thread and the job's
    failure becomes a KeyboardInterrupt (one line from the CLI; the run is failed
    'interrupted').  PySpark's own handler calls into Py4J from the signal handler,
    while the main thread is blocked in a Py4J call: Py4J then prints screenfuls of
    tracebacks.  A second Ctrl-C interrupts at once.  Only the main thread can
    handle signals; elsewhere this does nothing."""

    def __init__(self, sc):
        self.sc = sc
        self.hit = False
        self._installed = False
        self._prev: Any = None

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._prev = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def _on_sigint(self, signum, frame) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True
        threading.Thread(target=self._cancel, name="subzero-cancel", daemon=True).start()

    def _cancel(self) -> None:
        try:
            self.sc.cancelAllJobs()
        except Exception:
            pass            # the JVM is going away anyway

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._prev if self._prev is not None else signal.SIG_DFL)


class _TaskWatch:
    """Follows the tasks of the jobs this thread starts (one job group) from a thread
    that polls Spark's status tracker, and tells ``on_tasks``; a failure to poll only
    ends the watching."""

    def __init__(self, sc, on_tasks: TaskCallback, every: float = PROGRESS_POLL_S):
        self.sc, self.on_tasks, self.every = sc, on_tasks, every
        self.group = f"subzero-{uuid.uuid4().hex[:12]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="subzero-progress", daemon=True)

    def __enter__(self) -> _TaskWatch:
        self.sc.setJobGroup(self.group, "subzero")
        self.thread.start()
        return self

    def _poll(self) -> None:
        try:
            while not self.stop.wait(self.every):
                self._report()
        except Exception:
            return

    def _report(self) -> None:
        tracker = self.sc.statusTracker()
        done = total = 0
        for jid in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(jid)
            for sid in (job.stageIds if job is not None else ()):
                st = tracker.getStageInfo(sid)
                if st is not None:
                    done += st.numCompletedTasks
                    total += st.numTasks
        if total:
            self.on_tasks(min(done, total), total)

    def __exit__(self, et, *exc) -> None:
        self.stop.set()
        self.thread.join()
        try:
            if et is None:
                self._report()
        finally:
            for key in ("spark.jobGroup.id", "spark.job.description"):
                self.sc.setLocalProperty(key, None)


def _reason(text: str, e: Exception) -> str:
    """The informative line of a Py4J error: Spark's stage failure or root cause."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for key in ("Job aborted due to stage failure", "Caused by:", "Exception:"):
        for ln in lines:
            if key in ln and "Py4JJavaError" not in ln:
                return ln[:300]
    return (lines[0] if lines else type(e).__name__)[:300]


class SparkEngine:
    """Operators as Spark jobs over the run's Zarr arrays: tile tasks, one global
    task, or a tree aggregation (see the module's docstring).  What the jobs did is
    noted in the run's ``run.log``."""

    name = "spark"
    #: independent jobs the driver loop runs side by side (:mod:`subzero.engines.driver`)
    concurrent_jobs = SPARK_CONCURRENT_JOBS

    def __init__(self, spark, arrays: ArrayStore, log: Callable[[str], None] | None = None,
                 lineage_dir: str | os.PathLike | None = None):
        self.sc = spark.sparkContext
        self.arrays = arrays
        #: the run's lineage folder, where tasks write their lineage as shards (None:
        #: tasks return their pairs, and the driver writes them)
        self.lineage_dir = str(Path(lineage_dir).resolve()) if lineage_dir is not None else None
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.notes: list[str] = []
        self._log = log

    def note(self, msg: str) -> None:
        self.notes.append(msg)
        if self._log is not None:
            self._log(msg)

    def load_inputs(self, wf: Workflow, values: Mapping[str, Any]) -> None:
        """Store the run's inputs.  Inputs that read region by region (files, lazily
        built arrays: :class:`~subzero.storage.inputs.RegionSource`) are copied by the
        executors, one task per tile, in one job: the driver never holds them."""
        ship_workflow_modules(wf, [v for v in values.values() if is_region_source(v)])
        jobs = []
        for name, v in values.items():
            self.shapes[name] = shape_of(v)
            if is_region_source(v):
                shape = tuple(int(n) for n in v.shape)
                self.arrays.create(name, shape, np.dtype(v.dtype), getattr(v, "dims", None),
                                   getattr(v, "attrs", None))
                jobs += [(name, v, t) for t in tiles_for(shape, self.arrays.tile)]
            else:
                self.arrays.write(name, v)
        if jobs:
            # one task per tile position, copying that tile of every input: fewer, bigger tasks
            by_tile: dict[tuple, list] = {}
            for job in jobs:
                by_tile.setdefault(tuple(job[2].core), []).append(job)
            tasks = list(by_tile.values())
            self.note(f"inputs {', '.join(dict.fromkeys(n for n, _, _ in jobs))}: {len(jobs)} "
                      f"tile(s) in {len(tasks)} task(s), read from their sources on the executors")
            fn = partial(_copy_task, str(self.arrays.dir.parent), self.arrays.tile)
            t0 = time.perf_counter()
            collect(self.sc.parallelize(tasks, len(tasks)).map(fn), "(loading inputs)")
            self.note(f"  inputs done in {time.perf_counter() - t0:.2f} s")

    def resume(self, wf: Workflow, stored: list[str]) -> None:
        """Continue a run whose inputs and first operators (``stored``) are already in the
        array store: tasks read them from there."""
        ship_workflow_modules(wf, [])
        for name in stored:
            self.shapes[name] = self.arrays.describe(name)[0]

    def run_step(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                 progress: Progress) -> StepResult:
        op, arrays = step.operator, self.arrays
        in_shapes = [self.shapes[a] for a in step.inputs]
        on_tasks = progress.tiles if progress.wants_tasks else None
        halo = tile_plan(op, in_shapes)
        t0 = time.perf_counter()
        if _aggregates(op, in_shapes, strategies):
            tasks = len(tiles_for(in_shapes[0], arrays.tile))
            self.note(f"{name}: aggregation over {tasks} tile(s), merged in a tree")
            results = _aggregate(self.sc, name, op, step.inputs, in_shapes, strategies, arrays,
                                 capture, on_tasks)
        elif _labels(op, in_shapes):
            results = self._components(name, op, step.inputs[0], in_shapes[0], strategies, capture,
                                       on_tasks)
            tasks = len(results)
        elif _gathers(op, in_shapes) and (in_dtype := self._numeric(step.inputs[0])) is not None:
            told = op.output_shape(in_shapes[0])
            assert told is not None                 # a gather operator knows its output shape
            out_shape = tuple(int(n) for n in told)
            tiles = tiles_for(out_shape, arrays.tile)
            arrays.create(name, out_shape, in_dtype)
            self.note(f"{name}: gather, {len(tiles)} tile task(s) reading only the input boxes "
                      f"their cells come from")
            fn = partial(_gather_task, str(arrays.dir.parent), arrays.tile, self._shards(capture),
                         name, op, step.inputs[0], strategies, capture, out_shape, in_shapes[0])
            results = collect(self.sc.parallelize(tiles, len(tiles)).map(fn), name, on_tasks)
            tasks = len(tiles)
        elif halo is None:
            tasks = 1
            self.note(f"{name}: {op.tiling.kind} operator, one task on the whole array")
            fn = partial(_global_task, str(arrays.dir.parent), arrays.tile, self._shards(capture),
                         name, op, list(step.inputs), strategies, capture)
            results = collect(self.sc.parallelize([0], 1).map(fn), name, on_tasks)
            assert results[0].attempt is not None
            arrays.commit_attempt(name, results[0].attempt)     # the attempt that succeeded
        else:
            out_shape = in_shapes[0]
            size = task_tile(arrays.tile, halo)
            tiles = tiles_for(out_shape, size, halo)
            stat = self._statistic(name, op, step.inputs[0], in_shapes[0], on_tasks)
            corner = tuple((0, min(b, PROBE_CELLS)) for _, b in tiles[0].core)
            probe = Tile(tiles[0].index, corner, corner)
            dtype = _probe_dtype(name, op, arrays, step.inputs, in_shapes, probe, out_shape, stat)
            arrays.create(name, out_shape, dtype)
            self.note(f"{name}: {len(tiles)} tile task(s) of up to {size} cells per axis"
                      + (f", halo {halo}" if halo else ""))
            fn = partial(_tile_task, str(arrays.dir.parent), arrays.tile, self._shards(capture), name,
                         op, list(step.inputs), strategies, capture, out_shape, in_shapes, stat)
            results = collect(self.sc.parallelize(tiles, len(tiles)).map(fn), name, on_tasks)
            tasks = len(tiles)
        wall = time.perf_counter() - t0
        self._done(name, wall, results)
        out_shape = results[0].out_shape
        self.shapes[name] = out_shape
        out_dtype = results[0].dtype
        return StepResult(out_shape, out_dtype, int(np.prod(out_shape)) * np.dtype(out_dtype).itemsize,
                          in_shapes, concat_pairs([r.full for r in results], len(in_shapes)),
                          concat_pairs([r.pay for r in results], len(in_shapes)), wall,
                          sum(r.lwrite_s for r in results), tiles=tasks, **_shards_of(results))

    def _components(self, name: str, op, source: str, shape, strategies, capture: bool,
                    on_tasks: TaskCallback | None) -> list[TaskResult]:
        """Connected components over tiles, in up to three jobs: the statistic's
        partials merged in a tree (when the operator has one), per-tile labels
        merged on the driver, per-tile relabelling with lineage."""
        arrays, sc = self.arrays, self.sc
        root, shape = str(arrays.dir.parent), tuple(shape)
        tiles = tiles_for(shape, arrays.tile)
        stat = self._statistic(name, op, source, shape, on_tasks)
        label_fn = partial(_label_task, root, arrays.tile, name, op, source, shape, stat)
        summaries: list[TileComponents] = collect(sc.parallelize(tiles, len(tiles)).map(label_fn),
                                                  name, on_tasks)
        answers, n = merge_tiles(summaries, shape, op.connectivity, int(getattr(op, "min_size", 1)))
        spanning = sum(len(a.owned) for a in answers)
        arrays.create(name, shape, np.dtype(np.int32))
        self.note(f"{name}: connected components over {len(tiles)} tile(s)"
                  + (", statistic merged in a tree" if op.statistic is not None else "")
                  + f"; {n} region(s), {spanning} across tile borders")
        fn = partial(_relabel_task, root, arrays.tile, self._shards(capture), name, op, source, shape,
                     stat, strategies, capture)
        jobs = list(zip(tiles, answers))
        return collect(sc.parallelize(jobs, len(jobs)).map(fn), name, on_tasks)

    def cancel(self) -> None:
        """Stop every job still running (another job of the run failed)."""
        try:
            self.sc.cancelAllJobs()
        except Exception:
            pass            # the JVM is going away anyway

    def _shards(self, capture: bool) -> str | None:
        """Where tasks write their lineage shards (None: they return pairs)."""
        return self.lineage_dir if capture else None

    def _numeric(self, name: str) -> np.dtype | None:
        """The dtype of a stored array that tiles (numbers), else None (text tables and
        other arrays run whole)."""
        try:
            dtype = self.arrays.describe(name)[1]
        except SubZeroError:
            return None
        return dtype if dtype.kind in "biufc" else None

    def _statistic(self, name: str, op, source: str, shape, on_tasks: TaskCallback | None) -> Any:
        """The operator's declared statistic of its first input, over the tiles: one
        job per round, the tiles' partials merged in a tree (None without one)."""
        stat: Statistic | None = getattr(op, "statistic", None)
        if stat is None:
            return None
        sc, shape = self.sc, tuple(shape)
        tiles = tiles_for(shape, self.arrays.tile * STAT_BLOCK_TILES)
        t0 = time.perf_counter()
        prior = None
        for _ in range(stat.rounds):
            fn = partial(_stat_task, str(self.arrays.dir.parent), self.arrays.tile, name, stat,
                         source, shape, prior)
            rdd = sc.parallelize(tiles, len(tiles)).map(fn)
            prior = stat.finish(run_job(sc, name, partial(rdd.treeReduce, stat.merge), on_tasks), prior)
        self.note(f"{name}: statistic {type(stat).__name__} over {len(tiles)} block(s) in "
                  f"{stat.rounds} round(s), {time.perf_counter() - t0:.2f} s")
        return prior

    def _done(self, what: str, wall: float, results: list[TaskResult]) -> None:
        rss = max((r.rss for r in results), default=0)
        self.note(f"  {what} done in {wall:.2f} s" + (f"; largest worker peak memory "
                                                     f"{rss / 2**20:.0f} MB" if rss else ""))

    def group(self, wf: Workflow, pending: list[str]) -> list[str]:
        """The operators to run next as one job: a fused stage of tile-parallel
        operators over one shape (see :mod:`subzero.engines.stages`); or, when the
        next operator runs whole, it and every other pending whole-array operator
        whose inputs are already stored (independent branches, such as the two
        exposures' cosmic-ray detection), one task each; or one operator."""
        first = pending[0]
        if not self._runs_whole(wf, first):
            return next_stage(wf, pending, self.shapes, _fusable)
        return [first] + [n for n in pending[1:]
                          if all(a in self.shapes for a in wf.steps[n].inputs)
                          and self._runs_whole(wf, n)]

    def waits_for(self, wf: Workflow, names: list[str], running: set[str], free: list[str]) -> bool:
        """Whether the fused stage ``names`` had better wait for a job that is running:
        an operator still to run reads that job's output and would join the stage
        (tile-parallel over the same shape) once it is stored -- one job then, not two
        (the two exposures' calibrations fuse although one exposure's overscan
        finishes first)."""
        shape = tiled_shape(wf, names[0], self.shapes, _fusable)
        if shape is None:
            return False
        inside = set(names)
        for n in free:
            step = wf.steps[n]
            if n in inside or not any(a in running for a in step.inputs):
                continue
            if not all(a in self.shapes or a in inside or a in running for a in step.inputs):
                continue
            guess = [tuple(self.shapes[a]) if a in self.shapes else tuple(shape) for a in step.inputs]
            if guess[0] == tuple(shape) and _fusable(step.operator, guess) is not None:
                return True
        return False

    def _runs_whole(self, wf: Workflow, name: str) -> bool:
        """A global operator (one task on whole arrays), its inputs all stored."""
        step = wf.steps[name]
        if not step.inputs or any(a not in self.shapes for a in step.inputs):
            return False
        in_shapes = [self.shapes[a] for a in step.inputs]
        return (tile_plan(step.operator, in_shapes) is None
                and not _aggregates(step.operator, in_shapes, (BLACKBOX,))
                and not _labels(step.operator, in_shapes)
                and not _gathers(step.operator, in_shapes))

    def _run_globals(self, wf: Workflow, names: list[str],
                     strategies: Mapping[str, tuple[Strategy, ...]], capture: bool,
                     progress: Progress) -> list[StepResult]:
        """Independent global operators as one job, one task each: they run side by
        side on the cluster instead of one after another."""
        arrays = self.arrays
        jobs = [(n, wf.steps[n].operator, list(wf.steps[n].inputs), tuple(strategies[n]))
                for n in names]
        self.note(f"{len(names)} independent global operators ({', '.join(names)}): one task "
                  f"each on the whole arrays, in one job")
        on_tasks = progress.tiles if progress.wants_tasks else None
        t0 = time.perf_counter()
        fn = partial(_globals_task, str(arrays.dir.parent), arrays.tile, self._shards(capture),
                     capture)
        results: list[TaskResult] = collect(self.sc.parallelize(jobs, len(jobs)).map(fn),
                                            f"{names[0]}..{names[-1]}", on_tasks)
        wall = time.perf_counter() - t0
        self._done("job", wall, results)
        busy = sum(r.run_s for r in results) or 1.0
        out = []
        for (name, _, inputs, _), r in zip(jobs, results):
            assert r.attempt is not None
            arrays.commit_attempt(name, r.attempt)       # the attempt that succeeded
            self.shapes[name] = r.out_shape
            in_shapes = [self.shapes[a] for a in inputs]
            out.append(StepResult(r.out_shape, r.dtype,
                                  int(np.prod(r.out_shape)) * np.dtype(r.dtype).itemsize,
                                  in_shapes, r.full, r.pay, wall * r.run_s / busy, r.lwrite_s,
                                  **_shards_of([r])))
        return out

    def run_stage(self, wf: Workflow, names: list[str], strategies: Mapping[str, tuple[Strategy, ...]],
                  capture: bool, progress: Progress) -> list[StepResult]:
        """Run a fused stage as one Spark job, one task per tile (or independent global
        operators, one task each); one result per operator."""
        if self._runs_whole(wf, names[0]):
            return self._run_globals(wf, names, strategies, capture, progress)
        arrays = self.arrays
        steps = [wf.steps[n] for n in names]
        shape = self.shapes[steps[0].inputs[0]]
        known = {**self.shapes, **{n: shape for n in names}}
        members = [Member(n, st.operator, tuple(st.inputs), tuple(strategies[n]),
                          int(tile_plan(st.operator, [known[a] for a in st.inputs]) or 0),
                          tuple(tuple(known[a]) for a in st.inputs))
                   for n, st in zip(names, steps)]
        tiles = tiles_for(shape, arrays.tile)
        probe = Tile(tiles[0].index, tuple((0, min(n, PROBE_CELLS)) for n in shape),
                     tuple((0, min(n, PROBE_CELLS)) for n in shape))
        try:
            dtypes = [r.dtype for r in run_members(arrays, members, False, shape, probe, False)]
        except Exception as e:
            _raise_from_spark(e, "(stage probe)")
        for m, dt in zip(members, dtypes):
            arrays.create(m.name, shape, np.dtype(dt))
        widest = max(m.radius for m in members)
        self.note(f"stage of {len(members)} operators ({', '.join(names)}): {len(tiles)} tile "
                  f"task(s) of up to {arrays.tile} cells per axis"
                  + (f", halos accumulated up to {_accumulated(members)}" if widest else ""))
        on_tasks = progress.tiles if progress.wants_tasks else None
        t0 = time.perf_counter()
        fn = partial(_stage_task, str(arrays.dir.parent), arrays.tile, self._shards(capture), members,
                     capture, shape)
        per_tile: list[list[TaskResult]] = collect(self.sc.parallelize(tiles, len(tiles)).map(fn),
                                                   f"stage {names[0]}..{names[-1]}", on_tasks)
        wall = time.perf_counter() - t0
        self._done("stage", wall, [r for rs in per_tile for r in rs])
        busy = sum(r.run_s for rs in per_tile for r in rs) or 1.0
        out = []
        for k, (m, dt) in enumerate(zip(members, dtypes)):
            rs = [rs[k] for rs in per_tile]
            bad = next((r for r in rs if r.dtype != dt), None)
            if bad is not None:
                raise OperatorError(
                    f"operator {m.name!r} is declared {m.op.tiling.kind} but returned {bad.dtype} "  # type: ignore[attr-defined]
                    f"on tile {bad.index} and {dt} on the first; return one dtype, or declare it global")
            self.shapes[m.name] = tuple(shape)
            run_s = wall * sum(r.run_s for r in rs) / busy
            out.append(StepResult(tuple(shape), dt, int(np.prod(shape)) * np.dtype(dt).itemsize,
                                  [tuple(shape)] * len(m.inputs),
                                  concat_pairs([r.full for r in rs], len(m.inputs)),
                                  concat_pairs([r.pay for r in rs], len(m.inputs)), run_s,
                                  sum(r.lwrite_s for r in rs), tiles=len(tiles), **_shards_of(rs)))
        return out

    def close(self) -> None:
        """Write the notes to the run folder's ``run.log`` (a failed run's folder, log
        included, is then removed by its transaction)."""
        if self.arrays.dir.parent.is_dir():
            (self.arrays.dir.parent / "run.log").write_text("\n".join(self.notes) + "\n")


def _shards_of(results: list[TaskResult]) -> dict[str, Any]:
    """The lineage part of a step's result from its tasks': the shards they wrote
    (when they wrote shards) and the pairs they captured."""
    pairs = sum(r.pairs for r in results)
    if all(r.shards is None for r in results):
        return {"pairs": pairs}
    return {"shards": [t for r in results for t in (r.shards or [])], "pairs": pairs}


def _accumulated(members: list[Member]) -> int:
    """The widest halo any operator of the stage reads (its own plus those after it)."""
    mid = 1 << 30
    boxes = plan_boxes(members, ((mid, mid + 1),), (1 << 31,))
    return max(mid - read[0][0] for _, read in boxes.values())


def _fusable(op, in_shapes) -> int | None:
    """The halo of an operator that may join a fused stage (None: it runs on its own).
    An operator with a statistic needs it computed over its stored input first."""
    return None if getattr(op, "statistic", None) is not None else tile_plan(op, in_shapes)


def _probe_dtype(name, op, arrays: ArrayStore, inputs, in_shapes, tile: Tile, out_shape,
                 stat) -> np.dtype:
    """The output dtype, from running the operator on a small corner (``tile``) in the
    driver: tasks write into an array that must exist with its dtype before they
    start, and a whole tile of a heavy operator would cost the driver its memory."""
    ins = [arrays.read_region(a, input_slices(tile, sh)) for a, sh in zip(inputs, in_shapes)]
    try:
        out, _, _, _ = run_operator(name, op, ins, (), capture=False, origin=tile.origin,
                                    array_shape=tuple(out_shape), statistic=stat)
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"operator {name!r} failed on tile {tile.describe()}: "
                            f"{type(e).__name__}: {e}") from None
    return np.asarray(out.data if isinstance(out, xr.DataArray) else out).dtype
