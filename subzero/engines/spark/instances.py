"""Instance-parallel runs on Spark: one workflow instance per task (e.g. the many
exposure pairs of a night), each written as a run of its own.

A task runs the whole workflow through the shared driver loop on the
in-process engine, in a folder named for its task attempt
(``runs/<id>.partial-a<attempt>``) on storage the executors share with the
driver, and returns only its statistics; a retried or speculative attempt
therefore never mixes its files with another's.  An operator error fails only
its own instance (the result says so, naming the operator); the others go on.
Recording, committing and signing the runs is the driver's
(:mod:`subzero.runs.many`): executors never see the user's key.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from subzero.engines.driver import run_workflow
from subzero.engines.incremental import IncrementalEngine
from subzero.engines.local import LocalEngine
from subzero.engines.parent import ParentPlan
from subzero.engines.spark.jobs import TaskCallback, collect
from subzero.engines.spark.session import ship_workflow_modules
from subzero.engines.stats import OpStats, RunStats
from subzero.errors import SubZeroError
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow
from subzero.storage.arrays import ArrayStore
from subzero.storage.inputs import load_path
from subzero.storage.lineage import LineageStore


@dataclass
class InstanceResult:
    """One workflow instance: its run id, and whether it completed (else why not)."""

    run_id: int
    ok: bool
    folder: str = ""
    error: str = ""
    run: RunStats = field(default_factory=RunStats)
    seconds: float = 0.0

    @property
    def stats(self) -> list[OpStats]:
        return self.run.ops


def instance_task(runs_dir: str, tile: int, wf: Workflow, strategies: dict[str, tuple[Strategy, ...]],
                  capture: bool, defaults: dict[str, Any],
                  item: tuple[int, str | None, dict[str, str]]) -> InstanceResult:
    """One workflow instance on an executor (``item`` = (run id, run uid, {input: path})):
    the shared driver loop on the local engine, in this attempt's own folder, its arrays
    and lineage bound to the run's uid."""
    run_id, run_uid, paths = item
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
    except ImportError:
        attempt = 0
    folder = Path(runs_dir) / f"{run_id}.partial-a{attempt}"
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    try:
        values = dict(defaults)
        for name, path in paths.items():
            values[name] = load_path(path, name)
        folder.mkdir(parents=True)
        lineage = LineageStore(folder / "lineage", run_uid=run_uid) if capture else None
        engine = LocalEngine(ArrayStore(folder, tile=tile, run_uid=run_uid))
        try:
            stats = run_workflow(engine, wf, values, strategies, lineage, capture=capture)
        finally:
            engine.close()
            if lineage is not None:
                lineage.close()
    except SubZeroError as e:                 # the instance's own failure: report, do not retry
        shutil.rmtree(folder, ignore_errors=True)
        return InstanceResult(run_id, False, error=str(e))
    return InstanceResult(run_id, True, str(folder), run=stats, seconds=time.perf_counter() - t0)


def run_instances(spark: Any, runs_dir: str | Path, wf: Workflow,
                  strategies: dict[str, tuple[Strategy, ...]],
                  items: list[tuple[int, str | None, dict[str, str]]],
                  defaults: Mapping[str, Any], capture: bool = True, tile: int = 512,
                  on_tasks: TaskCallback | None = None) -> list[InstanceResult]:
    """Run one instance per ``(run id, run uid, {input: path})`` item as one Spark job, one task
    each; one result per item, in order.  ``on_tasks`` is told the finished tasks."""
    ship_workflow_modules(wf)
    fn = partial(instance_task, str(runs_dir), tile, wf, strategies, capture, dict(defaults))
    rdd = spark.sparkContext.parallelize(items, len(items))
    return collect(rdd.map(fn), "(instances)", on_tasks)


def rerun_task(runs_dir: str, item: tuple[int, str | None, Workflow, ParentPlan, dict[str, Any]]
               ) -> InstanceResult:
    """One re-run on an executor (``item`` = (run id, run uid, workflow, parent plan,
    corrected inputs)): the incremental engine over the parent run, through the shared
    driver loop, in this attempt's own folder, bound to the run's uid."""
    run_id, run_uid, wf, plan, given = item
    attempt = _attempt()
    folder = Path(runs_dir) / f"{run_id}.partial-a{attempt}"
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    try:
        folder.mkdir(parents=True)
        parent = plan.open(wf)
        lineage = LineageStore(folder / "lineage", run_uid=run_uid)
        try:
            arrays = ArrayStore(folder, tile=plan.tile, run_uid=run_uid)
            values = {n: load_path(v, n) if isinstance(v, str) else v for n, v in given.items()}
            plan.share_unchanged(parent, arrays, list(wf.inputs), values)
            engine = IncrementalEngine(arrays, parent, list(values))
            try:
                stats = run_workflow(engine, wf, plan.inputs(parent, list(wf.inputs), values),
                                     plan.strategy_map(), lineage)
            finally:
                engine.close()
            stats.rerun = engine.summary()
        finally:
            lineage.close()
            if parent.lineage is not None:
                parent.lineage.close()
    except SubZeroError as e:                 # the re-run's own failure: report, do not retry
        shutil.rmtree(folder, ignore_errors=True)
        return InstanceResult(run_id, False, error=str(e))
    return InstanceResult(run_id, True, str(folder), run=stats, seconds=time.perf_counter() - t0)


def _attempt() -> int:
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        return ctx.attemptNumber() if ctx is not None else 0
    except ImportError:
        return 0


def rerun_instances(spark: Any, runs_dir: str | Path,
                    items: list[tuple[int, str | None, Workflow, ParentPlan, dict[str, Any]]],
                    on_tasks: TaskCallback | None = None) -> list[InstanceResult]:
    """Re-runs as one Spark job, a task per ``(run id, run uid, workflow, parent plan,
    corrected inputs)`` item (a corrected input given as a file path is read by the task;
    executors must see it, and the store, at the same paths); one result per item, in
    order."""
    for wf in {id(it[2]): it[2] for it in items}.values():
        ship_workflow_modules(wf)
    rdd = spark.sparkContext.parallelize(items, len(items))
    return collect(rdd.map(partial(rerun_task, str(runs_dir))), "(re-runs)", on_tasks)
