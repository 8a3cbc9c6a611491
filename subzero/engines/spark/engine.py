"""The Spark engine: a workflow's operators as Spark jobs over tiles.

Per operator, in the order the driver loop (:mod:`subzero.engines.driver`)
gives, :class:`SparkEngine` launches one job (the tasks' code is
:mod:`~subzero.engines.spark.tasks`, the job running :mod:`~subzero.engines.spark.jobs`):

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
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from subzero.capture.components import TileComponents, merge_tiles
from subzero.capture.runner import array_context, normalise_output, run_operator, shape_of
from subzero.capture.tiles import Shape, Tile, concat_pairs, input_slices, task_tile, tile_plan, tiles_for
from subzero.engines.base import Engine, StepResult
from subzero.engines.progress import Progress
from subzero.engines.spark.failures import TaskFailure
from subzero.engines.spark.jobs import TaskCallback, collect, run_job
from subzero.engines.spark.session import ship_workflow_modules
from subzero.engines.spark.stages import Member, next_stage, plan_boxes, tiled_shape
from subzero.engines.spark.tasks import (
    TaskResult,
    copy_task,
    gather_task,
    global_task,
    globals_task,
    label_task,
    partial_task,
    relabel_task,
    run_members,
    stage_task,
    stat_task,
    tile_task,
)
from subzero.errors import OperatorError, SubZeroError, TaskFailed
from subzero.model.labelled import is_dataarray
from subzero.model.operator import Aggregating, Gathering, Labelling, Operator, TilingKind
from subzero.model.statistic import Statistic
from subzero.model.strategy import BLACKBOX, Strategy
from subzero.model.workflow import Step, Workflow
from subzero.storage.arrays import ArrayStore
from subzero.storage.inputs import is_region_source
from subzero.tuning import PROBE_CELLS, SPARK_CONCURRENT_JOBS, STAT_BLOCK_TILES

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession


def _aggregates(op: Operator, in_shapes: list[tuple[int, ...]], strategies: tuple[Strategy, ...]) -> bool:
    """Run as a Spark aggregation: declared so, one input, all-to-all, and only
    Full (or no) lineage asked for (its pair is written by the runtime)."""
    return (op.tiling.kind is TilingKind.AGGREGATE and len(in_shapes) == 1
            and isinstance(op, Aggregating)
            and op.is_all_to_all(0)
            and all(s.mode.value in ("full", "map", "blackbox") for s in strategies))


def _gathers(op: Operator, in_shapes: list[tuple[int, ...]]) -> bool:
    """A structural operator of one input whose output tiles read input boxes."""
    return (op.tiling.kind is TilingKind.GATHER and len(in_shapes) == 1
            and isinstance(op, Gathering))


def _labels(op: Operator, in_shapes: list[tuple[int, ...]]) -> bool:
    """Run as connected components over tiles: declared so, one input."""
    return (op.tiling.kind is TilingKind.COMPONENTS and len(in_shapes) == 1
            and isinstance(op, Labelling))


def _aggregate(sc: SparkContext, name: str, op: Operator, inputs: Sequence[str], in_shapes: list[Shape],
               strategies: tuple[Strategy, ...], arrays: ArrayStore, capture: bool,
               on_tasks: TaskCallback | None = None) -> list[TaskResult]:
    """A whole-array reduction as a Spark aggregation: partials per tile, merged
    on the executors in a tree, finished on the driver.  Its lineage is one
    all-to-all pair, written by the runtime."""
    assert isinstance(op, Aggregating)      # run_step asked _aggregates
    tiles = tiles_for(in_shapes[0], arrays.tile, 0)
    fn = partial(partial_task, str(arrays.dir.parent), arrays.tile, arrays.run_uid, name, op, list(inputs))
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
    arr = out.data if is_dataarray(out) else out
    return [TaskResult((0,), full, None, shape_of(out), str(arr.dtype), time.perf_counter() - t0, 0.0,
                       pairs=full.n if full is not None else 0)]

class SparkEngine(Engine):
    """Operators as Spark jobs over the run's Zarr arrays: tile tasks, one global
    task, or a tree aggregation (see the module's docstring).  What the jobs did is
    noted in the run's ``run.log``."""

    name = "spark"
    #: independent jobs the driver loop runs side by side: the two exposures' branches
    #: keep a cluster busy together (:data:`subzero.tuning.SPARK_CONCURRENT_JOBS`)
    concurrent_jobs = SPARK_CONCURRENT_JOBS

    def __init__(self, spark: SparkSession, arrays: ArrayStore, log: Callable[[str], None] | None = None,
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
            if self.arrays.is_shared(name):         # the store's copy: nothing to write
                continue
            if is_region_source(v):
                shape = tuple(int(n) for n in v.shape)
                self.arrays.create(name, shape, np.dtype(v.dtype), getattr(v, "dims", None),
                                   getattr(v, "attrs", None), getattr(v, "coords", None),
                                   getattr(v, "coord_attrs", None), getattr(v, "labelled", False))
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
            fn = partial(copy_task, str(self.arrays.dir.parent), self.arrays.tile, self.arrays.run_uid)
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
            fn = partial(gather_task, str(arrays.dir.parent), arrays.tile, arrays.run_uid, self._shards(capture),
                         name, op, step.inputs[0], strategies, capture, out_shape, in_shapes[0])
            results = collect(self.sc.parallelize(tiles, len(tiles)).map(fn), name, on_tasks)
            tasks = len(tiles)
        elif halo is None:
            tasks = 1
            self.note(f"{name}: {op.tiling.kind} operator, one task on the whole array")
            fn = partial(global_task, str(arrays.dir.parent), arrays.tile, arrays.run_uid, self._shards(capture),
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
            fn = partial(tile_task, str(arrays.dir.parent), arrays.tile, arrays.run_uid,
                         self._shards(capture), name, op, list(step.inputs), strategies, capture,
                         out_shape, in_shapes, stat)
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

    def _components(self, name: str, op: Operator, source: str, shape: Sequence[int],
                    strategies: tuple[Strategy, ...], capture: bool,
                    on_tasks: TaskCallback | None) -> list[TaskResult]:
        """Connected components over tiles, in up to three jobs: the statistic's
        partials merged in a tree (when the operator has one), per-tile labels
        merged on the driver, per-tile relabelling with lineage."""
        assert isinstance(op, Labelling)        # run_step asked _labels
        arrays, sc = self.arrays, self.sc
        root, shape = str(arrays.dir.parent), tuple(shape)
        tiles = tiles_for(shape, arrays.tile)
        stat = self._statistic(name, op, source, shape, on_tasks)
        label_fn = partial(label_task, root, arrays.tile, arrays.run_uid, name, op, source, shape, stat)
        summaries: list[TileComponents] = collect(sc.parallelize(tiles, len(tiles)).map(label_fn),
                                                  name, on_tasks)
        answers, n = merge_tiles(summaries, shape, op.connectivity, int(getattr(op, "min_size", 1)))
        spanning = sum(len(a.owned) for a in answers)
        arrays.create(name, shape, np.dtype(np.int32))
        self.note(f"{name}: connected components over {len(tiles)} tile(s)"
                  + (", statistic merged in a tree" if op.statistic is not None else "")
                  + f"; {n} region(s), {spanning} across tile borders")
        fn = partial(relabel_task, root, arrays.tile, arrays.run_uid, self._shards(capture), name, op,
                     source, shape, stat, strategies, capture)
        jobs = list(zip(tiles, answers))
        return collect(sc.parallelize(jobs, len(jobs)).map(fn), name, on_tasks)

    def bind(self, names: list[str]) -> None:
        """Bind arrays the tasks wrote to their place, on the driver, after their job."""
        for name in names:
            self.arrays.bind(name)

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

    def _statistic(self, name: str, op: Operator, source: str, shape: Sequence[int],
                   on_tasks: TaskCallback | None) -> Any:
        """The operator's declared statistic of its first input, over the tiles: one
        job per round, the tiles' partials merged in a tree (None without one)."""
        stat: Statistic | None = op.statistic
        if stat is None:
            return None
        sc, shape = self.sc, tuple(shape)
        tiles = tiles_for(shape, self.arrays.tile * STAT_BLOCK_TILES)
        t0 = time.perf_counter()
        prior = None
        for _ in range(stat.rounds):
            fn = partial(stat_task, str(self.arrays.dir.parent), self.arrays.tile, self.arrays.run_uid, name, stat,
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
        fn = partial(globals_task, str(arrays.dir.parent), arrays.tile, arrays.run_uid, self._shards(capture),
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

    def run_group(self, wf: Workflow, names: list[str], strategies: Mapping[str, tuple[Strategy, ...]],
                  capture: bool, progress: Progress) -> list[StepResult]:
        """Run a group made by :meth:`group` as one Spark job: one operator's job, a
        fused stage (one task per tile), or independent global operators (one task
        each); one result per operator."""
        if len(names) == 1:
            return [self.run_step(names[0], wf.steps[names[0]], strategies[names[0]], capture,
                                  progress)]
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
        except TaskFailed as e:        # the tasks' code, run here on a corner
            err = TaskFailure.decode(e).to_error()
            raise err from err.__cause__        # the task code's traceback
        for m, dt in zip(members, dtypes):
            arrays.create(m.name, shape, np.dtype(dt))
        widest = max(m.radius for m in members)
        self.note(f"stage of {len(members)} operators ({', '.join(names)}): {len(tiles)} tile "
                  f"task(s) of up to {arrays.tile} cells per axis"
                  + (f", halos accumulated up to {_accumulated(members)}" if widest else ""))
        on_tasks = progress.tiles if progress.wants_tasks else None
        t0 = time.perf_counter()
        fn = partial(stage_task, str(arrays.dir.parent), arrays.tile, arrays.run_uid,
                     self._shards(capture), members, capture, shape)
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
                    f"operator {m.name!r} is declared {m.op.tiling.kind} but returned {bad.dtype} "
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


def _fusable(op: Operator, in_shapes: list[tuple[int, ...]]) -> int | None:
    """The halo of an operator that may join a fused stage (None: it runs on its own).
    An operator with a statistic needs it computed over its stored input first."""
    return None if op.statistic is not None else tile_plan(op, in_shapes)


def _probe_dtype(name: str, op: Operator, arrays: ArrayStore, inputs: Sequence[str], in_shapes: Sequence[Shape],
                 tile: Tile, out_shape: Shape, stat: Any) -> np.dtype:
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
                            f"{type(e).__name__}: {e}") from e
    return np.asarray(out.data if is_dataarray(out) else out).dtype
