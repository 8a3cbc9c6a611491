"""The Python API: open a store, run workflows, trace lineage, read arrays.

    import subzero
    store = subzero.open_store(".subzero")
    run = store.run("workflows/example.py", strategies={"smooth": "full"})
    res = run.trace("stars", [(12, 40)], to="raw")
    res.cells, res.values
    run.array("smooth")            # xarray.DataArray

A run is atomic: its folder is written as ``runs/<id>.partial`` and renamed
to ``runs/<id>`` only after every array and all lineage are written; the
catalog marks it complete after that.  A failed run is marked failed with the
operator's name and its partial folder removed; earlier runs are untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from subzero.capture.runner import shape_of
from subzero.coords import cells_at as sky_cells
from subzero.coords import cells_for, derive_grids, stored_grid, with_grid
from subzero.engines.base import Engine
from subzero.engines.driver import Profiler, run_workflow
from subzero.engines.journal import Journal, Resumable, fingerprint, read_journal
from subzero.engines.local import LocalEngine
from subzero.engines.progress import Progress, progress_for
from subzero.engines.transaction import RunTransaction
from subzero.errors import QueryError, StoreError, StrategyError, SubZeroError, WorkflowError, warn
from subzero.model.cellset import CellSet
from subzero.model.grid import Grid
from subzero.model.strategy import Strategy, check_supported, default_for, parse
from subzero.model.workflow import Workflow, check_reexecution, load_workflow
from subzero.query.executor import Executor, RunView, TraceResult
from subzero.query.planner import StepStat
from subzero.storage.arrays import DEFAULT_TILE, ArrayStore
from subzero.storage.budget import DiskBudget
from subzero.storage.catalog import Catalog, RunRow
from subzero.storage.inputs import is_region_source, open_input
from subzero.storage.lineage import LineageStore
from subzero.storage.pickles import PickleCode, load_workflow_pickle, pickle_code
from subzero.storage.trust import (
    TRUSTED,
    UntrustedRun,
    Verdict,
    load_key,
    read_payload,
    run_record,
    untrusted_message,
    verify_run,
    write_signature,
)

DEFAULT_STORE = ".subzero"


def open_store(path: str | os.PathLike = DEFAULT_STORE, create: bool = True) -> "Store":
    return Store(path, create=create)


def resolve_strategies(wf: Workflow, given: Mapping[str, Any] | None) -> dict[str, tuple[Strategy, ...]]:
    """Per operator: the given spec (string or Strategy tuple) or the default."""
    given = dict(given or {})
    unknown = [k for k in given if k not in wf.steps]
    if unknown:
        raise StrategyError(f"--strategy names unknown operator {unknown[0]!r}; operators of "
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


class Store:
    """A SubZero store directory: catalog, and one folder per run."""

    def __init__(self, path: str | os.PathLike = DEFAULT_STORE, create: bool = True):
        # absolute: Spark executors resolve paths against their own working folder
        self.path = Path(os.path.abspath(path))
        if not self.path.exists():
            if not create:
                raise StoreError(f"no SubZero store at {self.path}; run a workflow first "
                                 f"(`subzero run ...`) or pass --store")
            _mkdir(self.path, "cannot create the store")
        elif not self.path.is_dir():
            raise StoreError(f"store path {self.path} is not a directory")
        self.catalog = Catalog(self.path / "catalog.sqlite")
        if not self.catalog.readonly:
            _mkdir(self.path / "runs", "cannot create the store's runs folder")
        self._noted_readonly = False
        self._workflows: dict[int, Workflow] = {}
        self._open_runs: weakref.WeakSet[Run] = weakref.WeakSet()

    def close(self) -> None:
        for run in list(self._open_runs):
            run.close()
        self.catalog.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def readonly(self) -> bool:
        """The store cannot be written by this process (an archive, another user's
        store): runs can be listed, shown, read and traced, not added."""
        return self.catalog.readonly or not os.access(self.path / "runs", os.W_OK)

    def require_writable(self, what: str) -> None:
        """Raise a one-line StoreError when ``what`` cannot write to this store."""
        if self.readonly:
            raise StoreError(f"store {self.path} is read-only (this process cannot write to "
                             f"it), and {what} needs to write there; pass --store DIR for a "
                             f"writable store, or fix its permissions")

    def run_dir(self, run_id: int) -> Path:
        return self.path / "runs" / str(run_id)

    # -- running --------------------------------------------------------------------------
    def run(self, workflow: str | os.PathLike | Workflow, inputs: Mapping[str, Any] | None = None,
            strategies: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None,
            capture: bool = True, progress: bool | Progress | None = None, engine: str = "local",
            spark=None, master: str | None = None, conf: Mapping[str, str] | None = None,
            tile: int | None = None, log=None, plan: str | Mapping | None = None,
            max_disk: int | str | None = None, max_runtime: float | str | None = None,
            workload=None, profiler: Profiler | None = None,
            announce: Callable[[str], None] | None = None) -> "Run":
        """Run a workflow (module name, .py path or Workflow) and return the run.

        ``inputs`` maps input names to arrays, DataArrays or file paths;
        missing ones use the workflow's defaults.  ``strategies`` maps operator
        names to strategy specs (``"full"``, ``"comp:payone:backward"``...).
        ``capture=False`` runs with no lineage capture at all (a baseline).
        ``engine="spark"`` runs on a SparkSession: ``spark`` (one you have),
        or one SubZero creates from ``master`` (default ``local[*]``) and
        ``conf``; ``tile`` is the tile size per axis (default 512).
        ``engine="auto"`` chooses as ``subzero run`` does (Spark for a master or a
        session given, or for inputs big enough that Spark pays; see
        :mod:`subzero.engines.choice`) and tells ``announce`` the choice in one line.

        ``plan`` (the name of a plan saved by ``subzero optimize``, or its dict)
        chooses every operator's strategies and brings its disk budget.
        ``max_disk`` (bytes, or a size such as ``"20MB"``) and ``max_runtime`` (a
        factor over the no-lineage runtime) without a plan optimize first (see the
        ``optimizer`` package; ``workload`` is its query workload) and run with the
        new plan.  The stored lineage never exceeds the disk budget: an operator
        that would overflow it is downgraded, with a warning and a catalog entry.
        ``profiler`` is the optimizer's profiling hook (local engine only).

        ``progress``: ``None`` (default) shows operators done and, on Spark, the
        tiles of the running job, with the time left, when stderr is a terminal;
        ``True`` always, ``False`` never; or a
        :class:`~subzero.engines.progress.Progress` to receive them yourself.
        """
        if engine not in ("local", "spark", "auto"):
            raise SubZeroError(f"unknown engine {engine!r}; use local, spark or auto")
        self.require_writable("a run")
        if plan is None and (max_disk is not None or max_runtime is not None):
            from subzero.optimizer import optimize  # lazy: the optimizer depends on subzero, not back
            plan = optimize(self, workflow, params=None if params is None else dict(params),
                            inputs=None if inputs is None else dict(inputs), max_disk=max_disk,
                            max_runtime=max_runtime, workload=workload).as_dict()
        wf = load_workflow(workflow, dict(params or {}))
        budget = None
        if plan is not None:
            strategies, budget = self._plan(plan, wf, strategies, max_disk)
        elif max_disk is not None:
            budget = DiskBudget(_size(max_disk))
        if profiler is not None and engine == "auto":
            engine = "local"
        if profiler is not None and engine != "local":
            raise SubZeroError("profiling runs use the local engine (--engine local)")
        strat = resolve_strategies(wf, strategies)
        values, described = self._inputs(wf, dict(inputs or {}))
        if engine == "auto":
            from subzero.engines.choice import choose_engine
            from subzero.engines.session import java_version
            choice = choose_engine(None, master or (spark is not None and "your SparkSession") or None,
                                   (int(np.prod(shape_of(v))) for v in values.values()), java_version)
            if choice.fallback:
                warn(choice.reason)
            engine = choice.engine
            if announce is not None:
                announce(choice.line(master))
        if engine == "spark":
            from subzero.engines.session import check_workers, session
            spark = spark if spark is not None else session(master, conf)
            check_workers(spark, self.path)
        with RunTransaction.begin(self.catalog, self.path / "runs", wf, described, engine) as tx:
            journal = Journal(tx.folder)
            journal.begin(wf, strat, capture, tile or DEFAULT_TILE, budget)
            self._execute(tx, wf, values, strat, budget, capture, engine, spark, tile or DEFAULT_TILE,
                          log, progress, profiler, journal, None)
        self._workflows[tx.run_id] = wf
        return self.get(tx.run_id)

    def _execute(self, tx: RunTransaction, wf: Workflow, values, strat, budget, capture: bool,
                 engine: str, spark, tile: int, log, progress, profiler, journal: Journal,
                 resume: Resumable | None) -> None:
        """Drive the run's operators on the engine into ``tx``'s folder, and commit."""
        reporter = progress_for(progress)
        arrays = ArrayStore(tx.folder, tile=tile)
        eng: Engine
        if engine == "spark":
            from subzero.engines.spark import SparkEngine
            eng = SparkEngine(spark, arrays, log=log,
                              lineage_dir=tx.folder / "lineage" if capture else None)
        else:
            eng = LocalEngine(arrays, profiling=profiler is not None)
        lineage = LineageStore(tx.folder / "lineage") if capture else None
        what = "resuming run" if resume is not None else "run"
        reporter.begin(len(wf.steps), f"{what} {tx.run_id} ({wf.name}, {engine})")
        try:
            stats = run_workflow(eng, wf, values, strat, lineage, budget=budget,
                                 capture=capture, progress=reporter, profiler=profiler,
                                 journal=journal, resume=resume)
        finally:
            reporter.close()
            eng.close()
            if lineage is not None:
                lineage.close()
        tx.commit(wf, stats, budget.downgrades if budget is not None and capture else ())

    def resume(self, run: int | str, workflow: str | os.PathLike | Workflow | None = None,
               progress: bool | Progress | None = None, engine: str | None = None, spark=None,
               master: str | None = None, conf: Mapping[str, str] | None = None, log=None,
               announce: Callable[[str], None] | None = None) -> "Run":
        """Finish an interrupted run (its driver was lost: killed, out of memory, its host
        gone) from its first unfinished operator, with the strategies, tile size and
        disk budget it began with; the result is the run an uninterrupted one would
        have been, under the same id.

        The workflow is loaded again from where the run loaded it (its module or
        file; give ``workflow`` for a run of a Workflow object made in Python), and
        must be unchanged: its operators and their modules' source are compared with
        the run's journal.  ``engine`` defaults to the run's own (``"spark"`` when a
        ``master`` or ``spark`` is given).  Runs that completed, failed or are still
        running (their driver alive, on any host) are refused."""
        self.require_writable("resuming a run")
        row = self.catalog.get_run(run)
        if row.status != "interrupted":
            self.catalog.claim_run(row.id)      # says why not
        state = read_journal(self.path / "runs" / f"{row.id}.partial", row.id)
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
        if engine is None:
            engine = "spark" if (master or spark is not None or conf) else row.engine
        if engine not in ("local", "spark"):
            raise SubZeroError(f"unknown engine {engine!r}; use local or spark")
        if announce is not None:
            announce(f"resuming run {row.id} ({wf.name}): {len(state.done)} of {len(wf.steps)} "
                     f"operators were done; engine: {engine}")
        if engine == "spark":
            from subzero.engines.session import check_workers, session
            spark = spark if spark is not None else session(master, conf)
            check_workers(spark, self.path)
        tx = RunTransaction.resume(self.catalog, self.path / "runs", row.id)
        with tx:
            if state.inputs is None:
                # lost before its inputs were stored: start over in the same folder
                for child in tx.folder.iterdir():
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
                journal = Journal(tx.folder)
                journal.begin(wf, strat, state.capture, state.tile, state.disk_budget())
                lost = [k for k, v in row.inputs.items() if str(v).startswith("<")]
                if lost:
                    raise StoreError(f"run {row.id} was lost before its inputs were stored, and "
                                     f"input {lost[0]!r} was an array in memory; start a new run")
                values, _ = self._inputs(wf, dict(row.inputs))
                resume = None
            else:
                _discard_unfinished(tx.folder, wf, strat, state)
                journal, values, resume = Journal(tx.folder), {}, state
            self._execute(tx, wf, values, strat, state.disk_budget(), state.capture, engine, spark,
                          state.tile, log, progress, None, journal, resume)
        self._workflows[tx.run_id] = wf
        return self.get(tx.run_id)

    def _plan(self, plan, wf: Workflow, strategies, max_disk):
        """Strategies and disk budget of a saved plan (by name) or a plan dict."""
        if isinstance(plan, str):
            data = self.catalog.get_plan(plan)
            if data is None:
                names = self.catalog.plan_names()
                raise StoreError(f"no plan named {plan!r} in this store; "
                                 + (f"its plans: {', '.join(names)}" if names else
                                    "make one with `subzero optimize WORKFLOW --max-disk SIZE`"))
        else:
            data = dict(plan)
        if strategies:
            raise StrategyError("give either a plan or per-operator strategies, not both")
        if data.get("workflow") != wf.name:
            raise StrategyError(f"plan {data.get('name', '')!r} was made for workflow "
                                f"{data.get('workflow')!r}, not {wf.name!r}")
        limit = _size(max_disk) if max_disk is not None else data.get("max_disk")
        budget = None
        if limit is not None:
            budget = DiskBudget(int(limit), {(op, s): int(b) for op, per in
                                             data.get("predicted_bytes", {}).items()
                                             for s, b in per.items()})
        return data["strategies"], budget

    def _inputs(self, wf: Workflow, given: dict[str, Any]):
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
                raise WorkflowError(f"workflow {wf.name!r} needs input {name!r}; give it with "
                                    f"--input {name}=PATH")
            if isinstance(v, (str, os.PathLike)):
                described[name] = str(Path(v).resolve())
                v = open_input(v, name)
            else:
                described[name] = f"<{type(v).__name__} {list(shape_of(v))}>"
            if is_region_source(v):
                if np.dtype(v.dtype).kind not in "biuf":
                    raise WorkflowError(f"input {name!r} is not a numeric array")
            elif not isinstance(v, xr.DataArray):
                v = np.asarray(v)
                if v.dtype == object:
                    raise WorkflowError(f"input {name!r} is not a numeric array")
            values[name] = v
        return values, described

    def run_many(self, workflow, manifest: str | os.PathLike, strategies=None, params=None,
                 capture: bool = True, progress: bool | Progress | None = None, spark=None,
                 master: str | None = None, conf=None, tile: int | None = None) -> list:
        """One run per row of a CSV manifest (columns = workflow inputs, values =
        paths), as parallel Spark tasks; returns one InstanceResult per row.
        ``progress`` as in :meth:`run`, counting instances."""
        from subzero.engines.instances import read_manifest, run_instances
        self.require_writable("a run")
        wf = load_workflow(workflow, dict(params or {}))
        strat = resolve_strategies(wf, strategies)
        rows = read_manifest(manifest, wf)
        from subzero.engines.session import check_workers, session
        spark = spark if spark is not None else session(master, conf)
        check_workers(spark, self.path)
        reporter = progress_for(progress)
        reporter.begin(len(rows), f"{len(rows)} instances of {wf.name}", unit="run")
        try:
            return run_instances(self, wf, strat, rows, spark, capture=capture,
                                 tile=tile or DEFAULT_TILE, progress=reporter)
        finally:
            reporter.close()

    # -- reading -----------------------------------------------------------------------------
    def runs(self) -> list[RunRow]:
        return self.catalog.runs()

    def clean(self, dry_run: bool = False) -> list[dict[str, Any]]:
        """Remove what abandoned runs left in ``runs/``: the folders of interrupted runs
        (their driver is gone, on any host; they are then recorded failed, so they
        can no longer be resumed), task attempts' folders, heartbeat files and folders
        no catalog row owns.  Complete runs and runs still running are never
        touched.  Returns what was (with ``dry_run``: would be) removed: one dict per
        path with ``path``, ``run``, ``bytes`` and ``why``."""
        self.require_writable("cleaning")
        rows = {r.id: r for r in self.catalog.runs()}
        removed: list[dict[str, Any]] = []
        for p in sorted((self.path / "runs").iterdir()):
            head = p.name.split(".", 1)[0]
            rid = int(head) if head.isdigit() else None
            row = rows.get(rid) if rid is not None else None
            if row is not None and (row.status == "running" or p.name == str(rid)):
                continue        # alive, or a run's final folder
            if row is None and p.name.isdigit():
                why = "a run folder the catalog does not know"
            elif row is None:
                why = "left by a run the catalog does not know"
            elif row.status == "interrupted":
                why = "an interrupted run (its driver is gone)"
            else:
                why = f"left by a {row.status} run"
            removed.append({"path": str(p), "run": rid, "bytes": _tree_bytes(p), "why": why})
        if dry_run:
            return removed
        for item in removed:
            p = Path(item["path"])
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        for rid in {i["run"] for i in removed}:
            row = rows.get(rid)
            if row is not None and row.status == "interrupted":
                self.catalog.finish_run(row.id, "failed", "interrupted; removed by subzero clean")
        return removed

    def get(self, ref: str | int = "latest") -> "Run":
        row = self.catalog.get_run(ref)
        if row.status != "complete":
            why = f": {row.error}" if row.error else ""
            raise QueryError(f"run {row.id} did not complete ({row.status}{why})")
        d = self.run_dir(row.id)
        if not d.is_dir():
            raise StoreError(f"run {row.id} is in the catalog but its folder {d} is missing")
        run = Run(self, row)
        self._open_runs.add(run)
        return run

    def workflow_of(self, row: RunRow) -> Workflow:
        """The operators of a run: its ``workflow.pkl``, else its workflow module
        re-imported from its source path.  Both are code, so they are loaded only for a
        run whose signature verifies with this user's key (see :meth:`trust`); otherwise
        :class:`~subzero.storage.trust.UntrustedRun` is raised and nothing is loaded."""
        wf = self._workflows.get(row.id)
        if wf is not None:
            return wf
        verdict = self.verdict(row)
        if not verdict.trusted:
            raise UntrustedRun(f"cannot load the operators of run {row.id}: "
                               + untrusted_message(self.path, row.id, verdict))
        err = None
        if verdict.payload is not None:       # the bytes that were verified, not a re-read
            try:
                wf = load_workflow_pickle(verdict.payload)
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
        if wf is None and row.source:
            try:
                wf = load_workflow(row.source, row.params)
            except SubZeroError as e:
                err = str(e)
        if wf is None:
            raise StoreError(f"cannot load the operators of run {row.id} (workflow {row.workflow!r}"
                             f"{', ' + err if err else ''}); mapping functions and re-execution "
                             f"need them")
        self._workflows[row.id] = wf
        return wf

    # -- trust ------------------------------------------------------------------------------
    def verdict(self, run: str | int | RunRow = "latest") -> Verdict:
        """Whether a run's code may be loaded: its signature checked against this user's
        key (``.state`` is "trusted", "unsigned", "other key" or "modified")."""
        row = run if isinstance(run, RunRow) else self.catalog.get_run(run)
        if row.id in self._workflows:          # written by this process: its own code
            return Verdict(TRUSTED, read_payload(self.run_dir(row.id)))
        return verify_run(self.catalog, row, self.run_dir(row.id))

    def code_of(self, run: str | int | RunRow = "latest") -> dict[str, Any]:
        """What code a run would load, read without loading it: its operators (names and
        classes, from the catalog), the modules and names its ``workflow.pkl`` looks up,
        the functions and classes whose code travels inside it, and the workflow module
        re-imported when the pickle fails.  Plain data (for ``subzero trust --json``);
        ``payload_sha256`` names the pickle shown, for :meth:`trust`."""
        row = run if isinstance(run, RunRow) else self.catalog.get_run(run)
        verdict = self.verdict(row)
        payload = verdict.payload
        code = pickle_code(payload) if payload is not None else PickleCode()
        return {"run_id": row.id, "workflow": row.workflow, "status": row.status,
                "trust": verdict.state, "why": verdict.why, "source": row.source,
                "operators": [{"name": o["name"], "class": o["class"]}
                              for o in self.catalog.ops(row.id)],
                "pickle": payload is not None,
                "payload_sha256": hashlib.sha256(payload).hexdigest() if payload is not None else None,
                "modules": code.modules(), "functions": code.functions, "classes": code.classes,
                "unreadable": code.unreadable}

    def trust(self, run: str | int | None = None,
              payloads: Mapping[int, str | None] | None = None) -> list[int]:
        """Accept runs' code as this user's own: sign run ``run`` (an id or "latest") or,
        by default, every complete run not trusted yet, with this user's key; returns
        the ids signed.  Traces may then load — that is, run — their operators.  Look
        first at what they contain (:meth:`code_of`; ``subzero trust`` shows it and
        asks).  ``payloads`` (run id -> ``payload_sha256`` of what was shown) makes sure
        the pickles signed are the ones looked at."""
        if run is not None:
            rows = [self.catalog.get_run(run)]
            if rows[0].status != "complete":
                raise QueryError(f"run {rows[0].id} did not complete ({rows[0].status}); only a "
                                 f"complete run has code to trust")
        else:
            rows = [r for r in self.runs() if r.status == "complete" and not self.verdict(r).trusted]
        key = load_key(create=True)
        assert key is not None
        signed = []
        for row in rows:
            folder = self.run_dir(row.id)
            if not folder.is_dir():
                raise StoreError(f"run {row.id} is in the catalog but its folder {folder} is missing")
            payload = read_payload(folder)
            digest = hashlib.sha256(payload).hexdigest() if payload is not None else None
            if payloads is not None and payloads.get(row.id, digest) != digest:
                raise StoreError(f"the workflow.pkl of run {row.id} changed after it was shown; "
                                 f"nothing was trusted for it: look again and trust it again")
            write_signature(folder, key, run_record(self.catalog, row.id, payload, row.status))
            signed.append(row.id)
        for open_run in list(self._open_runs):   # their next trace checks the signature again
            if open_run.id in signed:
                open_run.close()
        return signed


class Run:
    """A complete run: its arrays, statistics, and lineage queries."""

    def __init__(self, store: Store, row: RunRow):
        self.store, self.row = store, row
        self.id = row.id
        self.dir = store.run_dir(row.id)
        self._arrays = ArrayStore(self.dir)
        self._executor: Executor | None = None
        self._grids: Callable[[str], Grid | None] | None = None
        self.planner = None      # query-time planner used by trace() (optimizer.planner_for)

    def __repr__(self) -> str:
        return f"Run({self.id}, workflow={self.row.workflow!r}, status={self.row.status!r})"

    def close(self) -> None:
        """Release the run's open lineage store (a later trace reopens it)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def workflow(self) -> Workflow:
        return self.store.workflow_of(self.row)

    @property
    def trusted(self) -> bool:
        """Whether this run's code may be loaded (its signature verifies with this user's
        key); an untrusted run answers only the trace steps its stored lineage answers."""
        return self.store.verdict(self.row).trusted

    def ops(self) -> list[dict]:
        return self.store.catalog.ops(self.id)

    def strategy_stats(self) -> list[dict]:
        return self.store.catalog.strategy_stats(self.id)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: v["shape"] for k, v in self.store.catalog.arrays(self.id).items()}

    def array_names(self) -> list[str]:
        return list(self.shapes())

    def array(self, name: str) -> xr.DataArray:
        """The array, with the labels and sky WCS of its :meth:`grid` (an operator's
        output carries its inputs' coordinates although the operator returned numpy)."""
        self._known(name)
        return with_grid(self._arrays.read(name), self.grid(name))

    def _known(self, name: str) -> None:
        if name not in self.shapes():
            raise QueryError(f"unknown array {name!r} in run {self.id}; its arrays are: "
                             f"{', '.join(self.shapes())}")

    def grid(self, name: str) -> Grid | None:
        """Where array ``name``'s cells sit in labelled axes and on the sky: the labels
        and FITS WCS it was stored with, else what its operator's ``output_grid`` makes
        of its inputs' grids.  Derived grids need the run's code, so an untrusted run
        has grids for its stored arrays only."""
        self._known(name)
        if self._grids is None:
            ops = self.ops()
            operator = None
            if self.trusted:
                steps = self.workflow.steps
                operator = lambda n: steps[n].operator  # noqa: E731 - looked up lazily
            self._grids = derive_grids(
                {o["name"]: o["inputs"] for o in ops}, self.shapes(),
                lambda n: stored_grid(*self._arrays.grid_parts(n)), operator)
        return self._grids(name)

    def trace_reach(self, start: str, cells, direction: str = "backward", shortcut: bool = True,
                    ) -> tuple[dict[str, CellSet], list[StepStat], float]:
        """Trace ``cells`` of ``start`` to every array reachable ``direction`` (backward:
        upstream) at once: ``({array: CellSet}, steps, seconds)``, each array's cells
        equal to ``trace(start, cells, to=array)``.  Not recorded in the trace log."""
        if direction not in ("backward", "forward"):
            raise QueryError(f"direction must be 'backward' or 'forward', not {direction!r}")
        return self.executor().trace_reach(start, cells, direction == "backward", shortcut,
                                           self.planner)

    def read_region(self, name: str, region: tuple[slice, ...]) -> np.ndarray:
        """A region of an array's cells (checksummed), without reading the rest."""
        self._known(name)
        return self._arrays.read_region(name, region)

    def array_info(self, name: str) -> tuple[tuple[int, ...], np.dtype, tuple[str, ...]]:
        """An array's shape, dtype and dims (its grid's where it has one), without its cells."""
        self._known(name)
        shape, dtype, _ = self._arrays.describe(name)
        g = self.grid(name)
        dims = g.dims if g is not None else self._arrays.grid_parts(name)[0]
        return shape, dtype, dims

    def cells_at(self, array: str, sky=None, radius=None, sel: Mapping[str, Any] | None = None,
                 ) -> np.ndarray:
        """Cells of ``array`` named in the user's terms: ``sky=(ra, dec)`` (degrees, or
        ``"23:47:09.8,-2:17:37"``, or a SkyCoord) with an optional ``radius``
        (``"2arcsec"``, an astropy angle, or arcseconds), or ``sel={"time": "2020-01-03",
        "lat": slice(10, 20)}`` (xarray ``.sel`` rules; nearest label on numeric and time
        axes)."""
        self._known(array)
        if (sky is None) == (sel is None):
            raise QueryError("give exactly one of sky=... or sel=...")
        shape = self.shapes()[array]
        if sky is not None:
            return sky_cells(self.grid(array), shape, sky, radius, array)
        if radius is not None:
            raise QueryError("radius goes with sky=..., not with sel=...")
        return cells_for(self.grid(array), shape, dict(sel or {}), array)

    def lineage_bytes(self) -> int:
        return sum(s["bytes"] for s in self.strategy_stats())

    def executor(self) -> Executor:
        if self._executor is None:
            ops = self.ops()
            verdict = self.store.verdict(self.row)
            view = RunView(
                run_id=self.id, workflow=lambda: self.workflow,
                strategies={o["name"]: parse("+".join(o["strategies"])) for o in ops},
                shapes=self.shapes(), inputs_of={o["name"]: o["inputs"] for o in ops},
                arrays=self._arrays, lineage_path=self.dir / "lineage",
                untrusted=None if verdict.trusted else
                untrusted_message(self.store.path, self.id, verdict))
            self._executor = Executor(view)
        return self._executor

    def trace(self, start: str, cells=None, to: str | None = None,
              path: list[tuple[str, int]] | None = None, prefer: str | None = None,
              shortcut: bool = True, record: bool = True, planner=None, *, sky=None,
              radius=None, sel: Mapping[str, Any] | None = None) -> TraceResult:
        """Trace ``cells`` of array ``start`` to array ``to`` (every DAG path,
        results united) or along ``path`` = [(operator, input index), ...].

        Instead of cells, name them by ``sky``/``radius`` or ``sel`` as in
        :meth:`cells_at`; the result's :meth:`~TraceResult.sky_region` and
        :meth:`~TraceResult.label_region` say where the answer lies in those terms.

        ``planner`` (default: ``self.planner``, e.g. ``optimizer.planner_for(run)``)
        prices each step's methods with a cost model; without one each step
        follows the simple rule (stored in the step's direction, map, stored the
        other way, re-execution).  ``record`` keeps the trace in the catalog's
        trace log, from which the optimizer derives workloads."""
        if sky is not None or sel is not None:
            if cells is not None:
                raise QueryError("give cells, or sky=/sel=, not both")
            cells = self.cells_at(start, sky=sky, radius=radius, sel=sel)
        elif cells is None:
            raise QueryError(f"trace from {start!r} needs cells (or sky=... / sel=...)")
        res = self.executor().trace(start, cells, to=to, path=path, prefer=prefer, shortcut=shortcut,
                                    planner=planner if planner is not None else self.planner)
        res._grid = self.grid
        if record and self.store.catalog.readonly:
            if not self.store._noted_readonly:
                self.store._noted_readonly = True
                warn(f"store {self.store.path} is read-only: this trace is not added to its "
                     f"trace log (the optimizer's workload)")
        elif record:
            tid = uuid.uuid4().hex[:12]
            now = time.time()
            cat = self.store.catalog
            cat.add_trace_steps([
                (tid, self.id, s.op, s.input, s.direction, s.method, s.cells_in, s.cells_out,
                 s.seconds, now, s.blocks_in, s.runs_in) for s in res.steps])
            sig, n_in = trace_signature(start, cells, to, path, shortcut)
            cat.add_trace(tid, self.id, start, res.target, res.direction, sig,
                          {"to": to, "path": path, "shortcut": shortcut}, n_in, len(res),
                          res.seconds)
        return res


def _tree_bytes(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _discard_unfinished(folder: Path, wf: Workflow, strategies, state: Resumable) -> None:
    """Remove what the operators without a journal entry may have left half-written."""
    arrays = ArrayStore(folder)
    done = set(state.done)
    lineage = LineageStore(folder / "lineage") if (folder / "lineage").is_dir() else None
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


def trace_signature(start: str, cells, to, path, shortcut: bool) -> tuple[str, int]:
    """A query's identity in the trace log (same start, cells, target or path, short-cut),
    and its number of distinct start cells: repeated queries are recognised by it."""
    c = np.unique(np.atleast_2d(np.asarray(cells, dtype=np.int64)), axis=0)
    h = hashlib.sha1(json.dumps([start, to, path and [list(p) for p in path], bool(shortcut)])
                     .encode())
    h.update(c.tobytes())
    return h.hexdigest()[:16], int(len(c))


def _mkdir(path: Path, what: str) -> None:
    """``mkdir -p``, failing as one line that names the path."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{what} {path}: {e.strerror or e}"
                         + (f" ({e.filename})" if e.filename and str(e.filename) != str(path)
                            else "")) from None


def _size(value) -> int:
    """Bytes from an int or a size such as "20MB" (the optimizer's parser, loaded lazily)."""
    if isinstance(value, str):
        from subzero.optimizer.budgets import parse_size
        return parse_size(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer)) or value < 0:
        raise SubZeroError(f"invalid disk budget {value!r}; give bytes or a size such as 20MB")
    return int(value)
