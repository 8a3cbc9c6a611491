"""Many runs of one workflow at once: one instance per row of a CSV manifest (the
exposure pairs of a night), each a run of its own, run as parallel Spark tasks
(:mod:`subzero.engines.spark.instances`).

Every instance is a run transaction: all begin before the job, each commits or
fails after it (an operator error fails only its own instance); should the job
itself fail, all fail.  The driver commits and signs each run; executors never
see the user's key.
"""

from __future__ import annotations

import csv
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from subzero.engines.progress import Progress
from subzero.engines.spark.engine import SparkEngine
from subzero.engines.spark.instances import InstanceResult, run_instances
from subzero.errors import SubZeroError, WorkflowError
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow
from subzero.runs.transaction import RunTransaction, failure_message
from subzero.storage.catalog import Catalog
from subzero.storage.inputs import load_path
from subzero.storage.liveness import Heartbeat

__all__ = ["InstanceResult", "read_manifest", "run_many"]


def read_manifest(path: str | os.PathLike, wf: Workflow) -> list[dict[str, str]]:
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


def run_many(catalog: Catalog, runs_dir: Path, wf: Workflow, strategies: dict[str, tuple[Strategy, ...]],
             rows: list[dict[str, str]], spark: Any, capture: bool = True, tile: int = 512,
             progress: Progress | None = None) -> list[InstanceResult]:
    """Run one instance per row on Spark (``spark``, a SparkSession); returns one
    result per row (in order)."""
    progress = progress if progress is not None else Progress()
    defaults = {}
    for name in wf.inputs:
        if all(name not in r for r in rows):
            d = wf.resolve_default(name)
            if d is None:
                raise WorkflowError(f"manifest gives no column for input {name!r}, which has no default")
            defaults[name] = load_path(d, name) if isinstance(d, (str, os.PathLike)) else d
    heart = Heartbeat()         # one thread beats every instance's heartbeat file
    with ExitStack() as stack:
        stack.callback(heart.close)
        txs = [stack.enter_context(RunTransaction.begin(catalog, runs_dir, wf, r, SparkEngine.name,
                                                        folder=False, heartbeat=heart)) for r in rows]
        reported = 0

        def on_tasks(done: int, total: int) -> None:   # one task per instance
            nonlocal reported
            for _ in range(done - reported):
                progress.finished("instance")
            reported = max(reported, done)

        results = run_instances(spark, runs_dir, wf, strategies,
                                [(tx.run_id, tx.uid, r) for tx, r in zip(txs, rows)], defaults,
                                capture=capture, tile=tile,
                                on_tasks=on_tasks if progress.wants_tasks else None)
        for tx, res in zip(txs, results):
            if res.ok:
                try:
                    tx.commit(wf, res.run, folder=res.folder)
                except Exception as e:
                    res.ok, res.error = False, failure_message(e)
            else:
                tx.fail(res.error)
    return results
