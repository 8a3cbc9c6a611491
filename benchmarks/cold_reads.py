"""Cold and warm stored reads (issue 33): what a query pays the first time a process
meets a strategy's blocks, against what it pays once they are decoded.

A trace in a fresh process, or the first query of a workload that reads an index,
decodes every key and record block it touches; a later query that meets the same
blocks finds them decoded.  Under a storage plan, a backward query often reads an
index no earlier query of the workload touched, so its cold read is what the user
waits for.  This measures both, per genomics workload query, on one run stored with
the workflow's defaults:

- cold: the executor's block caches emptied before each trace;
- warm: the same trace again at once.

``--code PATH`` measures another checkout (``PYTHONPATH=PATH``, e.g. ``git worktree add
/tmp/before <commit>``) in the same rounds, on the same store, alternating, so the
code before a change and after it meet the same machine state.  Each side runs in a
child process of its own; medians of ``--repeats`` rounds.

    .venv/bin/python benchmarks/cold_reads.py --replicate 1000 [--code /tmp/before]
        [--repeats 9] [--no-write]

Results: the ``cold-reads`` section of RESULTS.md (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _common import command_line, machine, update_section  # noqa: E402

WORKLOAD = ROOT / "workflows" / "genomics_workload.json"

#: the child: one round of every query, cold then warm, on ``store``'s latest run
CHILD = r"""
import json, sys
import subzero
from subzero.query.workload import parse_workload, select_cells
store = subzero.open_store(sys.argv[1], create=False)
run = store.get("latest")
ex = run.executor()
queries = parse_workload(json.loads(open(sys.argv[2]).read()), sys.argv[2])
out = {}
for q in queries:
    cells = select_cells(run, q)
    ex.clear_cache()
    cold = run.trace(q.start, cells, to=q.to, record=False)
    warm = run.trace(q.start, cells, to=q.to, record=False)
    out[q.name] = [sum(s.seconds for s in cold.steps), sum(s.seconds for s in warm.steps),
                   len(cold)]
print(json.dumps(out))
"""


def _round(store: Path, code: Path | None) -> dict:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    p = subprocess.run([sys.executable, "-c", CHILD, str(store), str(WORKLOAD)], env=env,
                       capture_output=True, text=True, cwd=tempfile.gettempdir())
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(p.stdout)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicate", type=int, default=1000)
    ap.add_argument("--code", help="another checkout to measure in the same rounds")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="sz-cold-reads-"))
    sides = {"this code": None}
    if a.code:
        sides["other code"] = Path(a.code)
    try:
        store = folder / "store"
        subprocess.run([str(Path(sys.executable).parent / "subzero"), "run",
                        str(ROOT / "workflows" / "genomics.py"), "--param",
                        f"replicate={a.replicate}", "--store", str(store), "-q"],
                       check=True, cwd=ROOT, capture_output=True)
        got: dict[str, dict[str, list]] = {s: {} for s in sides}
        for _ in range(a.repeats):                # alternating: the same machine state
            for side, code in sides.items():
                for q, (cold, warm, n) in _round(store, code).items():
                    got[side].setdefault(q, []).append((cold, warm, n))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    head = ["| query | answer cells | " + " | ".join(f"{s} cold ms | {s} warm ms" for s in sides)
            + (" | cold, this / other | warm, this / other |" if a.code else " |"),
            "| --- | ---: | " + " | ".join("---: | ---:" for _ in sides)
            + (" | ---: | ---: |" if a.code else " |")]
    rows = []
    for q in got["this code"]:
        med = {s: (_median([c for c, _, _ in got[s][q]]) * 1e3,
                   _median([w for _, w, _ in got[s][q]]) * 1e3) for s in sides}
        cells = got["this code"][q][0][2]
        row = f"| {q} | {cells:,} | " + " | ".join(f"{c:.1f} | {w:.1f}" for c, w in med.values())
        if a.code:
            (c1, w1), (c2, w2) = med["this code"], med["other code"]
            row += f" | {c1 / c2:.2f}x | {w1 / w2:.2f}x"
        rows.append(row + " |")
    table = head + rows
    print("\n".join(table))
    if not a.no_write:
        update_section("cold-reads", "\n".join(
            ["## Cold and warm stored reads (issue 33)", "",
             f"Command: `{command_line()}` — machine: {machine()}.", "",
             f"Genomics at {a.replicate:,}x, one run with the defaults; each workload query "
             f"traced with the block caches emptied (cold), then again at once (warm), in a "
             f"child process per side, {a.repeats} alternated rounds, median of the steps' "
             f"seconds.", ""] + table))


if __name__ == "__main__":
    main()
