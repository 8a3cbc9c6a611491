"""Query workloads as data: the scientists' questions, runnable on any run.

A workload is a JSON file::

    {"workflow": "astronomy",
     "queries": [
       {"name": "BQ1-1", "from": "stars", "to": "raw_1",
        "cells": {"where": "stars > 0", "n": 10, "seed": 1}},
       {"name": "BQ3", "from": "rmcr", "path": [["rmcr", 1]],
        "cells": {"box": [[1000, 200], [1025, 220]]}},
       {"name": "FQ0Slow", "from": "raw_1", "to": "rmoverscan_1",
        "cells": {"box": [[100, 100], [110, 110]]}, "shortcut": false, "weight": 0.5}]}

``cells`` selects cells of the start array: ``{"cells": [[y, x], ...]}``,
``{"box": [lo, hi]}`` (half-open), or ``{"where": "ARRAY OP NUMBER", "n": N,
"seed": S, "distinct": bool}`` — N random cells of the start array where the
condition on ARRAY (same shape) holds; with ``distinct`` no two picked cells
share a value of ARRAY (e.g. one pixel per star); ``{"sky": "RA,DEC", "radius":
"2arcsec"}`` or ``{"sel": {"time": "2020-01-03", "lat": "10:20"}}`` name cells
in the user's coordinates (see :mod:`subzero.coords`).  ``weight`` (default 1) is
the query's share of the workload, used by the optimizer.
"""

from __future__ import annotations

import json
import operator as _op
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from subzero.errors import QueryError, WorkloadError
from subzero.heap import release
from subzero.model.cells import outside, union_of_boxes
from subzero.query.trace import TraceResult

if TYPE_CHECKING:
    import xarray as xr

_OPS = {"==": _op.eq, "!=": _op.ne, ">=": _op.ge, "<=": _op.le, ">": _op.gt, "<": _op.lt}
_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*(==|!=|>=|<=|>|<)\s*(-?[0-9.eE+\-]+)\s*$")


@dataclass
class Query:
    name: str
    start: str
    cells: dict
    to: str | None = None
    path: list[tuple[str, int]] | None = None
    shortcut: bool = True
    weight: float = 1.0
    extra: dict = field(default_factory=dict)


class RunArrays(Protocol):
    """What a query's cell selector reads of a run (:class:`subzero.api.Run` has it;
    the query layer names it here rather than reach up to the API)."""

    @property
    def id(self) -> int: ...

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def cells_at(self, array: str, sky: Any = None, radius: Any = None,
                 sel: Mapping[str, Any] | None = None) -> np.ndarray:
        """Cells named by sky position or by labels."""
        ...

    def array(self, name: str) -> xr.DataArray: ...


class TracingRun(RunArrays, Protocol):
    """A run a workload is traced on (:class:`subzero.api.Run`)."""

    def trace(self, start: str, cells: Any = None, to: str | None = None,
              path: list[tuple[str, int]] | None = None, prefer: str | None = None,
              shortcut: bool = True, record: bool = True) -> TraceResult: ...

    def executor(self) -> Any:
        """The run's query executor (its ``clear_cache`` drops what traces decoded)."""
        ...


def parse_workload(data: Any, source: str = "workload") -> list[Query]:
    if isinstance(data, dict):
        items = data.get("queries")
    else:
        items = data
    if not isinstance(items, list) or not items:
        raise WorkloadError(f"{source}: expected a JSON object with a non-empty \"queries\" list")
    out = []
    for k, q in enumerate(items):
        where = f"{source}: query {k + 1}"
        if not isinstance(q, dict):
            raise WorkloadError(f"{where} must be an object")
        name = str(q.get("name", f"Q{k + 1}"))
        where = f"{source}: query {name!r}"
        if "from" not in q or "cells" not in q:
            raise WorkloadError(f"{where} needs \"from\" and \"cells\"")
        if ("to" in q) == ("path" in q):
            raise WorkloadError(f"{where} needs exactly one of \"to\" or \"path\"")
        path = None
        if "path" in q:
            try:
                path = [(str(a), int(b)) for a, b in q["path"]]
            except (TypeError, ValueError) as err:
                raise WorkloadError(f"{where}: \"path\" must be a list of [operator, input index]") from err
        cells = q["cells"]
        if isinstance(cells, list):
            cells = {"cells": cells}
        if not isinstance(cells, dict) or not ({"cells", "box", "where", "sky", "sel"} & set(cells)):
            raise WorkloadError(f"{where}: \"cells\" must be a list of cells or an object with "
                                f"\"cells\", \"box\", \"where\", \"sky\" or \"sel\"")
        if "sel" in cells and not isinstance(cells["sel"], dict):
            raise WorkloadError(f"{where}: \"sel\" must be an object of coordinate: label or "
                                f"\"FROM:TO\"")
        cells = _checked_selector(cells, where)
        try:
            weight = float(q.get("weight", 1.0))
        except (TypeError, ValueError) as err:
            raise WorkloadError(f"{where}: \"weight\" must be a number") from err
        if weight < 0:
            raise WorkloadError(f"{where}: \"weight\" must not be negative")
        out.append(Query(name, str(q["from"]), cells, q.get("to"), path,
                         bool(q.get("shortcut", True)), weight,
                         {k2: v for k2, v in q.items() if k2 not in
                          ("name", "from", "to", "path", "cells", "shortcut", "weight")}))
    return out


def whole_number(value: Any, what: str, where: str, least: int | None = None) -> int:
    """A JSON value that must be a whole number (of at least ``least``): ``10`` or
    ``10.0``, not a text, a bool, NaN, infinity or ``2.5``; else a WorkloadError naming it."""
    ok = not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and value.is_integer()))
    if not ok or (least is not None and value < least):
        kind = "a whole number" + (f" of {least} or more" if least is not None else "")
        raise WorkloadError(f"{where}: {what} must be {kind}, not {json.dumps(value)}")
    return int(value)


def _cell_rows(value: Any, what: str, where: str) -> list[list[int]]:
    """A list of cells (lists of whole numbers of one length), checked."""
    if not isinstance(value, list) or not all(isinstance(c, list) for c in value) \
            or len({len(c) for c in value}) > 1:
        raise WorkloadError(f"{where}: {what} must be a list of cells of equal length, such as "
                            f"[[12, 40], [13, 41]]")
    return [[whole_number(v, f"{what} coordinate", where) for v in c]
            for c in value]


def _checked_selector(sel: dict, where: str) -> dict:
    """A query's ``cells`` selector with its numbers checked (NaN, text, negative counts
    and seeds, non-integer cells are one line naming the query)."""
    sel = dict(sel)
    if "cells" in sel:
        sel["cells"] = _cell_rows(sel["cells"], "\"cells\"", where)
    elif "box" in sel:
        box_ = sel["box"]
        if not (isinstance(box_, list) and len(box_) == 2):
            raise WorkloadError(f"{where}: \"box\" must be [lo, hi], such as [[10, 20], [30, 40]]")
        lo, hi = _cell_rows(box_, "\"box\"", where)
        sel["box"] = [lo, hi]
    elif "where" in sel:
        if "n" in sel:
            sel["n"] = whole_number(sel["n"], "\"n\" (cells to pick)", where, least=1)
        if "seed" in sel:
            sel["seed"] = whole_number(sel["seed"], "\"seed\"", where, least=0)
        if not isinstance(sel.get("distinct", False), bool):
            raise WorkloadError(f"{where}: \"distinct\" must be true or false")
    return sel


def read_workload_json(path: str | Path) -> Any:
    """The decoded JSON of a workload file (whatever it holds: :func:`parse_workload`
    checks it), or a clear error."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"workload file not found: {p}")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise WorkloadError(f"workload file {p} is not valid JSON: line {e.lineno}: {e.msg}") from e


def load_workload(path: str | Path) -> list[Query]:
    return parse_workload(read_workload_json(path), str(path))


def select_cells(run: RunArrays, q: Query) -> np.ndarray:
    """Resolve a query's cell selector against a run's arrays."""
    shapes = run.shapes()
    if q.start not in shapes:
        raise QueryError(f"query {q.name!r}: unknown array {q.start!r} in run {run.id}")
    shape = shapes[q.start]
    sel = _checked_selector(q.cells, f"query {q.name!r}")
    if "cells" in sel:
        rows = sel["cells"]
        if rows and len(rows[0]) != len(shape):
            raise QueryError(f"query {q.name!r}: its cells have {len(rows[0])} coordinates, but "
                             f"{q.start} has {len(shape)} dimensions (shape {tuple(shape)})")
        for c in rows:
            if any(not 0 <= v < n for v, n in zip(c, shape)):
                raise QueryError(f"query {q.name!r}: " + outside(c, shape, q.start))
        return np.asarray(rows, dtype=np.int64).reshape(-1, len(shape))
    if "box" in sel:
        lo, hi = sel["box"]
        if len(lo) != len(shape) or any(not 0 <= a < b <= n for a, b, n in zip(lo, hi, shape)):
            raise QueryError(f"query {q.name!r}: box {lo}..{hi} is not a non-empty box inside "
                             f"{q.start} (shape {tuple(shape)})")
        return union_of_boxes([(lo, hi)], shape, q.start)
    if "sky" in sel:
        return run.cells_at(q.start, sky=sel["sky"], radius=sel.get("radius"))
    if "sel" in sel:
        from subzero.coords import parse_sel
        return run.cells_at(q.start, sel=parse_sel(f"{k}={v}" for k, v in sel["sel"].items()))
    m = _WHERE.match(str(sel["where"]))
    if not m:
        raise QueryError(f"query {q.name!r}: malformed condition {sel['where']!r}; write e.g. "
                         f"\"stars > 0\"")
    arr_name, opname, num = m.groups()
    if arr_name not in shapes:
        raise QueryError(f"query {q.name!r}: unknown array {arr_name!r} in condition")
    values = np.asarray(run.array(arr_name).values)
    if values.shape != tuple(shape):
        raise QueryError(f"query {q.name!r}: condition array {arr_name!r} has shape {values.shape}, "
                         f"not the start array's {tuple(shape)}")
    cand = np.argwhere(_OPS[opname](values, float(num)))
    if cand.size == 0:
        raise QueryError(f"query {q.name!r}: no cell of {arr_name} satisfies {sel['where']!r}")
    rng = np.random.default_rng(int(sel.get("seed", 0)))
    n = int(sel.get("n", 1))
    if sel.get("distinct"):
        vals = values[tuple(cand.T)]
        _, first = np.unique(vals, return_index=True)
        cand = cand[np.sort(first)]
    pick = rng.choice(len(cand), size=min(n, len(cand)), replace=False)
    return cand[np.sort(pick)]


def run_workload(run: TracingRun, queries: list[Query], prefer: str | None = None, repeats: int = 1,
                 record: bool = True, warm: bool = False) -> list[dict[str, Any]]:
    """Run every query; returns one row per query (median time of ``repeats``).

    Each query (each repeat) starts from nothing decoded and nothing mapped: the
    lineage blocks and arrays the queries before it loaded are dropped first, and the
    lineage store is closed (opening it again is the query's first use, as in a
    process of its own; lineage pages an earlier query had mapped made the same read
    up to 2x cheaper under one plan than under another at genomics 100x), and the
    memory earlier queries freed is given back to the system (``heap.release``): the
    query faults in pages of its own, as a process of its own does, where it reused
    those of the queries before it -- under the defaults genomics' forward queries
    scan whole indexes first and BQ0 after them ran on their pages, under a plan
    whose forward queries are small it faulted its own in, and the same two reads
    took 1.4x as long at 1,000x.  A
    workload is a set of questions, and its table says what each costs; otherwise a
    query is fast or slow for what came before it in the file -- under one plan a
    forward scan decodes every block of a backward index and the backward queries
    after it read it warm, under another they read it cold -- and its steps teach the
    trace log that order's cost.  ``warm=True`` keeps what earlier queries decoded (a
    session's total, in the file's order)."""
    rows = []
    for q in queries:
        cells = select_cells(run, q)
        times, cpu, own = [], [], []
        for _ in range(max(1, repeats)):
            if not warm:
                run.executor().clear_cache(close=True)
                release()
            c0, t0 = time.process_time(), time.perf_counter()
            res = run.trace(q.start, cells, to=q.to, path=q.path, prefer=prefer,
                            shortcut=q.shortcut, record=record)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            own.append(sum(s.cpu for s in res.steps))
        rows.append({"name": q.name, "from": q.start, "to": res.target, "direction": res.direction,
                     "cells_in": int(len(cells)), "count": int(len(res)),
                     "seconds": float(np.median(times)), "weight": q.weight,
                     # CPU seconds: what the query cost, without the time other processes
                     # held the core (a shared machine's benchmarks compare these too)
                     "cpu_seconds": float(np.median(cpu)),
                     # the steps' own CPU seconds (first uses left out): what the cost
                     # model predicts; and how many steps met cold caches
                     "steps_cpu_seconds": float(np.median(own)),
                     "cold_steps": sum(1 for s in res.steps if s.cold),
                     "methods": [s.method for s in res.steps], "result": res})
    return rows
