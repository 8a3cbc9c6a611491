"""Starting and finishing runs: a workflow and its inputs, bound and checked, driven
on the chosen engine inside a run transaction.

:func:`start` makes a new run; :func:`resume` finishes one whose driver was lost,
from its journal.  Both end in :func:`execute`, the one place where an engine,
the run's array and lineage stores, the driver loop and the transaction meet.
Everything is checked before the run is recorded (workflow, strategies,
inputs, engine, Spark's workers), so a mistake leaves no failed run behind.

The store (:class:`subzero.api.Store`) is a facade over this; it alone calls the
optimizer (for ``max_disk`` / ``max_runtime`` without a plan) and hands the plan
over.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from subzero.capture.runner import shape_of
from subzero.engines.base import Engine
from subzero.engines.choice import Choice, choose_engine, make_engine, open_session, resume_engine
from subzero.engines.driver import run_workflow
from subzero.engines.incremental import IncrementalEngine
from subzero.engines.parent import ParentPlan
from subzero.engines.progress import progress_for
from subzero.engines.stats import RunStats
from subzero.errors import StoreError, StrategyError, WorkflowError, warn
from subzero.model.labelled import is_dataarray
from subzero.model.strategy import Strategy, check_supported, default_for, parse
from subzero.model.workflow import Workflow, check_reexecution, load_workflow
from subzero.runs import share
from subzero.runs.journal import FILE as JOURNAL_FILE
from subzero.runs.journal import Journal, Resumable, check_begun, fingerprint, read_journal
from subzero.runs.keep import (
    cheap_to_keep,
    check_policy,
    fit,
    not_kept,
    workload_arrays,
    workload_of,
)
from subzero.runs.options import RunOptions
from subzero.runs.transaction import RunTransaction
from subzero.storage.arrays import ArrayStore
from subzero.storage.budget import DiskBudget, parse_size
from subzero.storage.catalog import Catalog
from subzero.storage.inputs import input_digest, is_region_source, open_input
from subzero.storage.lineage import LineageStore


def start(catalog: Catalog, runs_dir: Path, workflow: str | os.PathLike | Workflow,
          inputs: Mapping[str, Any] | None, opts: RunOptions) -> tuple[int, Workflow]:
    """Run a workflow (module name, .py path or Workflow) on ``inputs`` (names to
    arrays, DataArrays or file paths; missing ones use the workflow's defaults);
    returns the complete run's id and its workflow."""
    wf = load_workflow(workflow, dict(opts.params or {}))
    check_policy(opts.keep, opts.pins, wf)
    budget = None
    strategies = opts.strategies
    if opts.plan is not None:
        strategies, budget = plan_strategies(catalog, opts.plan, wf, strategies, opts.max_disk)
    elif opts.max_disk is not None:
        budget = DiskBudget(parse_size(opts.max_disk))
    request = opts.engine_request()
    strat = resolve_strategies(wf, strategies)
    values, described = bind_inputs(wf, dict(inputs or {}))
    choice = choose_engine(request, input_cells=(int(np.prod(shape_of(v))) for v in values.values()),
                           profiling=opts.profiler is not None)
    if not choice.asked:
        if choice.fallback:
            warn(choice.reason)
        if opts.announce is not None:
            opts.announce(choice.line(opts.master))
    if choice.engine == "spark" and request.session is None and opts.announce is not None:
        # said before the JVM starts (10-60 s), so a log or a pipe shows what is going on
        opts.announce(f"starting Spark ({opts.master or 'local[*]'}); its JVM takes a while to start")
    spark = open_session(choice, request, runs_dir.parent)
    with RunTransaction.begin(catalog, runs_dir, wf, described, choice.engine) as tx:
        journal = Journal(tx.folder)
        journal.begin(tx.run_id, wf, described, choice.engine, strat, opts.capture,
                      opts.tile_size, budget, keep={"policy": opts.keep, "pins": list(opts.pins)})
        execute(tx, wf, values, strat, budget, choice, spark, opts, journal)
    return tx.run_id, wf


def resume(catalog: Catalog, runs_dir: Path, run: int | str,
           workflow: str | os.PathLike | Workflow | None, opts: RunOptions) -> tuple[int, Workflow]:
    """Finish an interrupted run from its first unfinished operator, with the
    strategies, tile size and disk budget it began with (see
    :meth:`subzero.api.Store.resume`); returns its id and workflow."""
    row = catalog.get_run(run)
    if row.status != "interrupted":
        catalog.claim_run(row.id)      # says why not
    folder = runs_dir / f"{row.id}.partial"
    state = read_journal(folder, row.id)
    check_begun(state, row, folder / JOURNAL_FILE)     # before any code the store names loads
    if workflow is None:
        if not row.source:
            raise WorkflowError(f"run {row.id} ran a workflow made in Python; pass it: "
                                f"store.resume({row.id}, workflow=wf)")
        workflow = row.source
    wf = load_workflow(workflow, dict(row.params))
    if fingerprint(wf) != state.fingerprint:
        raise WorkflowError(f"workflow {wf.name!r} ({row.source or 'in-process'}) changed since "
                            f"run {row.id} began (its operators or their modules' source "
                            f"differ); resume needs the code it began with, or start a new run")
    strat = {n: parse("+".join(ss)) for n, ss in state.strategies.items()}
    request = opts.engine_request()
    choice = resume_engine(request, row.engine)
    if opts.announce is not None:
        opts.announce(f"resuming run {row.id} ({wf.name}): {len(state.done)} of {len(wf.steps)} "
                      f"operators were done; engine: {choice.engine}")
    spark = open_session(choice, request, runs_dir.parent)
    kept = state.begun.get("keep") or {"policy": "all", "pins": []}
    opts = RunOptions.of(opts, capture=state.capture, tile=state.tile, profiler=None,
                         keep=kept["policy"], pins=tuple(kept["pins"]))
    tx = RunTransaction.resume(catalog, runs_dir, row.id)
    with tx:
        done: RunStats | None
        if state.inputs is None:
            # lost before its inputs were stored: start over in the same folder
            for child in tx.folder.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
            journal = Journal(tx.folder)
            journal.begin(row.id, wf, row.inputs, row.engine, strat, state.capture, state.tile,
                          state.disk_budget(), keep=kept)
            lost = [k for k, v in row.inputs.items() if str(v).startswith("<")]
            if lost:
                raise StoreError(f"run {row.id} was lost before its inputs were stored, and "
                                 f"input {lost[0]!r} was an array in memory; start a new run")
            values, _ = bind_inputs(wf, dict(row.inputs))
            done = None
        else:
            discard_unfinished(tx.folder, wf, strat, state, tx.uid)
            journal, values = Journal(tx.folder), {}
            done = RunStats(inputs=list(state.inputs), ops=list(state.ops))
        rerun = state.begun.get("rerun")
        if rerun is not None:
            if done is None:
                raise StoreError(f"re-run {row.id} was lost before its inputs were stored; make "
                                 f"the re-run again")
            _resume_rerun(tx, wf, strat, opts, journal, done, rerun)
        else:
            execute(tx, wf, values, strat, state.disk_budget(), choice, spark, opts, journal, done,
                    resuming=True)
    return tx.run_id, wf


def _resume_rerun(tx: RunTransaction, wf: Workflow, strat: Mapping[str, tuple[Strategy, ...]],
                  opts: RunOptions, journal: Journal, done: RunStats, rerun: Mapping[str, Any]) -> None:
    """Go on with a re-run whose driver was lost: the incremental engine again, over its
    parent (as its signed journal names it), from the first operator not done; the
    operators done are compared with the parent's to know what changed."""
    pp = ParentPlan.of(rerun["parent"])
    given = list(rerun["inputs"])
    handle = pp.open(wf)
    try:
        arrays = ArrayStore(tx.folder, tile=pp.tile, run_uid=tx.uid)
        engine = IncrementalEngine(arrays, handle, given)

        def annotate(stats: RunStats) -> None:
            stats.rerun = engine.summary()
        choice = Choice("local", asked=True, reason="a re-run runs in this process")
        execute(tx, wf, {}, strat, None, choice, None, RunOptions.of(opts, tile=pp.tile), journal,
                done, resuming=True, arrays=arrays, engine=engine, annotate=annotate)
    finally:
        if handle.lineage is not None:
            handle.lineage.close()


def execute(tx: RunTransaction, wf: Workflow, values: Mapping[str, Any],
            strat: Mapping[str, tuple[Strategy, ...]], budget: DiskBudget | None, choice: Choice,
            spark: Any, opts: RunOptions, journal: Journal, done: RunStats | None = None,
            resuming: bool = False, arrays: ArrayStore | None = None, engine: Engine | None = None,
            annotate: Callable[[RunStats], None] | None = None,
            keep_every: bool | None = None) -> None:
    """Drive the run's operators on the chosen engine into ``tx``'s folder, and commit.

    ``engine`` (over ``arrays``, the run's array store) replaces the one ``choice``
    names (a re-run's incremental engine); ``annotate`` adds to the run's statistics
    what its record should say besides (a re-run's parent), before the commit.
    ``keep_every``: keep every array whatever the ``keep`` policy and the budget (by
    default, a run ``annotate`` is given for: a re-run)."""
    reporter = progress_for(opts.progress)
    capture = opts.capture
    # the run's uid (None: a run begun before runs had uids, resumed) binds every array
    # and all lineage it writes to it; the engines and their tasks get it with ``arrays``
    if arrays is None:
        arrays = ArrayStore(tx.folder, tile=opts.tile_size, run_uid=tx.uid)
    if engine is None:
        engine = make_engine(choice.engine, arrays, spark=spark, log=opts.log,
                             lineage_dir=tx.folder / "lineage" if capture else None,
                             profiling=opts.profiler is not None)
    lineage = LineageStore(tx.folder / "lineage", run_uid=tx.uid) if capture else None
    # inputs the store keeps already are read from its copy, not stored again
    known = {} if done is not None else share.take(arrays, values, tx.catalog.meta("store_uid"))
    what = "resuming run" if resuming else "run"
    reporter.begin(len(wf.steps), f"{what} {tx.run_id} ({wf.name}, {choice.engine})")
    try:
        stats = run_workflow(engine, wf, values, strat, lineage, budget=budget,
                             capture=capture, progress=reporter, profiler=opts.profiler,
                             journal=journal, done=done)
    finally:
        reporter.close()
        engine.close()
        if lineage is not None:
            lineage.close()
    # inputs held in memory are digested from there (a pass over memory); the others
    # from the run's stored copy at commit (see RunTransaction.commit)
    held = {n: known.get(n) or input_digest(v, n) for n, v in values.items()
            if (isinstance(v, np.ndarray) or is_dataarray(v))}
    if annotate is not None:
        annotate(stats)
    if keep_every is None:
        keep_every = annotate is not None
    if not keep_every and tx.uid is not None:
        # a re-run keeps every array (made from its parent's values); a run begun before
        # runs had uids, resumed, too (its arrays have no manifest)
        planned = budget.drops if budget is not None else None
        read = workload_arrays(wf, workload_of(wf, tx.catalog.traces(workflow=wf.name))) \
            | cheap_to_keep(arrays, wf) if opts.keep == "auto" and planned is None else set()
        for name in not_kept(wf, strat, stats.ops, opts.keep, opts.pins, read, planned):
            arrays.drop(name)
        if budget is not None and capture:
            fit(arrays, wf, stats.ops, opts.pins, budget)
    tx.commit(wf, stats, budget.downgrades if budget is not None and capture else (), contents=held)


def resolve_strategies(wf: Workflow, given: Mapping[str, Any] | None) -> dict[str, tuple[Strategy, ...]]:
    """Per operator: the given spec (string, Strategy or tuple of them) or the default."""
    given = dict(given or {})
    unknown = [k for k in given if k not in wf.steps]
    if unknown:
        raise StrategyError(f"`strategies` names unknown operator {unknown[0]!r}; operators of "
                            f"{wf.name!r}: {', '.join(wf.steps)}")
    out = {}
    for name, step in wf.steps.items():
        spec = given.get(name)
        if spec is None:
            strat = default_for(step.operator)
        elif isinstance(spec, str):
            strat = parse(spec)
        elif isinstance(spec, Strategy):
            strat = (spec,)
        else:
            strat = tuple(spec)
        check_supported(name, step.operator, strat)
        out[name] = strat
    check_reexecution(wf, out)        # before the run begins: no failed run left behind
    return out


def plan_strategies(catalog: Catalog, plan: str | Mapping[str, Any], wf: Workflow,
                    strategies: Mapping[str, Any] | None, max_disk: int | str | None
                    ) -> tuple[dict[str, Any], DiskBudget | None]:
    """Strategies and disk budget of a saved plan (by name) or a plan dict."""
    if isinstance(plan, str):
        data = catalog.get_plan(plan)
        if data is None:
            names = catalog.plan_names()
            raise StoreError(f"no plan named {plan!r} in this store; "
                             + (f"its plans: {', '.join(names)}" if names else
                                "make one with `subzero optimize WORKFLOW --max-disk SIZE`"))
    else:
        data = dict(plan)
    if strategies:
        raise StrategyError("give either a `plan` or per-operator `strategies`, not both")
    if data.get("workflow") != wf.name:
        raise StrategyError(f"plan {data.get('name', '')!r} was made for workflow "
                            f"{data.get('workflow')!r}, not {wf.name!r}")
    limit = parse_size(max_disk) if max_disk is not None else data.get("max_disk")
    budget = None
    if limit is not None:
        budget = DiskBudget(int(limit), {(op, s): int(b) for op, per in
                                         data.get("predicted_bytes", {}).items()
                                         for s, b in per.items()},
                            arrays_reserve=int(data.get("arrays_reserve") or 0),
                            drops=None if data.get("drops") is None
                            else tuple(str(n) for n in data["drops"]),
                            spare=tuple(str(n) for n in data.get("spare") or ()))
    return data["strategies"], budget


def bind_inputs(wf: Workflow, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The run's input values (arrays, DataArrays, or region sources for files) and how
    the catalog describes them (a file's absolute path, or the array's type and shape)."""
    unknown = [k for k in given if k not in wf.inputs]
    if unknown:
        raise WorkflowError(f"workflow {wf.name!r} has no input {unknown[0]!r}; its inputs: "
                            f"{', '.join(wf.inputs) or '(none)'}")
    values, described = {}, {}
    for name in wf.inputs:
        v = given.get(name)
        if v is None:
            v = wf.resolve_default(name)
        if v is None:
            raise WorkflowError(f"workflow {wf.name!r} needs input {name!r}; give it in "
                                f"`inputs` ({name}=PATH)")
        if isinstance(v, (str, os.PathLike)):
            described[name] = str(Path(v).resolve())
            v = open_input(v, name)
        else:
            described[name] = f"<{type(v).__name__} {list(shape_of(v))}>"
        if is_region_source(v):
            if np.dtype(v.dtype).kind not in "biuf":
                raise WorkflowError(f"input {name!r} is not a numeric array")
        elif not is_dataarray(v):
            v = np.asarray(v)
            if v.dtype == object:
                raise WorkflowError(f"input {name!r} is not a numeric array")
        values[name] = v
    return values, described


def discard_unfinished(folder: Path, wf: Workflow, strategies: Mapping[str, tuple[Strategy, ...]],
                       state: Resumable, run_uid: str | None = None) -> None:
    """Remove what the operators without a journal entry may have left half-written
    (of the run ``run_uid``)."""
    arrays = ArrayStore(folder, run_uid=run_uid)
    done = set(state.done)
    lineage = LineageStore(folder / "lineage", run_uid=run_uid) if (folder / "lineage").is_dir() \
        else None
    try:
        for name in wf.steps:
            if name in done:
                continue
            arrays.remove(name)
            if lineage is not None:
                lineage.drop_operator(name, strategies[name])
    finally:
        if lineage is not None:
            lineage.close()


