"""Re-runs: a complete run made again with some inputs corrected, recomputing only
what the correction can reach (:mod:`subzero.engines.incremental`).

A re-run is a new run, made like any other (a run transaction, its journal, its
signed record, committed atomically), on the parent's workflow, strategies,
parameters and tile size; its inputs are the corrected ones and, for the
others, the parent's own (read from the parent's verified arrays: an input the
store keeps once stays one copy).  Its record names its parent and, per
operator, what ran again and where the output changed.  A re-run of a run
whose code this user's key does not vouch for is refused: it would run that
code.

Many re-runs (:func:`rerun_many`) run as one Spark job per batch of runs, a task
per run (:mod:`subzero.engines.spark.instances`); the driver verifies every
parent before, and commits and signs every re-run after its batch, so a job
that dies loses at most its batch, and the same call made again re-runs only
what is not done.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from subzero.engines.choice import Choice
from subzero.engines.incremental import IncrementalEngine
from subzero.engines.parent import ParentPlan
from subzero.engines.stats import RunStats
from subzero.errors import StoreError, UntrustedRun, UsageError
from subzero.model.workflow import Workflow
from subzero.runs.journal import Journal
from subzero.runs.launch import bind_inputs, execute
from subzero.runs.options import RunOptions
from subzero.runs.transaction import RunTransaction, failure_message
from subzero.storage.arrays import ArrayStore
from subzero.storage.catalog import Catalog
from subzero.storage.liveness import Heartbeat
from subzero.tuning import DEFAULT_TILE, RERUN_BATCH

if TYPE_CHECKING:
    from subzero.engines.progress import Progress
    from subzero.storage.catalog import RunRow


class Run(Protocol):
    """What a re-run needs of its parent run (:class:`subzero.run.Run` is one): the
    runs layer does not import the API's Run."""

    row: RunRow
    dir: Path

    @property
    def uid(self) -> str | None: ...

    @property
    def trusted(self) -> bool: ...

    @property
    def workflow(self) -> Workflow: ...

    @property
    def _arrays(self) -> ArrayStore: ...

    def verdict(self) -> Any: ...

    def steering(self) -> Any: ...

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def ops(self) -> list[dict]: ...


def parent_tile(arrays: ArrayStore, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The tile size the parent ran with, from the chunks of an array it split (any tile
    at least as large as every array gives the same chunks: the default then)."""
    for name, shape in shapes.items():
        try:
            chunks = arrays.chunk_shape(name)
        except (StoreError, OSError):
            continue
        split = [c for c, n in zip(chunks, shape) if c < n]
        if split:
            return int(max(split))
    return DEFAULT_TILE


def plan(parent: Run, inputs: Mapping[str, Any], tile: int | None = None
         ) -> tuple[Workflow, ParentPlan, dict[str, Any], dict[str, Any]]:
    """Check that ``parent`` can be re-run with ``inputs`` and describe it as plain data:
    (its workflow, the parent plan, the given inputs bound as a run binds them, how the
    catalog describes every input)."""
    row = parent.row
    steer = _checked(parent)
    if not inputs:
        raise UsageError(f"a re-run of run {row.id} needs at least one corrected input "
                         f"(--input NAME=PATH)")
    wf = parent.workflow
    _strategies(parent, steer, wf)
    unknown = [k for k in inputs if k not in wf.inputs]
    if unknown:
        raise UsageError(f"workflow {wf.name!r} of run {row.id} has no input {unknown[0]!r}; its "
                         f"inputs: {', '.join(wf.inputs)}")
    bound, described_given = bind_inputs(wf, {**{n: _placeholder for n in wf.inputs}, **inputs})
    given = {n: bound[n] for n in inputs}
    described = {n: described_given[n] if n in inputs else
                 row.inputs.get(n, f"<input {n!r} of run {row.id}>") for n in wf.inputs}
    wf, pp = parent_plan(parent, tile, described, steer)
    return wf, pp, given, described


def _checked(parent: Run) -> Any:
    """The parent's steering (its verified record's strategies and statistics), once it
    is known complete and trusted: a run made from it runs its code."""
    row = parent.row
    if row.status != "complete":
        raise StoreError(f"run {row.id} is {row.status}; only a complete run can be re-run")
    if not parent.trusted:
        v = parent.verdict()
        why = v.state + (f": {v.detail}" if v.detail else "")
        raise UntrustedRun(f"run {row.id} is not trusted ({why}); a re-run runs its code: check "
                           f"it, then `subzero trust {row.id}`")
    return parent.steering()


def _strategies(parent: Run, steer: Any, wf: Workflow) -> dict[str, list[str]]:
    """Every operator's strategies as the parent's verified record gives them."""
    strategies = {o["name"]: list(o["strategies"]) for o in steer.ops}
    missing = [n for n in wf.steps if n not in strategies]
    if missing:
        raise StoreError(f"run {parent.row.id} records no strategies for operator "
                         f"{missing[0]!r}; its record does not match its workflow")
    return strategies


def parent_plan(parent: Run, tile: int | None = None, described: Mapping[str, Any] | None = None,
                steer: Any = None) -> tuple[Workflow, ParentPlan]:
    """Check that a run can be made from ``parent`` (complete, trusted, its record naming
    every operator's strategies) and describe the parent as plain data: (its workflow,
    the parent plan).  ``described``: how the new run's catalog row describes its inputs
    (the parent's own, by default); ``steer``: the parent's steering, checked already."""
    row = parent.row
    steer = steer if steer is not None else _checked(parent)
    wf = parent.workflow
    strategies = _strategies(parent, steer, wf)
    p_arrays = parent._arrays
    shapes = {k: tuple(v) for k, v in parent.shapes().items()}
    if described is None:
        described = {n: row.inputs.get(n, f"<input {n!r} of run {row.id}>") for n in wf.inputs}
    digests = {a["name"]: a.get("digest") for a in steer.record["arrays"] if a.get("kind") == "input"} \
        if steer.record is not None and steer.verified else None
    pp = ParentPlan(row.id, str(parent.dir), parent.uid, digests, strategies, shapes,
                    {o["name"]: o["statistic"] for o in steer.ops if o.get("statistic")},
                    {o["name"]: o["rounds"] for o in steer.ops if o.get("rounds")},
                    tile if tile is not None else parent_tile(p_arrays, shapes), dict(described),
                    _stored(steer))
    return wf, pp


def _stored(steer: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Operator -> strategy -> pairs, space sizes and write seconds of the lineage the
    parent stored, as its verified record gives them (none without one: nothing is then
    copied from the parent, its pairs are read back)."""
    if steer.record is None or not steer.verified:
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for o in steer.record["ops"]:
        for ps in o.get("per_strategy") or ():
            if isinstance(ps, dict) and {"strategy", "pairs", "spaces", "write_s"} <= ps.keys():
                out.setdefault(o["name"], {})[ps["strategy"]] = {
                    "pairs": ps["pairs"], "spaces": ps["spaces"], "write_s": ps["write_s"]}
    return out


def rerun(catalog: Catalog, runs_dir: Path, parent: Run, inputs: Mapping[str, Any],
          opts: RunOptions) -> tuple[int, Workflow, dict[str, Any]]:
    """Make ``parent`` again with ``inputs`` (names to arrays, DataArrays or file paths)
    in place of its own, in this process; returns the new run's id, its workflow and
    what it recomputed."""
    wf, pp, given, described = plan(parent, inputs, opts.tile)
    strategies = pp.strategy_map()
    opts = RunOptions.of(opts, tile=pp.tile, capture=True, engine="local")
    handle = pp.open(wf)          # the arrays the parent did not keep: made again, checked
    out: dict[str, Any] = {}
    try:
        choice = Choice("local", asked=True, fallback=False, reason="a re-run runs in this process")
        with RunTransaction.begin(catalog, runs_dir, wf, described, "local") as tx:
            journal = Journal(tx.folder)
            journal.begin(tx.run_id, wf, described, "local", strategies, True, pp.tile, None,
                          rerun={"parent": pp.as_dict(), "inputs": sorted(given)})
            arrays = ArrayStore(tx.folder, tile=pp.tile, run_uid=tx.uid)
            pp.share_unchanged(handle, arrays, list(wf.inputs), given)
            values = pp.inputs(handle, list(wf.inputs), given)
            engine = IncrementalEngine(arrays, handle, list(given))

            def annotate(stats: RunStats) -> None:
                out.update(engine.summary())
                stats.rerun = out

            execute(tx, wf, values, strategies, None, choice, None, opts, journal,
                    arrays=arrays, engine=engine, annotate=annotate)
    finally:
        if handle.lineage is not None:
            handle.lineage.close()
    return tx.run_id, wf, out


def rerun_many(catalog: Catalog, runs_dir: Path, parents: Sequence[Run], inputs: Mapping[str, Any],
               spark: Any, progress: Progress | None = None, batch: int = RERUN_BATCH,
               done: Callable[[int, int], None] | None = None) -> list[tuple[int, int | None, str]]:
    """Re-run every run of ``parents`` with ``inputs`` on Spark, a task per run, in jobs
    of ``batch`` runs; each batch's re-runs are committed (and signed) by this driver
    once its job ends.  Returns (parent id, new run id or None, error) per parent, in
    order; ``done(parent, new)`` is told each re-run committed."""
    from subzero.engines.spark.engine import SparkEngine
    from subzero.engines.spark.instances import rerun_instances
    planned = [plan(p, inputs) for p in parents]       # every parent checked before any job
    # files are read by the tasks (at the same absolute path); arrays travel with them
    shipped = {n: str(Path(v).resolve()) if isinstance(v, (str, os.PathLike)) else v
               for n, v in inputs.items()}
    results: list[tuple[int, int | None, str]] = []
    for start in range(0, len(planned), max(1, batch)):
        part = planned[start:start + max(1, batch)]
        heart = Heartbeat()         # one thread beats every re-run's heartbeat file
        with ExitStack() as stack:  # a re-run not committed when it closes is failed
            stack.callback(heart.close)
            txs = [stack.enter_context(RunTransaction.begin(catalog, runs_dir, wf, described,
                                                            SparkEngine.name, folder=False,
                                                            heartbeat=heart))
                   for wf, _, _, described in part]
            got = rerun_instances(spark, runs_dir, [(tx.run_id, tx.uid, wf, pp, shipped)
                                                    for tx, (wf, pp, _, _) in zip(txs, part)])
            for tx, (wf, pp, _, _), res in zip(txs, part, got):
                if res.ok:
                    try:
                        tx.commit(wf, res.run, folder=res.folder)
                        results.append((pp.run_id, tx.run_id, ""))
                        if done is not None:
                            done(pp.run_id, tx.run_id)
                        if progress is not None:
                            progress.finished("re-run")
                        continue
                    except Exception as e:
                        res.ok, res.error = False, failure_message(e)
                else:
                    tx.fail(res.error)
                results.append((pp.run_id, None, res.error))
    return results


_placeholder = np.zeros(1)      # an input bind_inputs need not resolve (the parent's is used)
