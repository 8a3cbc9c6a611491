"""Query workloads for the optimizer: what is asked, how often, how big.

A workload is a list of queries (from/to or an explicit path, start cells or
a typical size, weight).  It comes from a JSON file (the format of
``subzero trace --workload``, plus ``"size": N`` as a shorthand for N random
cells of the start array, and an optional ``"direction"`` to check), or from
the catalog's trace log of earlier runs — the paper's feedback loop: the
queries scientists actually asked, weighted by how often.

The optimizer prices queries step by step, so each query needs the cells in
and out of every step.  Those do not depend on how lineage is stored, so they
are measured once by tracing the query on a run of the workflow (usually the
profiling run) and then reused from the trace log by the query's signature.
"""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from subzero.errors import WorkloadError
from subzero.forked import ChildWatch, fork_child
from subzero.query.tracelog import trace_signature
from subzero.query.workload import (
    Query,
    parse_workload,
    read_workload_json,
    select_cells,
    whole_number,
)
from subzero.scratch import scratch
from subzero.tuning import BESIDE_POLL_S, BESIDE_STALL_S, WORKLOAD_TRACES


@dataclass
class WorkloadQuery:
    name: str
    weight: float
    direction: str
    start: str
    target: str
    steps: list[dict] = field(default_factory=list)   # op, input, direction, cells_in/out, blocks_in, runs_in
    #: arrays its cell selector reads values of (``"where": "crmask == 1"``); a query
    #: picking cells by index, box, label or sky position reads none of its start's
    selects: list[str] = field(default_factory=list)


def read_file(path: str | Path) -> list[tuple[Query, int | None]]:
    """Parse a workload file; returns (query, size) with size for ``"size"`` queries."""
    p = Path(path)
    data = read_workload_json(p)
    items = data.get("queries") if isinstance(data, dict) else data
    sizes = []
    if isinstance(items, list):
        for k, q in enumerate(items):
            size = None
            if isinstance(q, dict) and "size" in q and "cells" not in q:
                size = whole_number(q["size"], "\"size\" (cells to pick)",
                                    f"{p}: query {q.get('name', k + 1)!r}", least=1)
                q = {**q, "cells": {"cells": []}}
                items[k] = q
            sizes.append(size)
            if isinstance(q, dict) and q.get("direction") not in (None, "backward", "forward"):
                raise WorkloadError(f"{p}: query {q.get('name', k + 1)!r}: \"direction\" must be "
                                    f"backward or forward")
    queries = parse_workload({"queries": items} if isinstance(data, dict) else items, str(p))
    return list(zip(queries, sizes))


def _cells(run, q: Query, size: int | None) -> np.ndarray:
    if size is None:
        return select_cells(run, q)
    shape = run.shapes().get(q.start)
    if shape is None:
        raise WorkloadError(f"query {q.name!r}: unknown array {q.start!r} in run {run.id}")
    rng = np.random.default_rng(0)
    flat = rng.choice(int(np.prod(shape)), size=min(size, int(np.prod(shape))), replace=False)
    return np.column_stack(np.unravel_index(np.sort(flat), shape)).astype(np.int64)


def measure(store, run, queries: list[tuple[Query, int | None]], planner=None,
            progress=None, split: bool = False) -> list[WorkloadQuery]:
    """Per-step sizes of every query on ``run``: from the trace log when this query
    was traced before on a run of the same workflow and parameters, else traced now
    (and so logged for next time, its steps marked ``cold``: their times, warm from the
    run's own process, are not what a trace costs, and nothing learns from them).
    ``split``: the queries to trace shared with a forked child (:func:`_traced_beside`),
    when a core would otherwise be idle."""
    found = []
    for q, size in queries:
        cells = _cells(run, q, size)
        sig, _ = trace_signature(q.start, cells, q.to, q.path, q.shortcut)
        found.append((cells, next((t for t in reversed(store.catalog.traces(run.row.workflow, sig))
                                   if t["params"] == run.row.params), None)))
    todo = [k for k, (_, logged) in enumerate(found) if logged is None]
    traced = _traced_beside(store, run, queries, [cells for cells, _ in found], todo,
                            planner) if split and len(todo) >= 2 else {}
    out = []
    for k, ((q, _size), (cells, logged)) in enumerate(zip(queries, found)):
        if logged is not None:
            steps = store.catalog.steps_of(logged["trace_id"])
            target, direction = logged["target"], logged["direction"]
        else:
            res = traced.get(k) or run.trace(q.start, cells, to=q.to, path=q.path,
                                              shortcut=q.shortcut, planner=planner, record=False)
            for st in res.steps:
                # measured in the run's own process, on lineage it has just written and
                # read back (genomics 100x: a one-cell backward read took 0.32 ms here,
                # 6 ms in a trace process): logged for its sizes, not learnt from
                st.cold = True
            store.log_trace(run.id, q.start, cells, q.to, q.path, q.shortcut, res)
            steps = [dict(op=s.op, input=s.input, direction=s.direction, method=s.method,
                          cells_in=s.cells_in, cells_out=s.cells_out, seconds=s.seconds,
                          blocks_in=s.blocks_in, runs_in=s.runs_in) for s in res.steps]
            target, direction = res.target, res.direction
        want = q.extra.get("direction")
        if want and want != direction:
            raise WorkloadError(f"query {q.name!r} says it goes {want}, but {q.start} -> "
                                f"{target} is {direction}")
        out.append(WorkloadQuery(q.name, q.weight, direction, q.start, target, steps,
                                 selects=selected_arrays(q.cells, run.shapes())))
        if progress is not None:
            progress()
    return out


@dataclass
class _Traced:
    """A query traced in another process, as the trace log keeps it: a trace result's
    target, direction, steps, seconds and count of cells, without the cells."""
    target: str
    direction: str
    steps: list
    seconds: float
    count: int

    def __len__(self) -> int:
        return self.count


def _traced_beside(store, run, queries, cells: list, todo: list[int], planner) -> dict:
    """The queries ``todo`` (indices into ``queries``) traced on ``run`` by this process
    and a forked child together: this process takes them from the first, the child from
    the last, each claiming one at a time (a file made only if it does not exist), so
    neither waits while the other has queries left.  Query index -> its trace result;
    one the child did not bring back (it failed, died or stalled) is missing, and the
    caller traces it (and reports what is wrong with it).  The child opens the store
    on its own (a catalog connection is not shared across a fork).  At genomics
    10,000x the workload took 9-12 s on one core while the other had finished pricing."""
    from subzero.store import open_store
    held = scratch("workload")
    folder = held.path

    def claim(k: int) -> bool:
        try:
            os.close(os.open(folder / f"claim-{k}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    def trace(r, k: int):
        q = queries[k][0]
        return r.trace(q.start, cells[k], to=q.to, path=q.path, shortcut=q.shortcut,
                       planner=planner, record=False)

    def theirs() -> dict:               # in the child
        child = open_store(store.path, create=False)
        crun = child.get(run.id)
        got = {}
        for k in reversed(todo):
            if not claim(k):
                break
            try:
                res = trace(crun, k)
            except Exception:           # traced again by the run's process, which says why
                break
            got[k] = _Traced(res.target, res.direction, list(res.steps), res.seconds, len(res))
        return got
    pid = fork_child(folder / "traced.pkl", theirs)
    if pid is None:
        held.close()
        return {}
    watch = ChildWatch(pid, BESIDE_STALL_S)
    mine: dict = {}
    try:
        for k in todo:
            if not claim(k):
                break
            mine[k] = trace(run, k)
        while watch.alive():
            time.sleep(BESIDE_POLL_S)
        try:
            got = pickle.loads((folder / "traced.pkl").read_bytes())
        except Exception:
            got = {}
    finally:
        watch.stop()
        held.close()
    return {**got, **mine}


def selected_arrays(cells, names) -> list[str]:
    """The arrays (among ``names``) a query's cell selector reads values of: those its
    ``"where"`` expression names."""
    import re
    where = cells.get("where") if isinstance(cells, dict) else None
    if not isinstance(where, str):
        return []
    return sorted(set(re.findall(r"[A-Za-z_][\w.-]*", where)) & set(names))


def from_trace_log(store, workflow: str, params: dict,
                   limit: int = WORKLOAD_TRACES) -> list[WorkloadQuery]:
    """The workload scientists actually ran: every distinct query of the trace log
    (same start, cells and target or path) on runs of this workflow and parameters,
    weighted by how often it was asked; its latest trace gives the step sizes."""
    groups: dict[str, list[dict]] = {}
    for t in store.catalog.traces(workflow)[-limit:]:
        if t["params"] == params:
            groups.setdefault(t["signature"], []).append(t)
    out = []
    for ts in groups.values():
        last = ts[-1]
        to = last["spec"].get("to")
        name = f"{last['start']}->{to or last['target']} ({last['cells_in']} cells)"
        out.append(WorkloadQuery(name, float(len(ts)), last["direction"], last["start"],
                                 last["target"], store.catalog.steps_of(last["trace_id"])))
    return out


def sibling_file(source: str | None) -> Path | None:
    """``workflows/genomics.py`` ships ``workflows/genomics_workload.json``."""
    if not source or not source.endswith(".py"):
        return None
    p = Path(source)
    f = p.with_name(p.stem + "_workload.json")
    return f if f.is_file() else None
