"""The optimizer at scale (issue 16): genomics at 100x, 1,000x and 10,000x patients,
astronomy at 1 and 16 megapixels, with the shipped workloads and a disk budget.

Calibrate once at the start (its time reported apart), then per size, in a fresh
child process with a fresh store (so a size's peak memory is its own and a size
that does not fit fails alone):

1. a plain run (``capture=False``);
2. ``--max-disk`` end to end: ``optimize()`` (profiling this workflow and size
   first) and the plan's run, each timed; then a second plain run (the baseline
   is the faster of the two plain runs) and a re-optimization with the profile
   kept (the optimize time without profiling);
3. a run with the default strategies (no strategies given: each operator's
   declared defaults) and a BlackBox run (every operator ``blackbox``);
4. every workload query on the three runs with the query-time planner
   (``optimizer.planner_for``), empty caches before each timing; slow queries
   once, fast ones repeated (``optimizer.py``'s ``time_query``).  The three
   answers of every query must be the same cells: the sweep stops on a
   mismatch -- a plan that answers wrongly is refused, never timed.

Printed and written (unless ``--no-write``): predicted vs measured workload cost
and per-query cost, each query under BlackBox / defaults / plan, the optimize
time, and the issue's targets, each met or missed.

    .venv/bin/python benchmarks/optimizer_scale.py                       # every size
    .venv/bin/python benchmarks/optimizer_scale.py --quick               # genomics 100,1000; astronomy 1
    .venv/bin/python benchmarks/optimizer_scale.py --genomics 10000 --add   # one size, kept with the others

This sweep runs in one warm process per size.  The path a user takes -- ``subzero
run --max-disk`` in a fresh store, then ``subzero trace --workload`` in fresh
processes -- is measured by ``optimizer_cli.py`` (issue 33): there the
calibration happens inside the budgeted run, every trace pays its own first
imports and reader openings, and the query-time planner's switches into
re-execution pay them too.

Results: ``benchmarks/.work/optimizer_scale.json`` (``--work``), the plot
``benchmarks/optimizer_scale.png`` and (without ``--no-write``) the
``optimizer-scale`` section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"          # results (optimizer_scale.json) and the calibration kept for --add
PLAN = "sweep"
KINDS = ("blackbox", "defaults", "plan")
FULL = {"genomics": [100, 1000, 10000], "astronomy": [1, 16]}
QUICK = {"genomics": [100, 1000], "astronomy": [1]}

# targets of issue 16 (benchmarks, not timed tests)
WORKLOAD_ERROR = 0.25        # predicted vs measured workload cost
QUERY_ERROR = 0.50           # predicted vs measured, per query
PLAN_VS_DEFAULTS = 1.2       # each query under the plan / under the defaults
PLANNER_WORST = 1.2          # worst query under the plan / BlackBox and / defaults
END_TO_END = 1.3             # optimize + the plan's run / a plain run
FQ0_BIG_S = 0.010            # genomics 10,000x: FQ0 under the plan
BIG_GENOMICS = 10000


def _shared():
    """``benchmarks/optimizer.py`` (the workflows, ``time_query``), loaded by path: its
    name is the optimizer package's, so a plain import would find one or the other."""
    spec = importlib.util.spec_from_file_location("optimizer_bench", HERE / "optimizer.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _shared()
sys.path.insert(0, str(HERE))
import _common as common  # noqa: E402
from _common import command_line, machine, run_child, update_section  # noqa: E402

optimizer = bench.optimizer      # the package (subzero.optimizer), as optimizer.py imports it


class Mismatch(common.Mismatch):
    """Two strategies answered a query with different cells."""


def params_of(flow: str, size: float) -> dict:
    return {"replicate": int(size)} if flow == "genomics" else {"megapixels": float(size)}


def label(flow: str, size: float) -> str:
    return f"{flow} {int(size):,}x" if flow == "genomics" else f"{flow} {size:g} Mpix"


def key(flow: str, size: float) -> str:
    return f"{flow}:{size:g}"


def same_answers(where: str, query: str, answers: dict) -> None:
    """Raise :class:`Mismatch` unless every strategy's answer (a CellSet) is the same."""
    names = list(answers)
    ref = answers[names[0]]
    for n in names[1:]:
        if answers[n] != ref:
            raise Mismatch(f"MISMATCH: {where}, {query}: {n} answers {len(answers[n])} cells, "
                           f"{names[0]} {len(ref)} -- refusing the plan")


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9    # Linux: KiB


# -- one size (a child process, or in-process from the smoke test) ---------------------------------
def measure(flow: str, size: float, folder: Path, calibration: dict, max_disk="100MB",
            repeats: int = 3, query_seconds: float = bench.QUERY_SECONDS) -> dict:
    """Every number of one size, in a fresh store under ``folder``; raises
    :class:`Mismatch` when the plan, the defaults and BlackBox disagree on an answer."""
    import subzero
    from subzero.query.workload import load_workload, select_cells

    f = bench.FLOWS[flow]
    wf, workload, params = f["wf"], f["workload"], params_of(flow, size)
    where = label(flow, size)
    st = subzero.open_store(folder / "store")
    try:
        st.catalog.add_calibration(os.uname().nodename, calibration["seconds"], calibration)
        out: dict = {"flow": flow, "size": size, "params": params, "max_disk": max_disk}
        _, plain_a = _timed(lambda: st.run(wf, params=params, capture=False, progress=False))
        plan, out["optimize_s"] = _timed(lambda: optimizer.optimize(
            st, wf, params, max_disk=max_disk, workload=workload, name=PLAN, progress=False))
        prun, out["plan_run_s"] = _timed(lambda: st.run(wf, params=params, plan=PLAN, progress=False))
        _, plain_b = _timed(lambda: st.run(wf, params=params, capture=False, progress=False))
        out["plain_s"] = [plain_a, plain_b]
        again, out["reoptimize_s"] = _timed(lambda: optimizer.optimize(
            st, wf, params, max_disk=max_disk, workload=workload, save=False, progress=False))
        drun, out["defaults_run_s"] = _timed(lambda: st.run(wf, params=params, progress=False))
        steps = subzero.load_workflow(wf, params).steps
        brun, out["blackbox_run_s"] = _timed(lambda: st.run(
            wf, params=params, strategies={s: "blackbox" for s in steps}, progress=False))
        out["plan"] = {"strategies": plan.strategies, "disk": plan.disk,
                       "runtime_factor": plan.runtime_factor, "query_s": plan.query_s,
                       "queries": dict(plan.queries), "blackbox_query_s": plan.blackbox_query_s,
                       "solve_s": plan.solve_s, "resolve_s": again.solve_s, "notes": plan.notes,
                       "same_on_reoptimize": again.strategies == plan.strategies}
        out["disk"] = {"plan": prun.lineage_bytes(), "defaults": drun.lineage_bytes()}
        out["downgrades"] = st.catalog.downgrades(prun.id)
        out["shapes"] = {k: list(v) for k, v in prun.shapes().items()}
        runs = {"blackbox": brun, "defaults": drun, "plan": prun}
        planners = {k: optimizer.planner_for(r) for k, r in runs.items()}
        out["queries"] = {}
        for q in load_workload(workload):
            cells = select_cells(prun, q)
            row: dict = {"weight": q.weight, "cells_in": len(cells)}
            answers = {}
            for kind, run in runs.items():
                t, res = bench.time_query(run, q, cells, planners[kind], repeats,
                                          seconds=query_seconds)
                answers[kind] = res.cellset
                row[kind] = {"s": t, "methods": [s.method for s in res.steps]}
            same_answers(where, q.name, answers)
            row["cells_out"] = len(answers["plan"])
            out["queries"][q.name] = row
        out["peak_gb"] = _peak_gb()
        return out
    finally:
        st.close()


def child_main(a) -> None:
    flow, _, size = a.child.partition(":")
    folder = Path(a.folder)
    common.child_main(lambda: measure(flow, float(size), folder,
                                      json.loads((folder / "calibration.json").read_text()),
                                      a.max_disk, a.repeats, a.query_seconds),
                      folder / "result.json", float)


def run_size(flow: str, size: float, folder: Path, a) -> dict:
    """One size in a child process; a child that dies is reported, a mismatch is fatal."""
    cmd = [sys.executable, __file__, "--child", key(flow, size), "--folder", str(folder),
           "--max-disk", str(a.max_disk), "--repeats", str(a.repeats),
           "--query-seconds", str(a.query_seconds)]
    res, wall = run_child(cmd, folder / "result.json", label(flow, size))
    res["took_s"] = wall
    return res


# -- numbers and targets ---------------------------------------------------------------------------
def summarise(r: dict) -> dict:
    """Derived numbers of one size: costs, errors, ratios, end to end."""
    qs = r["queries"]
    w = {n: q["weight"] for n, q in qs.items()}
    cost = {k: sum(w[n] * qs[n][k]["s"] for n in qs) for k in KINDS}
    pred = r["plan"]["queries"]
    q_err = {n: abs(pred[n] - qs[n]["plan"]["s"]) / qs[n]["plan"]["s"] for n in qs if n in pred}
    plain = min(r["plain_s"])
    return {
        "cost": cost, "predicted_cost": r["plan"]["query_s"],
        "workload_error": abs(r["plan"]["query_s"] - cost["plan"]) / cost["plan"],
        "query_error": q_err, "worst_query_error": max(q_err.values(), default=0.0),
        "vs_defaults": {n: qs[n]["plan"]["s"] / qs[n]["defaults"]["s"] for n in qs},
        "vs_blackbox": {n: qs[n]["plan"]["s"] / qs[n]["blackbox"]["s"] for n in qs},
        "plain_s": plain, "end_to_end_s": r["optimize_s"] + r["plan_run_s"],
        "end_to_end": (r["optimize_s"] + r["plan_run_s"]) / plain,
        "plan_run_ratio": r["plan_run_s"] / plain,
    }


def targets(r: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for one size."""
    s = summarise(r)
    vd, vb = s["vs_defaults"], s["vs_blackbox"]
    worst_d, worst_b = max(vd, key=vd.__getitem__), max(vb, key=vb.__getitem__)
    out = [
        (f"predicted vs measured workload cost within {WORKLOAD_ERROR:.0%}",
         f"{s['predicted_cost'] * 1e3:.1f} vs {s['cost']['plan'] * 1e3:.1f} ms ({s['workload_error']:.0%})",
         s["workload_error"] <= WORKLOAD_ERROR),
        (f"per query within {QUERY_ERROR:.0%}",
         "worst " + (max(((f"{n} {e:.0%}", e) for n, e in s["query_error"].items()),
                         key=lambda t: t[1])[0] if s["query_error"] else "—"),
         s["worst_query_error"] <= QUERY_ERROR),
        (f"every query under the plan <= {PLAN_VS_DEFAULTS}x the defaults (planner worst case "
         f"vs defaults)", f"worst {worst_d} {vd[worst_d]:.2f}x", vd[worst_d] <= PLAN_VS_DEFAULTS),
        ("workload total under the plan lower than under the defaults",
         f"{s['cost']['plan'] * 1e3:.1f} vs {s['cost']['defaults'] * 1e3:.1f} ms",
         s["cost"]["plan"] < s["cost"]["defaults"]),
        (f"planner worst case vs BlackBox <= {PLANNER_WORST}x", f"worst {worst_b} {vb[worst_b]:.2f}x",
         vb[worst_b] <= PLANNER_WORST),
        (f"--max-disk end to end (optimize + plan run) <= {END_TO_END}x a plain run",
         f"{s['end_to_end_s']:.1f} s / {s['plain_s']:.1f} s = {s['end_to_end']:.2f}x",
         s["end_to_end"] <= END_TO_END),
    ]
    if r["flow"] == "genomics" and r["size"] >= BIG_GENOMICS:
        fq0 = r["queries"]["FQ0"]["plan"]["s"]
        out += [(f"FQ0 under {FQ0_BIG_S * 1e3:.0f} ms", f"{fq0 * 1e3:.2f} ms", fq0 < FQ0_BIG_S),
                ("no query slower under the plan than under the defaults",
                 f"worst {worst_d} {vd[worst_d]:.2f}x", vd[worst_d] <= 1.0)]
    return out


# -- report ----------------------------------------------------------------------------------------
def _ms(s: float) -> str:
    return f"{s * 1e3:.0f}" if s >= 1 else f"{s * 1e3:.1f}" if s >= 0.01 else f"{s * 1e3:.2f}"


def _mb(b: float) -> str:
    return f"{b / 1e6:.1f}"


def _methods(ms: list[str]) -> str:
    return ", ".join(m for m in ms if m != "map") or "map"


def tables(results: dict) -> list[str]:
    ok = {k: r for k, r in results.items() if "error" not in r}
    lines = ["| size | plain run s | optimize s (with profiling / again) | plan run s (x plain: measured "
             "/ predicted) | end to end "
             "| lineage MB (plan pred. / meas.; defaults) | workload ms: predicted / plan / defaults "
             "/ BlackBox | peak GB | size took |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k, r in results.items():
        if "error" in r:
            lines.append(f"| {k} | failed: {r['error'][:80]} | | | | | | | {r.get('took_s', 0):.0f} s |")
            continue
        s, p = summarise(r), r["plan"]
        lines.append(
            f"| {label(r['flow'], r['size'])} | {s['plain_s']:.1f} | {r['optimize_s']:.1f} / "
            f"{r['reoptimize_s']:.2f} | {r['plan_run_s']:.1f} ({s['plan_run_ratio']:.2f}x / "
            f"{p['runtime_factor']:.2f}x) | {s['end_to_end']:.2f}x | "
            f"{_mb(p['disk'])} / {_mb(r['disk']['plan'])}; {_mb(r['disk']['defaults'])} | "
            f"{_ms(s['predicted_cost'])} / {_ms(s['cost']['plan'])} / {_ms(s['cost']['defaults'])} / "
            f"{_ms(s['cost']['blackbox'])} | {r['peak_gb']:.1f} | {r['took_s']:.0f} s |")
    lines += ["", "Each query (ms; cold caches, query-time planner; methods = what the planner did "
              "per step under the plan, mapping-function steps left out):", "",
              "| size | query | cells in -> out | BlackBox | defaults | plan | predicted | error "
              "| plan / defaults | plan / BlackBox | plan's methods |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in ok.values():
        s = summarise(r)
        for n, q in r["queries"].items():
            pred = r["plan"]["queries"].get(n)
            lines.append(
                f"| {label(r['flow'], r['size'])} | {n} | {q['cells_in']:,} -> {q['cells_out']:,} | "
                f"{_ms(q['blackbox']['s'])} | {_ms(q['defaults']['s'])} | {_ms(q['plan']['s'])} | "
                f"{'—' if pred is None else _ms(pred)} | "
                f"{'—' if n not in s['query_error'] else format(s['query_error'][n], '.0%')} | "
                f"{s['vs_defaults'][n]:.2f}x | {s['vs_blackbox'][n]:.2f}x | "
                f"{_methods(q['plan']['methods'])} |")
    lines += ["", "Plans (UDF and operator strategies):", ""]
    for r in ok.values():
        strat = "; ".join(f"{op}: {s}" for op, s in r["plan"]["strategies"].items()
                          if s not in ("map", "blackbox"))
        downs = len(r["downgrades"])
        lines.append(f"- {label(r['flow'], r['size'])}: {strat or 'nothing stored'}"
                     + (f" ({downs} downgrades while running)" if downs else ""))
    return lines


def target_table(results: dict) -> tuple[list[str], int, int]:
    lines = ["| size | target | measured | |", "| --- | --- | --- | --- |"]
    met = total = 0
    for r in results.values():
        if "error" in r:
            continue
        for what, got, ok in targets(r):
            lines.append(f"| {label(r['flow'], r['size'])} | {what} | {got} | "
                         f"{'met' if ok else '**missed**'} |")
            met, total = met + ok, total + 1
    return lines, met, total


def plot(results: dict, path: Path) -> None:
    """Per workflow: each query under the plan as a multiple of the defaults and of
    BlackBox; predicted vs measured per query; the workload cost and optimize time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    flows = [f for f in FULL if any(r.get("flow") == f and "error" not in r for r in results.values())]
    if not flows:
        return
    fig, axes = plt.subplots(len(flows), 3, figsize=(18, 4.8 * len(flows)), squeeze=False)
    for row, flow in zip(axes, flows):
        rs = sorted((r for r in results.values() if r.get("flow") == flow and "error" not in r),
                    key=lambda r: r["size"])
        x = [r["size"] for r in rs]
        ss = [summarise(r) for r in rs]
        names = list(rs[0]["queries"])
        ax = row[0]
        for k, n in enumerate(names):
            ax.plot(x, [s["vs_defaults"][n] for s in ss], "o-", color=f"C{k}", label=n)
            ax.plot(x, [s["vs_blackbox"][n] for s in ss], "x:", color=f"C{k}", lw=0.8)
        ax.axhline(PLAN_VS_DEFAULTS, color="r", lw=0.8, ls="--")
        ax.set(yscale="log", ylabel="query under the plan / under the baseline",
               title=f"{flow}: each query, plan / defaults (solid) and\nplan / BlackBox (dotted); "
                     f"red: {PLAN_VS_DEFAULTS}x")
        ax.legend(fontsize=7, ncol=2)
        ax = row[1]
        pts = [v for r in rs for n in names if n in r["plan"]["queries"]
               for v in (r["plan"]["queries"][n], r["queries"][n]["plan"]["s"])]
        if pts:
            lo, hi = min(pts) / 2, max(pts) * 2
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.fill_between([lo, hi], [lo / (1 + QUERY_ERROR), hi / (1 + QUERY_ERROR)],
                            [lo / (1 - QUERY_ERROR), hi / (1 - QUERY_ERROR)], color="grey", alpha=0.2)
            for i, r in enumerate(rs):
                for k, n in enumerate(names):
                    if n in r["plan"]["queries"]:
                        ax.scatter(r["plan"]["queries"][n], r["queries"][n]["plan"]["s"], color=f"C{k}",
                                   s=12 + 40 * i, alpha=0.8)
        ax.set(xscale="log", yscale="log", xlabel="predicted s", ylabel="measured s",
               title=f"{flow}: each query under the plan, predicted vs\nmeasured (bigger dot = "
                     f"larger size; band: {QUERY_ERROR:.0%} error)")
        ax = row[2]
        ax.plot(x, [s["predicted_cost"] for s in ss], "o--k", label="plan, predicted")
        for k, style in zip(KINDS, ("x:", "s--", "o-")):
            ax.plot(x, [s["cost"][k] for s in ss], style, label=f"{k}, measured")
        ax.plot(x, [r["optimize_s"] for r in rs], "^-", color="grey", label="optimize (with profiling)")
        ax.set(yscale="log", ylabel="seconds", title=f"{flow}: workload cost (weighted sum)\nand optimize time")
        ax.legend(fontsize=7)
        for ax in (row[0], row[2]):
            ax.set_xscale("log")
            ax.set_xlabel("replicate (patients x96)" if flow == "genomics" else "megapixels")
            ax.set_xticks(x, [f"{v:g}" for v in x])
            ax.minorticks_off()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def section(results: dict, calibration: dict, a) -> str:
    commands = sorted({r.get("command", command_line()) for r in results.values()})
    cal_s = sorted({round(r["calibration_s"], 1) for r in results.values() if "calibration_s" in r})
    tl, met, total = target_table(results)
    return "\n".join(
        ["## Storage-budget optimizer at scale (issue 16)", "",
         "Commands: " + "; ".join(f"`{c}`" for c in commands) + f" — machine: {machine()}.", "",
         f"Calibration once per invocation, before any size: {', '.join(f'{s} s' for s in cal_s)} "
         "(not counted below).  Per size, in a fresh child process and store: a plain run "
         "(`capture=False`); `optimize()` with a disk budget of "
         f"{a.max_disk} for the shipped workload (profiling that size first) and the plan's run "
         "(end to end = both, over the faster of two plain runs); a second `optimize()` with the "
         "profile kept; a run with the default strategies and a BlackBox run; then every workload "
         "query on the three runs with the query-time planner, cold caches (queries over 2 s "
         f"timed once, faster ones repeated for {a.query_seconds} s, median).  Every query "
         "returned the same cells under BlackBox, the defaults and the plan (checked: the sweep "
         "stops on a mismatch).  Predicted = the plan's own prediction (`Plan.queries`, "
         "`Plan.query_s`).", "",
         "![optimizer at scale](optimizer_scale.png)", "",
         f"Targets: {met} of {total} met.", ""] + tl + [""] + tables(results))


# -- the parent ------------------------------------------------------------------------------------
def sizes_of(a) -> dict[str, list[float]]:
    def parse(text: str | None) -> list[float]:
        if text is None or text.strip().lower() in ("", "none"):
            return []
        return [float(t) for t in text.split(",") if t.strip()]
    if a.genomics is None and a.astronomy is None:
        return {f: list(v) for f, v in (QUICK if a.quick else FULL).items()}
    return {"genomics": parse(a.genomics), "astronomy": parse(a.astronomy)}


def get_calibration(a) -> tuple[dict, bool]:
    """The calibration of this run: the one saved by an earlier invocation with ``--add``
    when it still fits the cost model (same version and features), else a new one."""
    from subzero.optimizer.calibration import VERSION
    from subzero.optimizer.costmodel import FEATURES
    saved = Path(a.work) / "optimizer_scale-calibration.json"
    if a.add and not a.recalibrate and saved.is_file():
        cal = json.loads(saved.read_text())
        if (cal.get("version") == VERSION and cal.get("host") == os.uname().nodename
                and cal.get("features") == {f: list(v) for f, v in FEATURES.items()}):
            return cal, True
    print("calibrating (once)...", file=sys.stderr, flush=True)
    cal = optimizer.calibrate(progress=True)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(cal, default=float))
    return json.loads(saved.read_text()), False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="SubZero optimizer scale sweep (issue 16)")
    ap.add_argument("--genomics", help="replicates, comma-separated (default 100,1000,10000; "
                                       "'none' to skip)")
    ap.add_argument("--astronomy", help="megapixels, comma-separated (default 1,16; 'none' to skip)")
    ap.add_argument("--quick", action="store_true", help="genomics 100,1000 and astronomy 1")
    ap.add_argument("--max-disk", default="100MB", help="the plan's disk budget (default 100MB)")
    ap.add_argument("--repeats", type=int, default=3, help="least timings of a fast query")
    ap.add_argument("--query-seconds", type=float, default=bench.QUERY_SECONDS,
                    help="time spent repeating one fast query")
    ap.add_argument("--add", action="store_true",
                    help="keep the other sizes of the last results (and their calibration)")
    ap.add_argument("--recalibrate", action="store_true", help="with --add: calibrate anew")
    ap.add_argument("--no-write", action="store_true", help="leave RESULTS.md and the plot alone")
    ap.add_argument("--work", default=str(WORK), help="folder of the results JSON (default "
                                                     "benchmarks/.work)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child_main(a)
    todo = [(f, s) for f, ss in sizes_of(a).items() for s in ss]
    if not todo:
        raise SystemExit("no sizes to measure")
    results: dict = {}
    results_json = Path(a.work) / "optimizer_scale.json"
    if a.add and results_json.is_file():       # earlier sizes, each measured whole in its own child
        results = {k: r for k, r in json.loads(results_json.read_text())["sizes"].items()
                   if k not in {key(f, s) for f, s in todo}}
    t0 = time.perf_counter()
    cal, reused = get_calibration(a)
    cal_s = cal["seconds"] if reused else time.perf_counter() - t0
    print(f"calibration: {cal_s:.1f} s" + (" (reused)" if reused else ""), file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="sz-optimizer-scale-"))
    try:
        for flow, size in todo:
            folder = work / key(flow, size).replace(":", "-")
            folder.mkdir()
            (folder / "calibration.json").write_text(json.dumps(cal, default=float))
            r = run_size(flow, size, folder, a)
            r.update(command=command_line(), calibration_s=cal_s, flow=flow, size=size)
            results[key(flow, size)] = r
            print(f"{label(flow, size)}: " + (f"FAILED {r['error']}" if "error" in r else
                                              f"{r['took_s']:.0f} s"), file=sys.stderr, flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    order = {f: i for i, f in enumerate(FULL)}
    results = dict(sorted(results.items(), key=lambda kv: (order.get(kv[1]["flow"], 9), kv[1]["size"])))
    results_json.parent.mkdir(parents=True, exist_ok=True)
    results_json.write_text(json.dumps({"machine": machine(), "sizes": results}, indent=1, default=float))
    tl, met, total = target_table(results)
    print("\n".join(tables(results) + [""] + tl + ["", f"targets met: {met} of {total}"]))
    if not a.no_write:
        plot(results, HERE / "optimizer_scale.png")
        update_section("optimizer-scale", section(results, cal, a))


if __name__ == "__main__":
    main()
