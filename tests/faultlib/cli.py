"""Fault cases through the real command line: ``subzero trace ... --json`` in a subprocess.

What a user sees must be the correct cells with exit 0, or exit 2 with one line
``subzero: error: ...`` on stderr (``subzero: warning:`` lines may precede it).
Anything else is classified like the in-process cases: exit 1 or a traceback is an
``internal error``, a signal a ``crash``, the timeout a ``hang``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from faultlib.cases import Case
from faultlib.damage import Damage, apply
from faultlib.fixtures import Fixture, Query


@dataclass
class CliResult:
    case: Case
    query: str
    outcome: str
    detail: str
    code: int | None
    stderr: str

    @property
    def failed(self) -> bool:
        return self.outcome not in ("exact", "clear error")

    def describe(self) -> str:
        c = self.case
        return (f"CLI case {c.number}: fixture {c.fixture}, {c.target.kind} {c.target.describe()}: "
                f"{c.damage.describe()} -> `subzero trace` {self.query}: {self.outcome}: "
                f"{self.detail}")


def trace_args(q: Query, store: Path, run_id: int) -> list[str]:
    """``subzero trace`` arguments for a query (the CLI has no ``prefer``: default order)."""
    args = ["trace", "--store", str(store), "--run", str(run_id), "--from", q.start,
            "--cells", ";".join(",".join(str(x) for x in c) for c in q.cells), "--json"]
    if q.to is not None:
        args += ["--to", q.to]
    else:
        assert q.path is not None
        args += ["--path", ",".join(f"{op}:{i}" for op, i in q.path)]
    return args


def classify_cli(code: int | None, out: str, err: str, want: np.ndarray) -> tuple[str, str]:
    if code is None:
        return "hang", "no answer before the timeout"
    if code < 0:
        return "crash", f"killed by signal {-code}"
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("subzero: warning:")]
    if code == 0:
        try:
            cells = np.asarray(json.loads(out)["cells"], dtype=np.int64).reshape(-1, want.shape[1])
        except (ValueError, KeyError, TypeError) as e:
            return "internal error", f"exit 0 without a JSON answer ({e})"
        if cells.shape == want.shape and np.array_equal(cells, want):
            return "exact", ""
        return "wrong", f"exit 0 with {len(cells)} cells instead of {len(want)} (or other cells)"
    if code == 2 and len(lines) == 1 and lines[0].startswith("subzero: error:"):
        return "clear error", lines[0]
    shown = " | ".join(lines[-3:]) or "(nothing on stderr)"
    return "internal error", f"exit {code}, {len(lines)} stderr line(s): {shown}"


def run_cli_case(case: Case, query: str, fixtures: list[Fixture], workdir: Path, exe: str,
                 timeout: float = 120.0) -> CliResult:
    fx = next(f for f in fixtures if f.name == case.fixture)
    q = next(q for q in fx.queries if q.label == query)
    dst = workdir / f"cli-{case.seed}-{case.number}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(fx.store, dst)
    apply(dst, case.target, case.damage, fx)
    try:
        p = subprocess.run([exe, *trace_args(q, dst, fx.run_id)], capture_output=True, text=True,
                           timeout=timeout)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        code, out, err = None, "", ""
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    outcome, detail = classify_cli(code, out, err, fx.answers[query].cells)
    return CliResult(case, query, outcome, detail, code, err)


def run_cli_cases(todo: list[tuple[Case, str]], fixtures: list[Fixture], workdir: str | Path,
                  exe: str, jobs: int = 2, timeout: float = 120.0) -> list[CliResult]:
    """(case, query label) pairs through ``exe trace``, ``jobs`` subprocesses at once."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(lambda cq: run_cli_case(cq[0], cq[1], fixtures, workdir, exe, timeout),
                             todo))


#: (fixture, target kind, text in its path or LMDB sub-database [#block], damage, query): damage
#: the query is sure to meet — an R-tree header overwritten, a chunk that re-execution
#: reads deleted, a key-index block deleted, a payload table zeroed, the catalog's
#: header overwritten, an array's metadata emptied.
CLI_CASES = (
    ("fullmany", "rtree-dat", "stars_full_fullmany_backward", Damage("overwrite-random", 100, 8),
     "B-star[default]"),
    ("blackbox", "zarr-chunk", "clean.zarr/data/c/1/2", Damage("delete"), "B-star[default]"),
    ("fullone", "lmdb:key-index", "stars|full:fullone:backward#1", Damage("delete"),
     "B-star[default]"),
    ("paymany", "lmdb:payload-table", "stars|pay:paymany:backward",
     Damage("overwrite-zeros", 8, 16), "B-star[default]"),
    ("fullone", "catalog", "catalog.sqlite", Damage("overwrite-random", 0, 16), "F-raw[default]"),
    ("blackbox", "zarr-meta", "clean.zarr/data/zarr.json", Damage("truncate-zero"),
     "B-star[default]"),
)


def pick_cli_cases(seed: int, fixtures: list[Fixture]) -> list[tuple[Case, str]]:
    """The CLI cases (numbered 0..5; ``seed`` only seeds the random bytes)."""
    by_name = {f.name: f for f in fixtures}
    out = []
    for n, (fx, kind, where, d, query) in enumerate(CLI_CASES):
        if fx not in by_name:
            continue
        db, _, blk = where.partition("#")
        t = next(t for t in by_name[fx].targets
                 if t.kind == kind and (where in t.path or db == t.db)
                 and (not blk or (t.key or "").endswith(f"{int(blk):016x}")))
        size = t.size
        d = replace(d, offset=min(d.offset, max(0, size - d.length)), length=min(d.length, size),
                    seed=seed)
        out.append((Case(seed, n, fx, t, d), query))
    return out
