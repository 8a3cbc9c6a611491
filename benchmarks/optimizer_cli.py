"""The storage-budget optimizer on the user's path (issue 33): the command lines a
person types, not the library calls ``optimizer_scale.py`` makes.

Per genomics size, in fresh stores (one for the defaults, one for the plan, as a
user who tries both would make them):

1. ``subzero run workflows/genomics.py --param replicate=N`` (the defaults);
2. ``subzero run workflows/genomics.py --param replicate=N --max-disk 100MB`` (this
   calibrates the machine in the fresh store, profiles, optimizes and runs the plan),
   optionally with ``--load K`` busy-loop processes running while it does (a plan
   chosen on a loaded machine); the commands see an empty user cache of their own
   (``SUBZERO_CACHE_DIR``), as on a machine never calibrated, and the same command in
   a second fresh store then starts from the calibration the first kept there;
3. ``subzero trace --workload workflows/genomics_workload.json --json`` ``--traces``
   times on each store, alternating (the load stopped), each query's best time kept.

Every command is a fresh process, as a user's is.  Reported per query: the defaults,
the plan, plan / defaults, and the plan's own prediction (``--json`` of the plan is
read back from the store).  The per-query target is plan / defaults <= 1.2.

    .venv/bin/python benchmarks/optimizer_cli.py --genomics 1,100,1000
    .venv/bin/python benchmarks/optimizer_cli.py --genomics 100 --load 4

Results: ``benchmarks/.work/optimizer_cli.json`` (merged by size and load) and,
unless ``--no-write``, the ``optimizer-cli`` section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / ".work"
sys.path.insert(0, str(HERE))
from _common import bytecode_env, command_line, machine, update_section  # noqa: E402

from subzero.tuning import CALIBRATION_OBSERVERS  # noqa: E402

WORKFLOW = "workflows/genomics.py"
WORKLOAD = "workflows/genomics_workload.json"
PLAN_VS_DEFAULTS = 1.2
WORKLOAD_ERROR = 0.25


#: the commands' bytecode cache (``--no-bytecode-cache``: None, every module compiled by
#: every process): an installed SubZero loads its modules from bytecode, and this machine's
#: environment sets PYTHONDONTWRITEBYTECODE, which would charge every trace the compiling
#: of the code it runs -- more than a small query's own work
BYTECODE: dict[str, Path | None] = {"cache": WORK / "pycache"}


#: the user's cache folder the commands see (``SUBZERO_CACHE_DIR``): an empty one per size,
#: so the first budgeted run calibrates as on a machine never calibrated, and the second
#: (another fresh store) starts from the calibration the first cached
USER_CACHE: dict[str, Path | None] = {"dir": None}


def _cli(*args: str, cwd: Path = ROOT) -> tuple[str, float]:
    """Run one ``subzero`` command in a fresh process; (stdout, wall seconds)."""
    exe = Path(sys.executable).parent / "subzero"
    env = bytecode_env(BYTECODE["cache"])
    if USER_CACHE["dir"] is not None:
        env["SUBZERO_CACHE_DIR"] = str(USER_CACHE["dir"])
    t0 = time.perf_counter()
    p = subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"subzero {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout, wall


def _spin() -> None:           # a busy loop: one core's worth of load
    while True:
        pass


class Load:
    """``n`` busy-loop processes while the block runs."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        ctx = mp.get_context("fork")
        self.procs = [ctx.Process(target=_spin, daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join()


def _trace_once(store: Path, best: dict, planner: bool = True, workload: str = WORKLOAD) -> None:
    """One ``subzero trace --workload`` process; keeps each query's best wall time (ms)
    and the methods of that best, and its least CPU time (ms), in ``best``."""
    args = ["trace", "--store", str(store), "--workload", workload, "--json"]
    if not planner:
        args.append("--no-planner")
    out, _ = _cli(*args)
    for q in json.loads(out)["queries"]:
        ms, cpu = q["seconds"] * 1e3, q.get("cpu_seconds", q["seconds"]) * 1e3
        steps = q.get("steps_cpu_seconds", float("nan")) * 1e3   # first uses left out
        had = best.get(q["name"])
        if had is None or ms < had["ms"]:
            best[q["name"]] = {"ms": ms, "methods": q.get("methods", []),
                               "cpu_ms": min(cpu, had["cpu_ms"]) if had else cpu,
                               "steps_ms": min(steps, had.get("steps_ms", steps)) if had else steps}
        else:
            had["cpu_ms"] = min(had["cpu_ms"], cpu)
            had["steps_ms"] = min(had.get("steps_ms", steps), steps)


def _plan_of(store: Path) -> dict:
    """The plan the budgeted run saved (its prediction per query) and its calibration."""
    code = (
        "import json, os, sys\n"
        "import subzero\n"
        "s = subzero.open_store(sys.argv[1], create=False)\n"
        "names = s.catalog.plan_names()\n"
        "p = s.catalog.get_plan(names[-1]) if names else None\n"
        "cal = s.catalog.latest_calibration(os.uname().nodename) or {}\n"
        "print(json.dumps({'plan': p, 'calibration': {k: cal.get(k) for k in "
        "('seconds', 'load', 'cpu_s', 'quality')}}, default=str))\n")
    p = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True,
                       cwd=ROOT)
    return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {}


def measure(size: int, load: int, traces: int, max_disk: str, folder: Path) -> dict:
    params = ["--param", f"replicate={size}"]
    out: dict = {"size": size, "load": load, "max_disk": max_disk}
    dstore, pstore = folder / "defaults", folder / "plan"
    USER_CACHE["dir"] = folder / "user-cache"
    _, out["defaults_run_s"] = _cli("run", WORKFLOW, *params, "--store", str(dstore))
    with Load(load):
        text, out["plan_run_s"] = _cli("run", WORKFLOW, *params, "--max-disk", max_disk,
                                       "--store", str(pstore))
        # a second fresh store on the same machine: the calibration comes from the
        # user's cache (when the first was made quiet enough to be cached)
        _, out["plan_run_cached_s"] = _cli("run", WORKFLOW, *params, "--max-disk", max_disk,
                                           "--store", str(folder / "plan-again"))
    out["plan_table"] = text
    out["plan"] = _plan_of(pstore)
    out["defaults"], out["planned"], out["planned_no_planner"] = {}, {}, {}
    for _ in range(traces):            # alternating: both see the same moments of load
        _trace_once(dstore, out["defaults"])
        _trace_once(pstore, out["planned"])
    _trace_once(pstore, out["planned_no_planner"], planner=False)
    # one query per process, as a user asks one question at a time: no query finds the
    # caches an earlier one filled (in a workload trace, whichever query first reads a
    # strategy pays its block decoding, and that query differs between the stores)
    spec = json.loads((ROOT / WORKLOAD).read_text())
    out["alone_defaults"], out["alone_planned"] = {}, {}
    for q in spec["queries"]:
        one = folder / f"{q['name']}.json"
        one.write_text(json.dumps({**spec, "queries": [q]}))
        for _ in range(max(2, traces // 2)):
            _trace_once(dstore, out["alone_defaults"], workload=str(one))
            _trace_once(pstore, out["alone_planned"], workload=str(one))
    return out


def _predicted(r: dict) -> dict[str, float]:
    plan = (r.get("plan") or {}).get("plan") or {}
    return {k: v * 1e3 for k, v in (plan.get("queries") or {}).items()}


def table(results: dict, alone: bool = False) -> list[str]:
    """Each query under the defaults and the plan: traced in one ``trace --workload``
    process with the plan's prediction, or (``alone``) each in a process of its own."""
    lines = ["| size | load while optimizing | query | defaults ms | plan ms | plan / defaults "
             "| defaults CPU ms | plan CPU ms | plan / defaults, CPU "
             + ("" if alone else "| predicted ms ") + "| plan's methods |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | "
             + ("" if alone else "---: | ") + "--- |"]
    for r in results.values():
        pred = {} if alone else _predicted(r)
        planned = r.get("alone_planned" if alone else "planned") or {}
        for q, d in (r.get("alone_defaults" if alone else "defaults") or {}).items():
            p = planned[q]
            guess = "" if alone else (f"{pred[q]:.1f} | " if q in pred else "— | ")
            methods = ", ".join(m for m in p["methods"] if m != "map") or "map"
            lines.append(f"| {r['size']:,}x | {r['load']} | {q} | {d['ms']:.1f} | {p['ms']:.1f} | "
                         f"{p['ms'] / d['ms']:.2f}x | {d['cpu_ms']:.1f} | {p['cpu_ms']:.1f} | "
                         f"{p['cpu_ms'] / d['cpu_ms']:.2f}x | {guess}{methods} |")
    return lines


def _ok(met: bool) -> str:
    return "met" if met else "**missed**"


def targets(results: dict) -> list[str]:
    lines = ["| size | load | target | measured (wall) | | measured (CPU) | |",
             "| --- | ---: | --- | --- | --- | --- | --- |"]
    def worst_row(r: dict, what: str, d: dict, p: dict,
                  keys: tuple[str | None, str] = ("ms", "cpu_ms")) -> str:
        """The target row of the worst query, plan over defaults, in wall and CPU time
        (``keys``: the measures of the two columns; None leaves one empty)."""
        row = [f"| {r['size']:,}x | {r['load']} | {what} <= {PLAN_VS_DEFAULTS}x the defaults"]
        for k in keys:
            if k is None:
                row.append(" | ")
                continue
            worst = max(d, key=lambda q: p[q][k] / d[q][k])
            ratio = p[worst][k] / d[worst][k]
            row.append(f"worst {worst} {ratio:.2f}x | {_ok(ratio <= PLAN_VS_DEFAULTS)}")
        return " | ".join(row) + " |"

    for r in results.values():
        d, p = r["defaults"], r["planned"]
        lines.append(worst_row(r, "every query under the plan", d, p))
        # the same queries, each by its steps' own CPU time: in one process, whichever
        # query first reads a strategy pays its first uses (opening the reader, the pages
        # it maps), and under the defaults that is a long scan the plan does not make
        own = {q: d[q] for q in d if q in p and d[q].get("steps_ms", 0) > 0
               and p[q].get("steps_ms", float("nan")) == p[q].get("steps_ms")}      # not NaN
        if own:
            lines.append(worst_row(r, "every query under the plan, by its steps' own CPU time "
                                   "(first uses left out),", own, p, keys=(None, "steps_ms")))
        if r.get("alone_defaults"):
            lines.append(worst_row(r, "one query per process: every query", r["alone_defaults"],
                                   r["alone_planned"]))
        row = [f"| {r['size']:,}x | {r['load']} | workload total under the plan <= the defaults'"]
        for k in ("ms", "cpu_ms"):
            tp, td = sum(p[q][k] for q in p), sum(d[q][k] for q in d)
            row.append(f"{tp:.0f} vs {td:.0f} ms | {_ok(tp <= td)}")
        lines.append(" | ".join(row) + " |")
        pred = _predicted(r)
        if pred:
            tot = sum(pred.values())
            # a trace process's first uses, which the plan reports beside its query prices
            # (none in plans made before it did): the measured queries pay them once
            once = ((r.get("plan") or {}).get("plan") or {}).get("first_use_s") or 0.0
            row = [f"| {r['size']:,}x | {r['load']} | predicted workload cost within "
                   f"{WORKLOAD_ERROR:.0%} of measured"]
            for k in ("ms", "cpu_ms"):
                meas = sum(p[q][k] for q in pred if q in p)
                err = abs(tot + once * 1e3 - meas) / meas
                row.append(f"{tot + once * 1e3:.0f} vs {meas:.0f} ms ({err:.0%}) | "
                           f"{_ok(err <= WORKLOAD_ERROR)}")
            lines.append(" | ".join(row) + " |")
            # the model prices steps, not a process's first uses (imports, opening the store
            # and its readers): the same prediction against the steps' own CPU time
            own = [p[q].get("steps_ms") for q in pred if q in p]
            if own and all(v is not None and v == v for v in own):
                meas = sum(own)
                # each query's price includes what a trace costs around its steps (plans
                # made before it did say nothing of it): left out here, as from the steps
                around = ((r.get("plan") or {}).get("plan") or {}).get("trace_query_s") or 0.0
                steps = tot - around * 1e3 * len(pred)
                err = abs(steps - meas) / meas
                lines.append(f"| {r['size']:,}x | {r['load']} | predicted workload cost within "
                             f"{WORKLOAD_ERROR:.0%} of the steps' own CPU time (first uses and "
                             f"each trace's own cost left out) | | | {steps:.0f} vs {meas:.0f} ms "
                             f"({err:.0%}) | {_ok(err <= WORKLOAD_ERROR)} |")
        if r.get("plan_run_cached_s") is not None:
            plain = r["defaults_run_s"]
            busy = (((r.get("plan") or {}).get("calibration") or {}).get("load") or {}).get("busy")
            later = ("a later store (the first calibration was made busy, so it was not "
                     "cached: calibrates again)" if busy else
                     "a later store (calibration from the user's cache)")
            for what, k in (("first store on the machine (calibrates)", "plan_run_s"),
                            (later, "plan_run_cached_s")):
                lines.append(f"| {r['size']:,}x | {r['load']} | `run --max-disk` at most 1.3x "
                             f"a plain run: {what} | {r[k]:.1f} vs {plain:.1f} s "
                             f"({r[k] / plain:.1f}x) | {_ok(r[k] <= 1.3 * plain)} | | |")
        cal = ((r.get("plan") or {}).get("calibration") or {})
        if cal.get("seconds") is not None:
            phases = cal.get("cpu_s") or {}
            cpu = sum(phases.values())
            # the observations run on every core (at most CALIBRATION_OBSERVERS), the rest
            # in one process: what the CPU work takes on this machine with nothing else
            spread = min(CALIBRATION_OBSERVERS, os.cpu_count() or 1)
            quiet = cpu - phases.get("observations", 0.0) * (1 - 1 / spread)
            load = cal.get("load") or {}
            lines.append(f"| {r['size']:,}x | {r['load']} | calibration under 30 s | "
                         f"{cal['seconds']:.1f} s | {_ok(cal['seconds'] < 30)} | {cpu:.1f} s of "
                         f"CPU, its children's included: {quiet:.1f} s on {spread} idle cores "
                         f"(got {load.get('cpu_share', float('nan')):.0%} of a core; busy: "
                         f"{load.get('busy')}) | {_ok(quiet < 30)} |")
    return lines


def _loads(results: dict) -> str:
    """The machine's load average around each size, and how the commands loaded SubZero."""
    parts = [f"{r['size']:,}x: {r['loadavg'][0]:.1f} -> {r['loadavg'][1]:.1f}"
             for r in results.values() if r.get("loadavg")]
    code = ("each command loading SubZero from a bytecode cache, as an installed one does"
            if all(r.get("bytecode") for r in results.values()) else
            "some sizes measured with every module compiled by every command")
    return ("load average at the start and end of each size: " + ", ".join(parts) + "; "
            if parts else "load average not recorded; ") + code


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the optimizer on the CLI path (issue 33)")
    ap.add_argument("--genomics", default="1,100,1000", help="replicates, comma-separated")
    ap.add_argument("--load", type=int, default=0,
                    help="busy-loop processes while `run --max-disk` calibrates and optimizes")
    ap.add_argument("--traces", type=int, default=4, help="workload traces per store (best kept)")
    ap.add_argument("--max-disk", default="100MB")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--work", default=str(WORK))
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="compile every module in every command (PYTHONDONTWRITEBYTECODE=1)")
    a = ap.parse_args(argv)
    BYTECODE["cache"] = None if a.no_bytecode_cache else Path(a.work) / "pycache"
    saved = Path(a.work) / "optimizer_cli.json"
    results = json.loads(saved.read_text())["sizes"] if saved.is_file() else {}
    warm = Path(tempfile.mkdtemp(prefix="sz-optimizer-cli-warm-"))
    try:             # fills the bytecode cache (uncounted): the first plain run compiled it
        _cli("run", WORKFLOW, "--store", str(warm / "store"))
        _cli("trace", "--store", str(warm / "store"), "--workload", WORKLOAD, "--json")
    finally:
        shutil.rmtree(warm, ignore_errors=True)
    for size in [int(s) for s in a.genomics.split(",") if s.strip()]:
        folder = Path(tempfile.mkdtemp(prefix="sz-optimizer-cli-"))
        before = os.getloadavg()[0]
        try:
            r = measure(size, a.load, a.traces, a.max_disk, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        r["command"] = command_line()
        r["loadavg"] = [before, os.getloadavg()[0]]
        r["bytecode"] = BYTECODE["cache"] is not None
        results[f"{size}:{a.load}"] = r
        print("\n".join(table({"x": r}) + [""] + table({"x": r}, alone=True)), flush=True)
        results = dict(sorted(results.items(), key=lambda kv: (kv[1]["load"], kv[1]["size"])))
        saved.parent.mkdir(parents=True, exist_ok=True)     # kept size by size
        saved.write_text(json.dumps({"machine": machine(), "sizes": results}, indent=1, default=str))
    print("\n".join(targets(results)))
    if not a.no_write:
        cmds = sorted({r["command"] for r in results.values()})
        update_section("optimizer-cli", "\n".join(
            ["## Storage-budget optimizer on the command line (issue 33)", "",
             "Commands: " + "; ".join(f"`{c}`" for c in cmds) + f" — machine: {machine()}; "
             + _loads(results) + ".", "",
             "Per size, two fresh stores: `subzero run workflows/genomics.py --param replicate=N` "
             "(the defaults) and the same with `--max-disk 100MB` (calibration in the fresh "
             "store, profiling, the plan and its run; with `--load K`, K busy-loop processes ran "
             "meanwhile), then `subzero trace --workload workflows/genomics_workload.json` on "
             "each, best of the traces per query, every command a fresh process.  The commands "
             "see an empty user cache of their own (`SUBZERO_CACHE_DIR`); `run --max-disk` in a "
             "third fresh store then starts from the calibration the first kept there (sizes "
             "measured before the cache existed have no such row).", ""]
            + targets(results) + ["", "Each query in one `trace --workload` process (best of "
                                  "the traces; CPU: the least CPU seconds):", ""]
            + table(results) + ["", "Each query in its own process (a workload file of that "
                                "query alone):", ""] + table(results, alone=True)))


if __name__ == "__main__":
    main()
