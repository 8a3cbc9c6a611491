"""Impact across a night (issue 29): one input region traced through every run that
read it, per run, one process after another and in a pool of forks; and with
unrelated runs added to the store.

The store: ``--runs`` runs of the LSST workflow (``workflows/astronomy.py``) on the
real amplifier (1 Mpix; ``--crop ROWSxCOLS`` for a smaller image), sharing their
bias, dark and flat, each on its own exposures (the real ones, rolled by a few
rows per run); ``--unrelated N`` adds N runs of the example workflow that read
none of them.  Stores are kept in ``benchmarks/.work/impact-*`` and grown, not
rebuilt, on the next call.  The query: a bad column of the flat (``--cells``,
default the whole column 37) to every run's outputs.  Each measurement is one
query in a fresh process (what ``subzero impact`` costs), wall and CPU time
(children included), median of ``--repeats``.

    .venv/bin/python benchmarks/impact.py [--runs 50] [--crop 256x128] [--unrelated 500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"

QUERY = r"""
import json, resource, sys, time, subzero
from subzero import parallel
from subzero.workflows import astronomy as A
path, cells, crop, mode = sys.argv[1:5]
crop = None if crop == "full" else tuple(int(x) for x in crop.split("x"))
if mode == "one":
    parallel.IMPACT_RUNS_PER_WORKER = 10 ** 9
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
flat = A.source("flat", crop)
with subzero.open_store(path, create=False) as st:
    c0, t0 = cpu(), time.perf_counter()
    imp = st.impact(flat, cells, engine="local", progress=False)
    print(json.dumps({"runs": len(imp.runs), "wall": time.perf_counter() - t0, "cpu": cpu() - c0,
                      "cells": sum(r.count for r in imp.runs)}))
"""


def build(path: Path, runs: int, crop: tuple[int, int] | None) -> None:
    import numpy as np

    import subzero
    from subzero.workflows import astronomy as A
    shared = {k: A.source(k, crop) for k in ("bias", "dark", "flat")}
    raws = {k: A.source(k, crop) for k in ("raw_1", "raw_2")}
    wf = A.workflow()
    with subzero.open_store(path) as st:
        for k in range(len([r for r in st.runs() if r.workflow == "astronomy"]), runs):
            inputs = dict(shared)
            for j, (name, r) in enumerate(raws.items()):
                inputs[name] = np.roll(r, 7 * k + 3 * j, axis=0).copy()
            st.run(wf, inputs=inputs, engine="local", progress=False)


def add_unrelated(path: Path, n: int) -> None:
    import numpy as np

    import subzero
    from subzero.workflows.example import synthetic_sky
    example = str(HERE.parent / "workflows" / "example.py")
    with subzero.open_store(path) as st:
        have = len([r for r in st.runs() if r.workflow == "example"])
        for k in range(have, n):
            rng = np.random.default_rng(1000 + k)
            st.run(example, inputs={"raw": synthetic_sky() + rng.normal(0, 1, (64, 96)),
                                    "flat": 1 + rng.normal(0, 0.01, (64, 96))},
                   tile=32, engine="local", progress=False)


def measure(path: Path, cells: str, crop: str, mode: str, repeats: int) -> dict:
    got = []
    for _ in range(repeats):
        p = subprocess.run([sys.executable, "-c", QUERY, str(path), cells, crop, mode],
                           capture_output=True, text=True, check=True)
        got.append(json.loads(p.stdout.strip().splitlines()[-1]))
    n = got[0]["runs"]
    return {"runs": n, "wall_ms_per_run": 1000 * statistics.median(g["wall"] for g in got) / n,
            "cpu_ms_per_run": 1000 * statistics.median(g["cpu"] for g in got) / n,
            "wall_s": statistics.median(g["wall"] for g in got)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--crop", default="full", help="ROWSxCOLS of the amplifier, or full (1 Mpix)")
    ap.add_argument("--cells", default=None, help="the flat's cells (default: column 37, every row)")
    ap.add_argument("--unrelated", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    crop = None if a.crop == "full" else tuple(int(x) for x in a.crop.split("x"))
    rows = crop[0] if crop else 2001
    cells = a.cells or f"0:{rows},37"
    store = WORK / f"impact-{a.crop}"
    build(store, a.runs, crop)
    out = {m: measure(store, cells, a.crop, m, a.repeats) for m in ("one", "pool")}
    if a.unrelated:
        more = WORK / f"impact-{a.crop}-unrelated"
        if not more.exists():
            subprocess.run(["cp", "-r", str(store), str(more)], check=True)
        add_unrelated(more, a.unrelated)
        out["unrelated"] = measure(more, cells, a.crop, "one", a.repeats)
        out["unrelated_ratio"] = out["unrelated"]["wall_s"] / out["one"]["wall_s"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
