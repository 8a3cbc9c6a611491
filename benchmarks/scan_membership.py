"""Forward traces on genomics' defaults, whose steps scan the stored backward index and
test every decoded cell against the query (``CellSet.contains``): through a bitmap of
the query's span (now) against a binary search per decoded cell (before stop 62), in one
process, the two alternated on the same run, answers checked equal, median of
``--rounds`` each per query.

    .venv/bin/python benchmarks/scan_membership.py [--genomics 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from _common import command_line, machine, median  # noqa: E402

import subzero  # noqa: E402
from subzero.model.cellset import CellSet  # noqa: E402

WORKFLOW = str(ROOT / "workflows" / "genomics.py")
WORKLOAD = ROOT / "workflows" / "genomics_workload.json"


def searched(self: CellSet, ids: np.ndarray) -> np.ndarray:
    """A sparse set's membership as it was tested before: a binary search of its sorted
    ids for every id (the baseline; the rest of ``CellSet.contains`` as now)."""
    s = self._ids
    assert s is not None
    pos = np.minimum(np.searchsorted(s, ids), s.size - 1)
    return s[pos] == ids


def _cells(q: dict) -> list[tuple[int, ...]]:
    c = q["cells"]
    if "cells" in c:
        return [tuple(x) for x in c["cells"]]
    (r0, c0), (r1, c1) = c["box"]
    return [(r, k) for r in range(r0, r1) for k in range(c0, c1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--genomics", type=int, default=1000, help="replicate (patients / 96)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--queries", default="FQ0,FQ1,BQ0,BQ1")
    a = ap.parse_args()
    print(f"Command: `{command_line()}` — machine: {machine()}\n")
    queries = {q["name"]: q for q in json.loads(WORKLOAD.read_text())["queries"]}
    names = a.queries.split(",")
    work = Path(tempfile.mkdtemp(prefix="subzero-scan-membership-"))
    bitmap = CellSet._sparse_contains
    try:
        with subzero.open_store(work / "store") as st:
            run = st.run(WORKFLOW, params={"replicate": a.genomics}, progress=False)

            def trace(name: str) -> tuple[float, np.ndarray]:
                q = queries[name]
                t = time.perf_counter()
                got = run.trace(q["from"], cells=_cells(q), to=q["to"])
                return time.perf_counter() - t, np.asarray(got.cells)

            answers = {name: trace(name)[1] for name in names}       # a warm-up each
            times: dict[str, dict[str, list[float]]] = {"searched": {}, "bitmap": {}}
            for r in range(a.rounds):
                for way in ("searched", "bitmap") if r % 2 == 0 else ("bitmap", "searched"):
                    CellSet._sparse_contains = bitmap if way == "bitmap" else searched   # type: ignore[method-assign]
                    for name in names:
                        dt, got = trace(name)
                        if not np.array_equal(got, answers[name]):
                            raise SystemExit(f"{name}: the answers differ ({way})")
                        times[way].setdefault(name, []).append(dt)
            CellSet._sparse_contains = bitmap      # type: ignore[method-assign]
    finally:
        CellSet._sparse_contains = bitmap          # type: ignore[method-assign]
        shutil.rmtree(work, ignore_errors=True)
    print(f"genomics {a.genomics:,}x, the defaults, {a.rounds} rounds, medians:\n")
    print("| query | answer cells | binary search ms | bitmap of the span ms | bitmap / search |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in names:
        s, b = median(times["searched"][name]), median(times["bitmap"][name])
        print(f"| {name} | {len(answers[name]):,} | {s * 1e3:.1f} | {b * 1e3:.1f} | {b / s:.2f}x |")


if __name__ == "__main__":
    main()
