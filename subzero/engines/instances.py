"""Instance-parallel runs: one workflow instance per manifest row (e.g. many
exposure pairs of a night), each a Spark task and a run of its own.

A task runs the whole workflow with the in-process engine in a folder named
for its task attempt (``runs/<id>.partial-a<attempt>``) on storage the
executors share with the driver; the driver moves the folder of the attempt
that succeeded into place, records the run and signs it (executors never see
the user's key).  A retried or speculative
attempt therefore never mixes its files with another's.  An operator error
fails only its own instance (marked failed with the operator's name); the
others complete.
"""

from __future__ import annotations

import csv
import os
import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from subzero.engines.driver import run_workflow
from subzero.engines.local import LocalEngine
from subzero.engines.progress import Progress
from subzero.engines.session import ship_workflow_modules
from subzero.engines.spark import collect
from subzero.engines.stats import OpStats, RunStats
from subzero.engines.transaction import RunTransaction, failure_message
from subzero.errors import SubZeroError, WorkflowError
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow
from subzero.storage.arrays import ArrayStore
from subzero.storage.inputs import load_path
from subzero.storage.lineage import LineageStore
from subzero.storage.liveness import Heartbeat


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


def read_manifest(path: str | os.PathLike, wf) -> list[dict[str, str]]:
    """Rows of a CSV manifest whose header names workflow inputs; relative
    paths are taken relative to the manifest's folder."""
    p = Path(path)
    if not p.is_file():
        raise SubZeroError(f"manifest not found: {p}")
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        unknown = [c for c in cols if c not in wf.inputs]
        if not cols or unknown:
            raise WorkflowError(f"manifest {p}: column {unknown[0] if unknown else '(none)'!r} is not "
                                f"an input of workflow {wf.name!r} (inputs: {', '.join(wf.inputs)})")
        rows = []
        for k, row in enumerate(reader, start=2):
            if any(v is None or not v.strip() for v in row.values()):
                raise SubZeroError(f"manifest {p}: line {k} has an empty field")
            rows.append({c: str((p.parent / v.strip()).resolve()) if not os.path.isabs(v.strip())
                         else v.strip() for c, v in row.items()})
    if not rows:
        raise SubZeroError(f"manifest {p} has no rows")
    return rows


def _instance_task(runs_dir: str, tile: int, wf: Workflow, strategies: dict[str, tuple[Strategy, ...]],
                   capture: bool, defaults: dict[str, Any], item) -> InstanceResult:
    """One workflow instance on an executor (``item`` = (run id, {input: path})): the
    shared driver loop on the local engine, in this attempt's own folder."""
    run_id, paths = item
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
        lineage = LineageStore(folder / "lineage") if capture else None
        engine = LocalEngine(ArrayStore(folder, tile=tile))
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


def run_instances(store, wf: Workflow, strategies: dict[str, tuple[Strategy, ...]],
                  rows: list[dict[str, str]], spark, capture: bool = True, tile: int = 512,
                  progress: Progress | None = None) -> list[InstanceResult]:
    """Run one instance per row on Spark; returns one result per row (in order).

    Every instance is a run transaction of its own: all begin before the job; each
    commits or fails after it; should the job itself fail, all fail."""
    progress = progress if progress is not None else Progress()
    defaults = {}
    for name in wf.inputs:
        if all(name not in r for r in rows):
            d = wf.resolve_default(name)
            if d is None:
                raise WorkflowError(f"manifest gives no column for input {name!r}, which has no default")
            defaults[name] = load_path(d, name) if isinstance(d, (str, os.PathLike)) else d
    runs_dir = store.path / "runs"
    heart = Heartbeat()         # one thread beats every instance's heartbeat file
    with ExitStack() as stack:
        stack.callback(heart.close)
        txs = [stack.enter_context(RunTransaction.begin(store.catalog, runs_dir, wf, r, "spark",
                                                        folder=False, heartbeat=heart)) for r in rows]
        ship_workflow_modules(wf)
        fn = partial(_instance_task, str(runs_dir), tile, wf, strategies, capture, defaults)
        rdd = spark.sparkContext.parallelize([(tx.run_id, r) for tx, r in zip(txs, rows)], len(rows))
        reported = 0

        def on_tasks(done: int, total: int) -> None:   # one task per instance
            nonlocal reported
            for _ in range(done - reported):
                progress.finished("instance")
            reported = max(reported, done)

        results: list[InstanceResult] = collect(rdd.map(fn), "(instances)",
                                                on_tasks if progress.wants_tasks else None)
        for tx, res in zip(txs, results):
            if res.ok:
                try:
                    tx.commit(wf, res.run, folder=res.folder)
                except Exception as e:
                    res.ok, res.error = False, failure_message(e)
            else:
                tx.fail(res.error)
    return results
