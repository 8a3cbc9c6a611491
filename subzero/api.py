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

import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

import cloudpickle
import numpy as np
import xarray as xr

from .arraystore import ArrayStore
from .catalog import Catalog, RunRow
from .engine import OpStats, run_local, shape_of
from .errors import QueryError, StoreError, StrategyError, SubZeroError, WorkflowError
from .executor import Executor, RunView, TraceResult
from .inputs import load_path
from .lineagestore import LineageStore
from .strategy import Strategy, check_supported, default_for, parse
from .workflow import Workflow, load_workflow

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
    return out


class Store:
    """A SubZero store directory: catalog, and one folder per run."""

    def __init__(self, path: str | os.PathLike = DEFAULT_STORE, create: bool = True):
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise StoreError(f"no SubZero store at {self.path}; run a workflow first "
                                 f"(`subzero run ...`) or pass --store")
            self.path.mkdir(parents=True)
        elif not self.path.is_dir():
            raise StoreError(f"store path {self.path} is not a directory")
        (self.path / "runs").mkdir(exist_ok=True)
        self.catalog = Catalog(self.path / "catalog.sqlite")
        self._workflows: dict[int, Workflow] = {}

    def close(self) -> None:
        self.catalog.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def run_dir(self, run_id: int) -> Path:
        return self.path / "runs" / str(run_id)

    # -- running --------------------------------------------------------------------------
    def run(self, workflow: str | os.PathLike | Workflow, inputs: Mapping[str, Any] | None = None,
            strategies: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None,
            capture: bool = True, progress: bool | None = None) -> "Run":
        """Run a workflow (module name, .py path or Workflow) and return the run.

        ``inputs`` maps input names to arrays, DataArrays or file paths;
        missing ones use the workflow's defaults.  ``strategies`` maps operator
        names to strategy specs (``"full"``, ``"comp:payone:backward"``...).
        ``capture=False`` runs with no lineage capture at all (a baseline).
        """
        wf = load_workflow(workflow, dict(params or {}))
        strat = resolve_strategies(wf, strategies)
        values, described = self._inputs(wf, dict(inputs or {}))
        source = wf.source
        run_id = self.catalog.begin_run(wf.name, source, wf.params, described, "local")
        final = self.run_dir(run_id)
        tmp = final.with_name(f"{run_id}.partial")
        try:
            tmp.mkdir(parents=True)
            arrays = ArrayStore(tmp)
            lineage = LineageStore(tmp / "lineage") if capture else None
            bar = _progress(len(wf.steps), f"run {run_id} ({wf.name})", progress)
            try:
                stats = run_local(wf, values, strat, arrays, lineage, capture=capture, progress=bar)
            finally:
                if bar is not None:
                    bar.close()
                if lineage is not None:
                    lineage.close()
            self._save_workflow(wf, tmp)
            self._record(run_id, wf, values, stats, strat)
            os.replace(tmp, final)
            self.catalog.finish_run(run_id, "complete")
        except BaseException as e:
            msg = str(e) if isinstance(e, SubZeroError) else f"{type(e).__name__}: {e}"
            if isinstance(e, KeyboardInterrupt):
                msg = "interrupted"
            self.catalog.finish_run(run_id, "failed", msg)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._workflows[run_id] = wf
        return self.get(run_id)

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
                v = load_path(v, name)
            else:
                described[name] = f"<{type(v).__name__} {list(shape_of(v))}>"
            if not isinstance(v, xr.DataArray):
                v = np.asarray(v)
                if v.dtype == object:
                    raise WorkflowError(f"input {name!r} is not a numeric array")
            values[name] = v
        return values, described

    def _save_workflow(self, wf: Workflow, run_dir: Path) -> None:
        """Keep the operators so traces can re-run them later, even from another process."""
        mods = [m for n, m in list(sys.modules.items()) if n.startswith("subzero_wf_")]
        for m in mods:
            try:
                cloudpickle.register_pickle_by_value(m)
            except Exception:
                pass
        try:
            (run_dir / "workflow.pkl").write_bytes(cloudpickle.dumps(wf))
        except Exception:
            pass   # re-execution will reload the workflow from its source instead
        finally:
            for m in mods:
                try:
                    cloudpickle.unregister_pickle_by_value(m)
                except Exception:
                    pass

    def _record(self, run_id, wf, values, stats: list[OpStats], strat) -> None:
        with self.catalog.tx():
            for name, v in values.items():
                a = np.asarray(v)
                self.catalog.add_array(run_id, name, "input", shape_of(a), a.dtype, a.nbytes)
            for seq, st in enumerate(stats):
                self.catalog.add_array(run_id, st.name, "output", st.shape, st.dtype, st.nbytes)
                self.catalog.add_op(run_id, seq, st.name, st.cls, st.inputs, st.strategies, st.shape,
                                    st.run_s, st.lwrite_s, st.lineage_s, st.pairs, st.lineage_bytes)
                for ps in st.per_strategy:
                    self.catalog.add_strategy_stat(run_id, st.name, ps["strategy"], ps["bytes"],
                                                   ps["write_s"], ps["pairs"])

    # -- reading -----------------------------------------------------------------------------
    def runs(self) -> list[RunRow]:
        return self.catalog.runs()

    def get(self, ref: str | int = "latest") -> "Run":
        row = self.catalog.get_run(ref)
        if row.status != "complete":
            why = f": {row.error}" if row.error else ""
            raise QueryError(f"run {row.id} did not complete ({row.status}{why})")
        d = self.run_dir(row.id)
        if not d.is_dir():
            raise StoreError(f"run {row.id} is in the catalog but its folder {d} is missing")
        return Run(self, row)

    def workflow_of(self, row: RunRow) -> Workflow:
        wf = self._workflows.get(row.id)
        if wf is not None:
            return wf
        pkl = self.run_dir(row.id) / "workflow.pkl"
        err = None
        if pkl.exists():
            try:
                wf = cloudpickle.loads(pkl.read_bytes())
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


class Run:
    """A complete run: its arrays, statistics, and lineage queries."""

    def __init__(self, store: Store, row: RunRow):
        self.store, self.row = store, row
        self.id = row.id
        self.dir = store.run_dir(row.id)
        self._arrays = ArrayStore(self.dir)
        self._executor: Executor | None = None

    def __repr__(self) -> str:
        return f"Run({self.id}, workflow={self.row.workflow!r}, status={self.row.status!r})"

    @property
    def workflow(self) -> Workflow:
        return self.store.workflow_of(self.row)

    def ops(self) -> list[dict]:
        return self.store.catalog.ops(self.id)

    def strategy_stats(self) -> list[dict]:
        return self.store.catalog.strategy_stats(self.id)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: v["shape"] for k, v in self.store.catalog.arrays(self.id).items()}

    def array_names(self) -> list[str]:
        return list(self.shapes())

    def array(self, name: str) -> xr.DataArray:
        if name not in self.shapes():
            raise QueryError(f"unknown array {name!r} in run {self.id}; its arrays are: "
                             f"{', '.join(self.shapes())}")
        return self._arrays.read(name)

    def lineage_bytes(self) -> int:
        return sum(s["bytes"] for s in self.strategy_stats())

    def executor(self) -> Executor:
        if self._executor is None:
            ops = self.ops()
            view = RunView(
                run_id=self.id, workflow=lambda: self.workflow,
                strategies={o["name"]: parse("+".join(o["strategies"])) for o in ops},
                shapes=self.shapes(), inputs_of={o["name"]: o["inputs"] for o in ops},
                arrays=self._arrays, lineage_path=self.dir / "lineage")
            self._executor = Executor(view)
        return self._executor

    def trace(self, start: str, cells, to: str | None = None,
              path: list[tuple[str, int]] | None = None, prefer: str | None = None,
              shortcut: bool = True, record: bool = True) -> TraceResult:
        """Trace ``cells`` of array ``start`` to array ``to`` (every DAG path,
        results united) or along ``path`` = [(operator, input index), ...]."""
        res = self.executor().trace(start, cells, to=to, path=path, prefer=prefer, shortcut=shortcut)
        if record:
            tid = uuid.uuid4().hex[:12]
            now = time.time()
            self.store.catalog.add_trace_steps([
                (tid, self.id, s.op, s.input, s.direction, s.method, s.cells_in, s.cells_out,
                 s.seconds, now) for s in res.steps])
        return res


def _progress(total: int, desc: str, enabled: bool | None):
    if enabled is False:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="op", disable=None if enabled is None else not enabled,
                file=sys.stderr, leave=False)
