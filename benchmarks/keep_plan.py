"""Under a disk budget, which intermediate arrays a run keeps: chosen by the plan's
integer program (A) or by the older rule (B), the same budgets, the same plans'
lineage strategies.

Per case -- astronomy at 1 Mpix (the shipped workload, default parameters) and
genomics at 100x (``--param replicate=100``, its workload) -- in a fresh child
process and store, in-process engine (``engine="local"``):

1. the reserve ``R = optimize(max_disk="10GB", workload=..., save=False)
   .arrays_reserve`` (what a run keeps of arrays whatever its policy: the outputs,
   the metadata and checksums of the rest) and, from that roomy plan, ``D`` = the
   bytes of every intermediate array it may drop (``sum(a["bytes"] for a in
   plan.arrays.values())``) plus its lineage (``plan.disk``);
2. one ``keep="all"`` run with the default strategies: the reference answers;
3. per budget ``R + X``, X a fraction of D (``--fractions``): ``p = optimize(
   max_disk=R + X, workload=..., name=...)``, then two runs with ``keep="auto"``:

   * A: ``plan=p.name`` -- the run keeps what the plan kept (``Plan.drops``);
   * B: ``plan={**p.as_dict(), "drops": None}`` -- the same strategies and budget,
     the arrays chosen as before the plan chose them: the ``auto`` heuristic, then
     ``keep.fit`` dropping the largest intermediates first until arrays + lineage fit;

   each run's own arrays (``keep.array_bytes``, the store's shared inputs left out)
   plus its lineage (``run.lineage_bytes()``) -- what the budget counts -- checked
   against the budget, and the arrays it did not keep (``store.run_usage``);
4. the shipped workload's queries, their cells chosen on the reference run, each
   timed on a fresh ``Run`` (``store.get``) with the query-time planner the CLI
   uses (``planner_for``; the store is calibrated once per invocation, before the
   cases), trace plus the values of the answer's cells (what the CLI prints), A
   and B alternated within each repeat, median of ``--repeats``.  Every answer's
   cells and values must equal the reference's: the benchmark stops on a mismatch.

    .venv/bin/python benchmarks/keep_plan.py [--cases astro1 genomics100] [--repeats 5]
                                             [--fractions 0.01 0.02 0.05 0.1 0.3 0.6 1 1.5] [--no-write]

Results: ``benchmarks/.work/keep_plan.json``, the plot ``benchmarks/keep_plan.png``
and (without ``--no-write``) the ``keep_plan`` section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import _common as common  # noqa: E402
from _common import command_line, machine, run_child, update_section  # noqa: E402
from _common import median as med  # noqa: E402
from disk import _json, check, library_commit, own_bytes, timed_trace  # noqa: E402

VARIANTS = ("A", "B")
VARIANT_NAMES = {"A": "A: arrays the plan kept", "B": "B: auto heuristic + largest first"}
CASES = {
    "astro1": dict(label="astronomy 1 Mpix", wf=str(ROOT / "workflows" / "astronomy.py"), params=None,
                   workload=str(ROOT / "workflows" / "astronomy_workload.json")),
    "genomics100": dict(label="genomics 100x", wf=str(ROOT / "workflows" / "genomics.py"),
                        params={"replicate": 100},
                        workload=str(ROOT / "workflows" / "genomics_workload.json")),
}
DEFAULT_CASES = ["astro1", "genomics100"]
DEFAULT_FRACTIONS = [0.01, 0.02, 0.05, 0.1, 0.3, 0.6, 1.0, 1.5]


class Mismatch(common.Mismatch):
    """A or B answered a query differently from the keep="all" reference."""


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the child: one case ---------------------------------------------------------------------------
def queries_of(case: dict, run) -> list[dict]:
    """The shipped workload's queries, their cells chosen on the reference run."""
    from subzero.query.workload import load_workload, select_cells
    return [dict(name=q.name, start=q.start, cells=select_cells(run, q), to=q.to, path=q.path,
                 shortcut=q.shortcut) for q in load_workload(case["workload"])]


def plan_facts(p) -> dict:
    kept = {n: a for n, a in p.arrays.items() if a.get("keep")}
    return {"name": p.name, "strategies": p.strategies, "disk": p.disk, "max_disk": p.max_disk,
            "arrays_reserve": p.arrays_reserve, "arrays": p.arrays, "drops": p.drops,
            "kept_bytes": sum(a["bytes"] for a in kept.values()),
            "predicted": p.arrays_reserve + sum(a["bytes"] for a in kept.values()) + p.disk}


def one_run(st, case: dict, plan, budget: int, where: str) -> dict:
    from subzero.errors import BudgetError
    logged = len(st.catalog.traces(workflow=Path(case["wf"]).stem))
    t0 = time.perf_counter()
    try:
        run = st.run(case["wf"], params=case["params"], engine="local", keep="auto", plan=plan,
                     progress=False)
    except BudgetError as e:                 # did not fit: refused, nothing kept
        say(f"{where}: REFUSED BudgetError: {e}")
        return {"error": f"BudgetError: {e}", "run_s": time.perf_counter() - t0}
    run_s = time.perf_counter() - t0
    arrays, lineage = own_bytes(run)
    u = st.run_usage(run.id)
    out = {"id": run.id, "run_s": run_s, "arrays": arrays, "lineage": lineage,
           "total": arrays + lineage, "budget": budget, "ok": arrays + lineage <= budget,
           "not_kept": list(u.not_kept), "traces_logged": logged,
           "array_bytes": {n: int(b) for n, b in ((n, _array_bytes(run, n)) for n in run.shapes())
                           if b is not None},
           "strategies": {o["name"]: o["strategies"] for o in run.ops()}}
    run.close()
    say(f"{where}: run {run_s:.1f} s; arrays {arrays} + lineage {lineage} = {arrays + lineage} of "
        f"{budget} bytes: {'ok' if out['ok'] else 'EXCEEDED'}; not kept {len(out['not_kept'])}")
    return out


def _array_bytes(run, name: str) -> int | None:
    from subzero.runs.keep import array_bytes
    if run._arrays.is_shared(name):
        return None
    return int(array_bytes(run._arrays, name))


def latencies(st, ids: dict[str, int], qs: list[dict], answers: dict, repeats: int, where: str) -> dict:
    """Per query and variant: every timing (trace + values; opening the run and building the
    planner apart), each answer checked against the reference's."""
    res: dict = {}
    for q in qs:                             # warm-up (imports, readers), answers checked
        warm, methods = {}, {}
        for v in VARIANTS:
            _, s, cells, values, methods[v] = timed_trace(st, ids[v], q)
            check(where, q["name"], v, answers[q["name"]], (cells, values))
            warm[v] = s
        res[q["name"]] = {"warmup_s": warm, "methods": methods, **{v: {"s": [], "open_s": []}
                                                                   for v in VARIANTS}}
    for rep in range(repeats):
        order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]        # each first in turn
        for q in qs:
            for v in order:
                o, s, cells, values, _ = timed_trace(st, ids[v], q)
                check(where, q["name"], v, answers[q["name"]], (cells, values))
                res[q["name"]][v]["s"].append(s)
                res[q["name"]][v]["open_s"].append(o)
        say(f"{where}: latency round {rep + 1}/{repeats}")
    return res


def case_main(key: str, folder: Path, a) -> dict:
    import subzero
    from subzero.optimizer import optimize
    case = CASES[key]
    st = subzero.open_store(folder / "store")
    out: dict = {"case": key, "label": case["label"], "params": case["params"], "budgets": []}
    try:
        c = json.loads((folder / "calibration.json").read_text())
        st.catalog.add_calibration(os.uname().nodename, c["seconds"], c)
        t0 = time.perf_counter()
        roomy = optimize(st, case["wf"], case["params"], max_disk="10GB", workload=case["workload"],
                         save=False, progress=False)
        out["roomy"] = plan_facts(roomy)
        out["reserve"] = reserve = int(roomy.arrays_reserve)
        out["droppable_bytes"] = int(sum(x["bytes"] for x in roomy.arrays.values()))
        out["roomy_lineage"] = int(roomy.disk)
        span = out["droppable_bytes"] + out["roomy_lineage"]
        say(f"{key}: reserve {reserve} bytes, droppable arrays {out['droppable_bytes']} + lineage "
            f"{out['roomy_lineage']} bytes (roomy plan, {time.perf_counter() - t0:.0f} s)")
        ref = st.run(case["wf"], params=case["params"], engine="local", keep="all", progress=False)
        out["reference"] = {"id": ref.id, "strategies": {o["name"]: o["strategies"] for o in ref.ops()}}
        qs = queries_of(case, ref)
        ref.close()
        answers = {}
        for q in qs:
            _, _, cells, values, _ = timed_trace(st, out["reference"]["id"], q)
            answers[q["name"]] = (cells, values)
        out["queries"] = [{"name": q["name"], "start": q["start"], "to": q["to"], "path": q["path"],
                           "cells_in": int(len(q["cells"])), "cells_out": len(answers[q["name"]][0])}
                          for q in qs]
        for i, f in enumerate(a.fractions):
            extra = int(round(f * span))
            budget = reserve + extra
            where = f"{key} R+{f:g}D"
            t0 = time.perf_counter()
            p = optimize(st, case["wf"], case["params"], max_disk=budget, workload=case["workload"],
                         name=f"keepplan-{i}", progress=False)
            b: dict = {"fraction": f, "extra": extra, "budget": budget,
                       "optimize_s": time.perf_counter() - t0, "plan": plan_facts(p), "runs": {}}
            say(f"{where}: budget {budget} bytes; plan lineage {p.disk:.0f} bytes, drops "
                f"{', '.join(p.drops) or 'none'}")
            plans = {"A": p.name, "B": {**p.as_dict(), "drops": None}}
            for v in VARIANTS:
                b["runs"][v] = one_run(st, case, plans[v], budget, f"{where} {v}")
            out["budgets"].append(b)
            if any("error" in r for r in b["runs"].values()):
                continue
            b["latency"] = latencies(st, {v: b["runs"][v]["id"] for v in VARIANTS}, qs, answers,
                                     a.repeats, where)
            tot = {v: sum(med(b["latency"][q["name"]][v]["s"]) for q in qs) for v in VARIANTS}
            say(f"{where}: workload {tot['A'] * 1e3:.0f} ms (A) vs {tot['B'] * 1e3:.0f} ms (B), "
                f"B/A {tot['B'] / tot['A']:.2f}")
        return out
    finally:
        st.close()


def child_main(a) -> None:
    folder = Path(a.folder)
    common.child_main(lambda: case_main(a.child, folder, a), folder / "result.json", _json)


# -- the parent: numbers, tables, plot, RESULTS.md -------------------------------------------------
def totals(r: dict, b: dict) -> dict[str, float] | None:
    if "latency" not in b:
        return None
    return {v: sum(med(b["latency"][q["name"]][v]["s"]) for q in r["queries"]) for v in VARIANTS}


def _kb(x: float) -> str:
    return f"{x / 1e3:,.1f}"


def bytes_table(results: dict) -> list[str]:
    lines = ["| case | budget R + X (X / D) | plan's lineage / kept arrays (predicted) KB | A arrays + lineage KB "
             "| A of budget | B arrays + lineage KB | B of budget | B / A bytes | not kept: A only | not kept: B only "
             "| not kept by both |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for r in results.values():
        if "error" in r:
            continue
        for b in r["budgets"]:
            ra, rb = b["runs"]["A"], b["runs"]["B"]
            pl = b["plan"]
            head = (f"| {r['label']} | {_kb(b['budget'])} KB ({b['fraction']:g}) | "
                    f"{_kb(pl['disk'])} / {_kb(pl['kept_bytes'])} |")
            cells = []
            for x in (ra, rb):
                if "error" in x:
                    cells += ["refused", ""]
                else:
                    cells += [f"{_kb(x['arrays'])} + {_kb(x['lineage'])} = {_kb(x['total'])}",
                              f"{x['total'] / b['budget'] * 100:.0f}%" + ("" if x["ok"] else " **OVER**")]
            if "error" in ra or "error" in rb:
                lines.append(head + " | ".join(cells) + " | | | | |")
                continue
            na, nb = set(ra["not_kept"]), set(rb["not_kept"])
            lines.append(head + " " + " | ".join(cells) + f" | {rb['total'] / ra['total']:.2f}x | "
                         + (", ".join(sorted(na - nb)) or "—") + " | " + (", ".join(sorted(nb - na)) or "—")
                         + f" | {len(na & nb)} |")
    return lines


def latency_table(results: dict) -> list[str]:
    lines = ["| case | budget (X / D) | same arrays kept? | workload A ms | workload B ms | B / A "
             "| per query A / B ms |",
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for r in results.values():
        if "error" in r:
            continue
        for b in r["budgets"]:
            t = totals(r, b)
            if t is None:
                lines.append(f"| {r['label']} | {b['fraction']:g} | | | | | a run refused: not timed |")
                continue
            per = ", ".join(f"{q['name']} {med(b['latency'][q['name']]['A']['s']) * 1e3:.1f} / "
                            f"{med(b['latency'][q['name']]['B']['s']) * 1e3:.1f}" for q in r["queries"])
            same = "yes" if same_arrays(b) else "**no**"
            lines.append(f"| {r['label']} | {b['fraction']:g} | {same} | {t['A'] * 1e3:.1f} | {t['B'] * 1e3:.1f} | "
                         f"{t['B'] / t['A']:.2f}x | {per} |")
    return lines


def same_arrays(b: dict) -> bool:
    """Whether runs A and B of a budget kept the same arrays (neither refused)."""
    ra, rb = b["runs"]["A"], b["runs"]["B"]
    return "error" not in ra and "error" not in rb and set(ra["not_kept"]) == set(rb["not_kept"])


def oddities(results: dict) -> list[str]:
    """What a reader should know: runs over their budget, runs refused, an A run that dropped
    other arrays than its plan (``keep.fit`` dropped more: the plan's bytes were short)."""
    out = []
    for r in results.values():
        if "error" in r:
            continue
        for b in r["budgets"]:
            for v in VARIANTS:
                x = b["runs"][v]
                if "error" in x:
                    out.append(f"{r['label']} X/D={b['fraction']:g} {v}: refused ({x['error']})")
                elif not x["ok"]:
                    out.append(f"{r['label']} X/D={b['fraction']:g} {v}: {x['total']} bytes > budget "
                               f"{b['budget']}")
            x = b["runs"]["A"]
            if "error" not in x and set(x["not_kept"]) != set(b["plan"]["drops"]):
                extra = sorted(set(x["not_kept"]) - set(b["plan"]["drops"]))
                fewer = sorted(set(b["plan"]["drops"]) - set(x["not_kept"]))
                out.append(f"{r['label']} X/D={b['fraction']:g} A dropped other arrays than its plan: "
                           f"also {', '.join(extra) or 'none'}; kept {', '.join(fewer) or 'none'}")
    return out


def over_budget(results: dict) -> list[str]:
    return [f"{r['label']} X/D={b['fraction']:g} {v}: {b['runs'][v]['total']} > {b['budget']}"
            for r in results.values() if "error" not in r for b in r["budgets"] for v in VARIANTS
            if "error" not in b["runs"][v] and not b["runs"][v]["ok"]]


def summary(results: dict) -> list[str]:
    """Per case: the spread of B / A where both kept the same arrays (what this machine's
    noise does to the same configuration), and each budget where they did not."""
    out = []
    for r in results.values():
        if "error" in r:
            continue
        same, differ = [], []
        for b in r["budgets"]:
            t = totals(r, b)
            if t is None:
                continue
            (same if same_arrays(b) else differ).append((b, t["B"] / t["A"]))
        text = f"{r['label']}: A and B kept the same arrays under {len(same)} of {len(r['budgets'])} budgets"
        if same:
            lo, hi = min(x for _, x in same), max(x for _, x in same)
            text += f" (workload B / A there {lo:.2f}x to {hi:.2f}x: the same arrays, so that spread is noise)"
        if differ:
            text += "; they differed under " + "; ".join(
                f"X/D = {b['fraction']:g} (B / A bytes {b['runs']['B']['total'] / b['runs']['A']['total']:.2f}x, "
                f"latency {x:.2f}x)" for b, x in differ)
        out.append("- " + text + ".")
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in results.values() if "error" not in r]
    fig, axes = plt.subplots(len(ok), 2, figsize=(13, 4.2 * len(ok)), squeeze=False)
    for row, r in zip(axes, ok):
        bs = r["budgets"]
        x = [b["budget"] / 1e3 for b in bs]
        ax = row[0]
        ax.plot(x, x, "k--", lw=0.8, label="budget")
        for v, m in zip(VARIANTS, ("o-", "s-")):
            ax.plot(x, [np.nan if "error" in b["runs"][v] else b["runs"][v]["total"] / 1e3 for b in bs], m,
                    label=VARIANT_NAMES[v])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("budget R + X, KB")
        ax.set_ylabel("run's arrays + lineage, KB")
        ax.set_title(f"{r['label']}: arrays + lineage, as the budget counts them", fontsize=10)
        ax.legend(fontsize=8)
        ax = row[1]
        for v, m in zip(VARIANTS, ("o-", "s-")):
            ys = []
            for b in bs:
                t = totals(r, b)
                ys.append(np.nan if t is None else t[v] * 1e3)
            ax.plot(x, ys, m, label=VARIANT_NAMES[v])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("budget R + X, KB")
        ax.set_ylabel("ms")
        ax.set_title(f"{r['label']}: workload latency\n(sum of per-query medians, fresh Run each)",
                     fontsize=10)
        ax.legend(fontsize=8)
        for ax in row:
            for i, b in enumerate(bs):
                if not same_arrays(b):
                    ax.axvline(x[i], color="grey", lw=0.6, ls=":")
        row[0].text(0.99, 0.02, "dotted: A and B kept different arrays", transform=row[0].transAxes,
                    ha="right", fontsize=7, color="grey")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def section(results: dict, meta: dict) -> str:
    ok = {k: r for k, r in results.items() if "error" not in r}
    failed = [f"{r.get('label', k)}: {r['error']}" for k, r in results.items() if "error" in r]
    per_case = "; ".join(
        f"{r['label']}: R = {r['reserve']} bytes, D = {r['droppable_bytes']} (droppable arrays) + "
        f"{r['roomy_lineage']} (lineage) bytes, {len(r['queries'])} queries "
        f"({', '.join(q['name'] for q in r['queries'])}), {r['took_s'] / 60:.1f} min"
        for r in ok.values())
    lines = [
        "## Disk budget: arrays chosen by the plan", "",
        f"Measured at commit {meta['commit']} (the library; this benchmark as committed with these results). "
        f"Command: `{meta['command']}` — machine: {machine()}, shared with other work. "
        f"`uptime` at the start: `{meta['uptime_start']}`; at the end: `{meta['uptime_end']}`.", "",
        "Under a disk budget, two ways of choosing which intermediate arrays a `keep=\"auto\"` run keeps, "
        "with the same budget and the same plan's lineage strategies: **A** the plan's own choice (the "
        "integer program prices each array's bytes against the remakes the workload would pay without it; "
        "`store.run(wf, plan=p.name, keep=\"auto\")`), **B** the rule from before it (`plan={**p.as_dict(), "
        "\"drops\": None}`: the `auto` heuristic, then the largest intermediates dropped first until "
        "arrays and lineage fit). Per case, in a fresh child process and store, in-process engine: the "
        "reserve R = `optimize(max_disk=\"10GB\", workload=..., save=False).arrays_reserve` and D = that "
        "roomy plan's droppable array bytes plus its lineage; per budget R + X, X a fraction of D, "
        "`optimize(max_disk=R + X, workload=<the shipped workload>)` once, then one run A and one run B. "
        "Bytes are the run's own arrays (`subzero.runs.keep.array_bytes`, the store's shared inputs left "
        "out) plus `run.lineage_bytes()`, what the budget counts. Latency: the shipped workload's queries, "
        "cells chosen on a keep=\"all\" run of the default strategies, each query timed on a fresh `Run` "
        "with the query-time planner the CLI uses (the store calibrated once per invocation), trace plus "
        f"the answer's values, A and B alternated within each repeat, median of {meta['repeats']}; "
        "opening the run and building the planner left out. Every answer of A and B was checked equal "
        "(cells and values) to the keep=\"all\" run's.", "",
        f"Per case: {per_case}.", "",
        "![keep_plan](keep_plan.png)", "",
        "Bytes (KB = 1000 bytes; \"not kept: A only\": arrays A dropped and B kept; the plan's predicted "
        "kept-array bytes are from its profiling run):", ""] + bytes_table(results) + [
        "", "Workload latency (sum of the per-query medians; per query: median A / median B):", ""] + \
        latency_table(results)
    lines += [""] + summary(results)
    odd = oddities(results)
    if odd:
        lines += ["", "Noted: " + "; ".join(odd) + "."]
    if failed:
        lines += ["", "Failed: " + "; ".join(failed) + "."]
    if meta.get("observed"):
        lines += ["", meta["observed"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=DEFAULT_CASES)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fractions", nargs="+", type=float, default=DEFAULT_FRACTIONS,
                    help="X of each budget R + X, as a fraction of D (droppable arrays + lineage)")
    ap.add_argument("--no-write", action="store_true", help="leave RESULTS.md and keep_plan.png alone")
    ap.add_argument("--report", action="store_true",
                    help="measure nothing: the tables, plot and section of the last results")
    ap.add_argument("--child", choices=list(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child_main(a)
        return 0
    last = HERE / ".work" / "keep_plan.json"
    if a.report:
        data = json.loads(last.read_text())
        return report(data["cases"], data["meta"], a)
    from subzero.optimizer import calibrate
    meta = {"command": command_line(), "uptime_start": uptime(), "repeats": a.repeats,
            "fractions": a.fractions, "commit": library_commit()}
    say(f"start: {meta['uptime_start']}")
    results: dict = {}
    work = Path(tempfile.mkdtemp(prefix="sz-keepplan-"))
    try:
        say("calibrating (once: the budgets' plans and the query-time planner)...")
        cal = json.loads(json.dumps(calibrate(progress=False), default=float))
        for key in a.cases:
            folder = work / key
            folder.mkdir()
            (folder / "calibration.json").write_text(json.dumps(cal))
            cmd = [sys.executable, __file__, "--child", key, "--folder", str(folder),
                   "--repeats", str(a.repeats), "--fractions", *map(str, a.fractions)]
            res, wall = run_child(cmd, folder / "result.json", CASES[key]["label"], stream=True)
            res.update(took_s=wall)
            res.setdefault("label", CASES[key]["label"])
            results[key] = res
            say(f"{CASES[key]['label']}: " + (f"FAILED {res['error']}" if "error" in res else f"{wall:.0f} s"))
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta["uptime_end"] = uptime()
    say(f"end: {meta['uptime_end']}")
    last.parent.mkdir(exist_ok=True)
    last.write_text(json.dumps({"machine": machine(), "meta": meta, "cases": results}, indent=1,
                               default=_json))
    return report(results, meta, a)


def report(results: dict, meta: dict, a) -> int:
    print("\n".join(bytes_table(results)) + "\n")
    print("\n".join(latency_table(results)) + "\n")
    print("\n".join(summary(results)))
    for o in oddities(results):
        print(f"noted: {o}")
    if not a.no_write:
        plot(results, HERE / "keep_plan.png")
        update_section("keep_plan", section(results, meta), before="codecs")
        print("RESULTS.md updated (keep_plan.png)")
    failed = [r for r in results.values() if "error" in r]
    return 1 if over_budget(results) or failed else 0


if __name__ == "__main__":
    sys.exit(main())
