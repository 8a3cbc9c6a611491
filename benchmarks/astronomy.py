"""The astronomy benchmark (paper section VIII-A, Figure 5) on the real LSST
exposures: every strategy of the paper's Table II against a no-lineage run,
and every query of the scientists' workload per strategy.

    .venv/bin/python benchmarks/astronomy.py [--repeats 3] [--query-repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, sandwiched_runtimes, strategy_figure, update_section  # noqa: E402

import subzero  # noqa: E402
from subzero.query.workload import load_workload, select_cells  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WF = str(ROOT / "workflows" / "astronomy.py")
WORKLOAD = str(ROOT / "workflows" / "astronomy_workload.json")
UDFS = ("cr_1", "cr_2", "rmcr", "stars")


def strategies(wf) -> dict[str, dict[str, str]]:
    """The paper's Table II, spelled as per-operator strategies."""
    every = {name: "blackbox" for name in wf.steps}
    return {
        "BlackBox": every,                                          # re-run everything
        "BlackBoxOpt": {u: "blackbox" for u in UDFS},                # mapping for built-ins
        "FullOne": {u: "full:fullone:backward" for u in UDFS},
        "FullMany": {u: "full:fullmany:backward" for u in UDFS},
        "SubZero": {u: "comp:payone:backward" for u in UDFS},        # composite PayOne
    }


PAPER = {"runtime": {"SubZero": "1.49x", "FullOne": "6x", "FullMany": "44x"},
         "disk": {"SubZero": "1.95x", "FullOne": "66x", "FullMany": "53x"}}


def time_query(run, q, cells, repeats):
    times, res = [], None
    for _ in range(repeats):
        run.executor().clear_cache()
        t0 = time.perf_counter()
        res = run.trace(q.start, cells, to=q.to, path=q.path, shortcut=q.shortcut, record=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), res


def main() -> None:
    ap = argparse.ArgumentParser(description="SubZero astronomy benchmark")
    ap.add_argument("--repeats", type=int, default=3, help="alternating workflow runs")
    ap.add_argument("--query-repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sz-astro-"))
    st = subzero.open_store(work / "store")
    wf = subzero.load_workflow(WF)
    strats = strategies(wf)
    queries = load_workload(WORKLOAD)
    total = a.repeats * (1 + len(strats)) + len(strats) * len(queries)
    bar = tqdm(total=total, desc="astronomy benchmark", unit="step", file=sys.stderr)
    try:
        st.run(WF, capture=False, progress=False)   # warm-up (imports, caches): not measured
        runtime, base_times, kept = sandwiched_runtimes(
            lambda: st.run(WF, capture=False, progress=False),
            lambda spec: st.run(WF, strategies=spec, progress=False), strats, a.repeats, bar)
        raw_bytes = sum(v["nbytes"] for k, v in st.catalog.arrays(kept["SubZero"].id).items()
                        if k.startswith("raw_"))
        rows, answers = {}, {}
        for name, run in kept.items():
            for q in queries:
                cells = select_cells(run, q)
                reps = 1 if name == "BlackBox" else a.query_repeats
                sec, res = time_query(run, q, cells, reps)
                ref = answers.setdefault(q.name, res.bitmap)
                if not np.array_equal(ref, res.bitmap):
                    raise SystemExit(f"MISMATCH: strategy {name} answers {q.name} differently")
                rows[(name, q.name)] = (sec, len(res), [s.method for s in res.steps], len(cells))
                bar.update(1)
        summary = {name: {"runtime": statistics.median(runtime[name]),
                          "disk": kept[name].lineage_bytes() / raw_bytes,
                          "bytes": kept[name].lineage_bytes()} for name in strats}
    finally:
        bar.close()
        st.close()
    shutil.rmtree(work, ignore_errors=True)
    for name, s in summary.items():
        print(f"{name:<12} runtime {s['runtime']:.2f}x  lineage {s['bytes'] / 1e6:.3f} MB "
              f"({s['disk']:.3f}x the raw exposures)")
    for q in queries:
        bb = rows[("BlackBox", q.name)][0]
        print(f"{q.name:<8} " + "  ".join(f"{n} {rows[(n, q.name)][0] * 1000:8.1f} ms"
                                           for n in strats) + f"  (BlackBox/SubZero "
              f"{bb / rows[('SubZero', q.name)][0]:.0f}x)")
    if not a.no_write:
        write_results(a, summary, rows, queries, strats, raw_bytes, statistics.median(base_times))


def write_results(a, summary, rows, queries, strats, raw_bytes, base) -> None:
    names = list(strats)
    strategy_figure(Path(__file__).resolve().parent / "astronomy.png", names, summary, rows, queries,
                    "lineage bytes / raw exposure bytes")

    bq = [q.name for q in queries if q.name.startswith("BQ")]
    speed = [rows[("BlackBox", n)][0] / rows[("SubZero", n)][0] for n in bq]
    worst_bq = max(rows[("SubZero", n)][0] for n in bq)
    fq = rows[("SubZero", "FQ0Slow")][0] / rows[("SubZero", "FQ0")][0]
    full_one_speed = statistics.mean(rows[("BlackBox", n)][0] / rows[("FullOne", n)][0] for n in bq)
    full_many_speed = statistics.mean(rows[("BlackBox", n)][0] / rows[("FullMany", n)][0] for n in bq)
    sz_mean = statistics.mean(speed)
    lines = ["## Astronomy (issue 4, paper section VIII-A / Figure 5)", "",
             f"Command: `{command_line()}` — machine: {machine()}.", "",
             "The LSST workflow (22 built-ins, 4 UDFs) on the two real 2001x513 exposures. Runtime "
             f"ratios: median over {a.repeats} repeats, each strategy run divided by the mean of the "
             f"no-lineage runs just before and after it (median {base:.2f} s; arrays are stored by "
             f"every run). Disk: lineage bytes "
             f"(LMDB pages + R-tree files) over the two raw exposures ({raw_bytes / 1e6:.1f} MB). "
             f"Queries: median of {a.query_repeats} (BlackBox: 1) with an empty decoded-block "
             "cache each time; every strategy returned the same cells for every query (checked).",
             "", "![astronomy](astronomy.png)", "",
             "| strategy | runtime / no lineage | paper | lineage bytes | / raw exposures | paper |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for n in names:
        s = summary[n]
        lines.append(f"| {n} | {s['runtime']:.2f}x | {PAPER['runtime'].get(n, '')} | "
                     f"{s['bytes'] / 1e6:.3f} MB | {s['disk']:.4f}x | {PAPER['disk'].get(n, '')} |")
    lines += ["", "| query | cells in | cells out | " + " | ".join(f"{n} ms" for n in names)
              + " | BlackBox / SubZero |", "| --- | ---: | ---: | " + " | ".join("---:" for _ in names)
              + " | ---: |"]
    for q in queries:
        r = rows[("SubZero", q.name)]
        lines.append(f"| {q.name} | {r[3]} | {r[1]} | "
                     + " | ".join(f"{rows[(n, q.name)][0] * 1000:.1f}" for n in names)
                     + f" | {rows[('BlackBox', q.name)][0] / r[0]:.0f}x |")
    sz = summary["SubZero"]
    lines += ["", "| target | measured | paper |", "| --- | --- | --- |",
              f"| SubZero runtime <= 1.2x no-lineage | {sz['runtime']:.2f}x | 1.49x |",
              f"| SubZero lineage <= 0.5x input bytes | {sz['disk']:.4f}x | 1.95x |",
              f"| BQ0-BQ3 median >= 300x faster than BlackBox | median {statistics.median(speed):.0f}x, "
              f"mean {sz_mean:.0f}x | 255x (mean) |",
              f"| BQ0-BQ3 each < 150 ms | worst {worst_bq * 1000:.1f} ms | |",
              f"| FQ0 short-cut >= 80x faster than FQ0Slow | {fq:.0f}x | 83x |",
              f"| FullOne / FullMany backward speed-up over BlackBox (mean) | {full_one_speed:.0f}x / "
              f"{full_many_speed:.0f}x | 45x / 34x |", ""]
    if fq < 80:
        lines.append(f"FQ0 misses the 80x target ({fq:.0f}x). From a profile: FQ0 itself costs "
                     f"{rows[('SubZero', 'FQ0')][0] * 1000:.1f} ms (bitmap unions and counts over "
                     "eight 1M-cell steps), and FQ0Slow is fast because the mapping functions are "
                     "vectorized: enumerating the whole 1M-cell array through the all-to-all input's "
                     f"mapping takes about {rows[('SubZero', 'FQ0Slow')][0] * 1000:.0f} ms, where the "
                     "paper's implementation took seconds. The short-cut removes that enumeration; what "
                     "is left is per-step work on whole-array bitmaps after the all-to-all step (small "
                     "sets already travel as cell lists); marking a set as 'the entire array' instead "
                     "of materialising it would cut that further.")
    update_section("astronomy", "\n".join(lines))


if __name__ == "__main__":
    main()
