"""Instance-parallel runs: one workflow instance per manifest row (e.g. many
exposure pairs of a night), each a Spark task and a run of its own.

A task runs the whole workflow with the in-process engine in a folder named
for its task attempt (``runs/<id>.partial-a<attempt>``) on storage the
executors share with the driver; the driver moves the folder of the attempt
that succeeded into place and records the run.  A retried or speculative
attempt therefore never mixes its files with another's.  An operator error
fails only its own instance (marked failed with the operator's name); the
others complete.
"""

from __future__ import annotations

import csv
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from subzero.engines.local import run_local
from subzero.engines.stats import OpStats
from subzero.errors import SubZeroError, WorkflowError
from subzero.model.strategy import Strategy
from subzero.storage.arrays import ArrayStore
from subzero.storage.inputs import load_path
from subzero.storage.lineage import LineageStore


@dataclass
class InstanceResult:
    run_id: int
    ok: bool
    folder: str = ""
    error: str = ""
    stats: list[OpStats] = field(default_factory=list)
    seconds: float = 0.0


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


def _instance_task(runs_dir: str, tile: int, wf, strategies: dict[str, tuple[Strategy, ...]],
                   capture: bool, defaults: dict[str, Any], item) -> InstanceResult:
    """One workflow instance on an executor (``item`` = (run id, {input: path}))."""
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
        try:
            stats = run_local(wf, values, strategies, ArrayStore(folder, tile=tile), lineage,
                              capture=capture)
        finally:
            if lineage is not None:
                lineage.close()
    except SubZeroError as e:                 # the instance's own failure: report, do not retry
        shutil.rmtree(folder, ignore_errors=True)
        return InstanceResult(run_id, False, error=str(e))
    return InstanceResult(run_id, True, str(folder), stats=stats, seconds=time.perf_counter() - t0)


def run_instances(store, wf, strategies, rows: list[dict[str, str]], spark, capture: bool = True,
                  tile: int = 512, progress=None) -> list[InstanceResult]:
    """Run one instance per row on Spark; returns one result per row (in order)."""
    from functools import partial

    from subzero.engines.session import ship_workflow_modules
    from subzero.engines.spark import _collect
    defaults = {}
    for name in wf.inputs:
        if all(name not in r for r in rows):
            d = wf.resolve_default(name)
            if d is None:
                raise WorkflowError(f"manifest gives no column for input {name!r}, which has no default")
            defaults[name] = load_path(d, name) if isinstance(d, (str, os.PathLike)) else d
    ids = [store.catalog.begin_run(wf.name, wf.source, wf.params, r, "spark") for r in rows]
    ship_workflow_modules(wf)
    fn = partial(_instance_task, str(store.path / "runs"), tile, wf, strategies, capture, defaults)
    sc = spark.sparkContext
    try:
        results = _collect(sc.parallelize(list(zip(ids, rows)), len(rows)).map(fn), "(instances)")
    except BaseException as e:
        for rid in ids:
            store.catalog.finish_run(rid, "failed", str(e) if isinstance(e, SubZeroError) else repr(e))
        raise
    for res, row in zip(results, rows):
        if res.ok:
            try:
                store.commit_instance(res, wf, row, strategies)
            except Exception as e:
                res.ok, res.error = False, f"{type(e).__name__}: {e}"
        if not res.ok:
            store.catalog.finish_run(res.run_id, "failed", res.error)
        if progress is not None:
            progress.update(1)
    for rid in ids:                          # attempts that failed or lost a race
        for stale in (store.path / "runs").glob(f"{rid}.partial-a*"):
            shutil.rmtree(stale, ignore_errors=True)
    return results
