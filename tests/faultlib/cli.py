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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from faultlib.cases import Case
from faultlib.damage import apply
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
        return f"{self.case.describe()} -> `subzero trace` {self.query}: {self.outcome}: {self.detail}"


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
    apply(dst, case.target, case.damage)
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


#: kinds of damage shown to the command line (one case each)
CLI_KINDS = ("rtree-dat", "lmdb:payload-table", "lmdb:key-index", "zarr-chunk", "zarr-meta",
             "catalog", "workflow-pkl")
CLI_QUERIES = ("B-star[default]", "F-raw[default]")


def pick_cli_cases(seed: int, fixtures: list[Fixture],
                   kinds: tuple[str, ...] = CLI_KINDS) -> list[tuple[Case, str]]:
    """The first case of ``seed`` of each kind, with a backward or forward query."""
    from faultlib.cases import make_case
    have = {t.kind for f in fixtures for t in f.targets}
    out = []
    n = 0
    for i, kind in enumerate(k for k in kinds if k in have):
        while True:
            c = make_case(seed, n, fixtures)
            n += 1
            if c.target.kind == kind:
                out.append((c, CLI_QUERIES[i % len(CLI_QUERIES)]))
                break
    return out
