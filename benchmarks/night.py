"""A night, not a run (issue 29): the impact of an input region across a night of runs.

A night of N runs of the astronomy workflow is built from the two real ImSim
exposures: run i reads its own exposure pair (the real exposures with their
own Gaussian noise, seeded per exposure) and the SAME bias, dark and flat
(equal content in every run).  The genomics workflow likewise: N runs read the
same patient table.  Then, in one store per workload and size (built once,
grown from one N to the next, and kept under ``--workdir``):

* input bytes on disk (a store-level ``inputs/`` folder of shared inputs, if the
  store has one, plus every run's own input copies and references) against
  "copies" (every run holding its own copy of each of its inputs);
* ``store.impact`` of a one-column defect of the flat and of a 10x10 box (genomics:
  a few patients' values): total time (median of repeats), per-run time, runs
  found and touched, cells affected; against the in-run baseline, a loop of one
  ``run.trace`` per run over the same runs and cells;
* the same queries after 10x as many unrelated runs (small runs of
  ``workflows/example.py``, inputs of other content) are added to the store;
* one query through the CLI (``subzero impact --json``), process start included.

    .venv/bin/python benchmarks/night.py --quick                  # 20 runs, 200 unrelated, 1 Mpix
    .venv/bin/python benchmarks/night.py --workdir /tmp/night     # N = 20, 100, 200 at 1 Mpix; N = 20 at 16 Mpix
    .venv/bin/python benchmarks/night.py --workdir /tmp/night --only astro --mpix 16 --n16 20 --add

Results are kept in ``WORKDIR/night.json`` (one record per workload, size and N);
``--add`` keeps the records of earlier invocations with the same workdir, so a
long benchmark can be measured in parts.  The RESULTS.md section and
``benchmarks/night.png`` are drawn from all kept records.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import inspect
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from _common import machine, update_section  # noqa: E402

import subzero  # noqa: E402
from subzero.impact import outputs  # noqa: E402

ASTRO_INPUTS = ("raw_1", "raw_2", "bias", "dark", "flat")
SHARED = ("bias", "dark", "flat")
NOISE_SIGMA = 10.0             # counts: each exposure's own read/sky noise added to the real one
NIGHT_SEED = 29                # the number: exposures are seeded (NIGHT_SEED, run, exposure)
GENOMICS_MATRIX = ROOT / "workflows" / "data" / "genomics" / "MD_train_set.txt"
PLOT = Path(__file__).resolve().parent / "night.png"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the night's inputs -----------------------------------------------------------------------

_CACHE: dict = {}


def calibration(mpix: float) -> dict[str, np.ndarray]:
    """bias, dark and flat at ``mpix`` megapixels: the same arrays (content) for every run."""
    key = ("cal", mpix)
    if key not in _CACHE:
        from workflows import astronomy as A
        tiles = A.tiling(mpix)
        _CACHE[key] = {n: A.mosaic(A.source(n), tiles) for n in SHARED}
    return _CACHE[key]


def exposure(mpix: float, run: int, j: int) -> np.ndarray:
    """Exposure j (1, 2) of night run ``run``: the real exposure at ``mpix`` with its own
    noise (seeded by run and exposure), as the uint16 counts the camera writes."""
    from workflows import astronomy as A
    key = ("raw", mpix, j)
    if key not in _CACHE:
        _CACHE[key] = A.mosaic(A.source(f"raw_{j}"), A.tiling(mpix))
    base = _CACHE[key]
    rng = np.random.default_rng((NIGHT_SEED, run, j))
    noise = rng.normal(0.0, NOISE_SIGMA, base.shape).astype(np.float32)
    return np.clip(base + np.rint(noise), 0, 65535).astype(base.dtype)


def night_inputs(mpix: float, run: int) -> dict[str, np.ndarray]:
    return {"raw_1": exposure(mpix, run, 1), "raw_2": exposure(mpix, run, 2), **calibration(mpix)}


def astro_workflow(mpix: float):
    # tiles=: the workflow's defaults are TiledInputs (a few bytes), not arrays copied into
    # every run's workflow.pkl; every input is given anyway.
    from workflows import astronomy as A
    return A.workflow(tiles=A.tiling(mpix))


def genomics_workflow(replicate: int):
    from workflows import genomics as G
    return G.workflow(replicate)


def unrelated_inputs(k: int) -> dict[str, np.ndarray]:
    """Inputs of unrelated run k: a sky and a flat of their own (content unlike any other)."""
    from workflows import example as E
    return {"raw": E.synthetic_sky(100_000 + k), "flat": E.flat_field(500_000 + k)}


# --- building, in this process or in worker processes ----------------------------------------

_STORES: dict = {}


def _store(path: str):
    if path not in _STORES:
        _STORES[path] = subzero.open_store(path)
    return _STORES[path]


def build_one(task: tuple) -> tuple[int, float]:
    """One run: ("astro", store, mpix, i), ("genomics", store, replicate, i) or
    ("unrelated", store, k).  Returns (run id, seconds)."""
    kind, path, *rest = task
    st = _store(path)
    t0 = time.perf_counter()
    if kind == "astro":
        mpix, i = rest
        run = st.run(astro_workflow(mpix), inputs=night_inputs(mpix, i), progress=False)
    elif kind == "genomics":
        replicate, _ = rest
        run = st.run(genomics_workflow(replicate), inputs={"matrix": str(GENOMICS_MATRIX)},
                     progress=False)
    else:
        from workflows import example as E
        (k,) = rest
        run = st.run(E.workflow(), inputs=unrelated_inputs(k), progress=False)
    if run.row.status != "complete":
        raise RuntimeError(f"{kind} run {run.id} is {run.row.status}")
    run.close()
    return run.id, time.perf_counter() - t0


def build(tasks: list[tuple], jobs: int, what: str) -> list[float]:
    """Run ``tasks`` (in order, or ``jobs`` at a time in worker processes); progress lines."""
    times: list[float] = []
    if not tasks:
        return times
    t0 = time.perf_counter()
    every = max(1, len(tasks) // 20)

    def note(k: int, rid: int, s: float) -> None:
        times.append(s)
        if k % every == 0 or k == len(tasks):
            log(f"[{what}] {k}/{len(tasks)} runs built (run {rid}: {s:.2f} s; "
                f"{time.perf_counter() - t0:.0f} s so far)")

    if jobs <= 1:
        for k, t in enumerate(tasks, 1):
            rid, s = build_one(t)
            note(k, rid, s)
    else:
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
            for k, (rid, s) in enumerate(ex.map(build_one, tasks), 1):
                note(k, rid, s)
    return times


def census(st, digest: str) -> tuple[list[int], list[int]]:
    """(night runs: complete runs reading ``digest``; other complete runs)."""
    night = sorted({rid for rid, _ in st.runs_using(digest)})
    others = [r.id for r in st.runs() if r.status == "complete" and r.id not in set(night)]
    return night, others


# --- input bytes -----------------------------------------------------------------------------

def _du(path: Path, seen: set | None) -> int:
    """Bytes on disk (allocated blocks, like du) of a file or folder; a file already
    ``seen`` (same device and inode: a hard link) is counted once."""
    if not path.exists():
        return 0
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    total = 0
    for f in files:
        s = f.stat()
        if seen is not None:
            key = (s.st_dev, s.st_ino)
            if key in seen:
                continue
            seen.add(key)
        total += s.st_blocks * 512
    return total


def input_bytes(st, run_ids: list[int]) -> dict:
    """Inputs of ``run_ids`` on disk against "copies" (each run holding its own copy of
    each input), from ``store.inputs()``: per distinct input, the bytes on disk of the
    copies the store keeps (``stored``: the store's copy under ``inputs/``, or a run's
    own copy in a store made before inputs were stored once), and one copy's bytes
    times the runs that read it.  Split into shared inputs (content read by more than
    one of the runs) and the rest."""
    runs = set(run_ids)
    out = {"shared_on_disk": 0, "shared_copies": 0, "own_on_disk": 0, "own_copies": 0,
           "distinct": 0, "shared_distinct": 0}
    for e in st.inputs():
        uses = [u for u in e["uses"] if u[0] in runs]
        if not uses:
            continue
        kind = "shared" if len({r for r, _ in uses}) > 1 else "own"
        stored = e["stored"]
        one = stored["bytes"] / max(stored["copies"], 1)
        out["distinct"] += 1
        out["shared_distinct"] += kind == "shared"
        out[f"{kind}_on_disk"] += stored["bytes"] * len(uses) / len(e["uses"])
        out[f"{kind}_copies"] += one * len(uses)
    out["runs"] = len(run_ids)
    out["copy_size_from"] = ["store.inputs(): bytes on disk of each input's copies"]
    out["on_disk"] = out["shared_on_disk"] + out["own_on_disk"]
    out["copies"] = out["shared_copies"] + out["own_copies"]
    out["shared_ratio"] = out["shared_on_disk"] / out["shared_copies"] if out["shared_copies"] else None
    out["ratio"] = out["on_disk"] / out["copies"] if out["copies"] else None
    return out


# --- queries ---------------------------------------------------------------------------------

def impact_engines(st) -> list[str | None]:
    """[None] (the default), plus "local" and "spark" when Store.impact takes ``engine``."""
    if "engine" in inspect.signature(st.impact).parameters:
        return [None, "local", "spark"]
    return [None]


def time_impact(st, what, cells, repeats: int, engine: str | None = None):
    kw = {} if engine is None else {"engine": engine}
    st.impact(what, cells, **kw)              # warm: imports, the digest index, caches
    times, res = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = st.impact(what, cells, **kw)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, res


def time_trace_loop(st, uses: list[tuple[int, str]], cells, repeats: int):
    """The baseline: one ``run.trace`` per run that read the input, to its workflow's
    outputs, in this process (what a user would write without ``impact``)."""
    def once():
        counts = {}
        for rid, name in uses:
            run = st.get(rid)
            try:
                spec = run.select(name, cells)
                n = 0
                for t in outputs(run.ops()):
                    n += len(run.trace(name, spec, to=t, record=False).cells)
                counts[rid] = n
            finally:
                run.close()
        return counts
    once()
    times, counts = [], {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        counts = once()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), counts


def measure_queries(st, what, queries: dict[str, str], repeats: int, baseline: bool) -> dict:
    out = {}
    for label, cells in queries.items():
        for engine in impact_engines(st):
            key = label if engine is None else f"{label} ({engine})"
            med, times, res = time_impact(st, what, cells, repeats, engine)
            errors = [r for r in res.runs if r.error]
            row = {"cells": cells, "cells_in": res.cells_in, "seconds": med, "all": times,
                   "runs": len(res.runs), "touched": len(res.touched), "errors": len(errors),
                   "per_run": med / max(1, len(res.runs)),
                   "affected": int(sum(r.count for r in res.runs)),
                   "affected_per_run": [int(min(r.count for r in res.runs)),
                                        int(max(r.count for r in res.runs))] if res.runs else [0, 0]}
            if errors:
                row["first_error"] = errors[0].error
            if baseline and engine is None:
                uses = [(r.run_id, r.input) for r in res.runs]
                bmed, counts = time_trace_loop(st, uses, cells, max(1, min(repeats, 3)))
                row["trace_loop"] = bmed
                row["vs_trace_loop"] = med / bmed if bmed else None
                row["same_as_traces"] = all(counts.get(r.run_id) == r.count for r in res.runs)
                if not row["same_as_traces"]:
                    raise SystemExit(f"impact {label}: answers differ from per-run traces")
            out[key] = row
            log(f"    {key}: {med:.3f} s over {row['runs']} runs ({1e3 * row['per_run']:.1f} ms/run), "
                f"{row['touched']} touched, {row['affected']} cells affected"
                + (f"; per-run trace loop {row['trace_loop']:.3f} s" if "trace_loop" in row else ""))
    return out


def cli_impact(store: Path, what: str, cells: str, repeats: int) -> dict:
    """``subzero impact --input WHAT --cells CELLS --json`` end to end (process start,
    imports, query, JSON); median wall seconds and the runs it answered."""
    exe = Path(sys.executable).parent / "subzero"
    cmd = [str(exe), "impact", "--store", str(store), "--input", what, "--cells", cells, "--json"]
    times, runs = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:], "command": " ".join(cmd[1:])}
        runs = len(json.loads(p.stdout)["runs"])
    return {"seconds": statistics.median(times), "runs": runs, "json_bytes": len(p.stdout),
            "command": "subzero " + " ".join(cmd[1:]).replace(str(store), "STORE")
            .replace(str(store.parent), "DIR").replace(str(ROOT) + os.sep, "")}


def cli_trace(store: Path, run_id: int, start: str, cells: str, to: str, repeats: int) -> dict:
    exe = Path(sys.executable).parent / "subzero"
    cmd = [str(exe), "trace", "--store", str(store), "--run", str(run_id), "--from", start,
           "--cells", cells, "--to", to, "--json"]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    return {"seconds": statistics.median(times),
            "command": "subzero " + " ".join(cmd[1:]).replace(str(store), "STORE").replace(str(store.parent), "DIR")}


# --- one workload at one size ------------------------------------------------------------------

def workload(kind: str, size, ns: list[int], a, results: list[dict]) -> None:
    """Grow one store through ``ns`` night runs, measuring at each N; then add
    ``a.unrelated`` x the last N unrelated runs and measure again."""
    label = f"astronomy {size:g} Mpix" if kind == "astro" else f"genomics {size}x"
    folder = Path(a.workdir) / (f"astro-{size:g}mp" if kind == "astro" else f"genomics-{size}x")
    store_path = folder / "store"
    folder.mkdir(parents=True, exist_ok=True)
    st = subzero.open_store(store_path)
    if kind == "astro":
        flat = calibration(size)["flat"]
        flat_file = folder / "flat.npy"
        if not flat_file.exists():
            np.save(flat_file, flat)
        what, cli_what = flat, str(flat_file)
        col = int(a.column)
        queries = {"one-column flat defect": f":,{col}", "10x10 box": "1000:1010,300:310"}
        first_run = ("astro", str(store_path), size, 0)
    else:
        what = cli_what = str(GENOMICS_MATRIX)
        queries = {"3 patients' values": "1:,4:7"}
        first_run = ("genomics", str(store_path), size, 0)
    digest = st.digest_of(what)
    night, others = census(st, digest)
    log(f"[{label}] store {store_path}: {len(night)} night runs, {len(others)} other runs")
    for n in ns if not a.paired_only else []:
        need = n - len(night)
        if need > 0:
            tasks = [(*first_run[:3], len(night) + k) for k in range(need)]
            times = build(tasks, a.jobs, f"{label}, night to {n}")
            build_rate = statistics.median(times)
        else:
            build_rate = None
        night, others = census(st, digest)
        if len(night) != n:
            log(f"[{label}] the store has {len(night)} night runs, not {n}: measuring {len(night)}")
        rec = measure(st, store_path, label, kind, size, what, cli_what, queries, night, others, a,
                      unrelated_phase=False)
        rec["build_seconds_per_run"] = build_rate
        results.append(rec)
    if a.unrelated > 0 and ns:
        want = a.unrelated * len(night)
        need = want - len(others)
        if need > 0:
            start = max([0] + [r.id for r in st.runs()]) * 10   # fresh seeds for fresh content
            build([("unrelated", str(store_path), start + k) for k in range(need)], a.jobs,
                  f"{label}, unrelated to {want}")
        night, others = census(st, digest)
        if not a.paired_only:
            results.append(measure(st, store_path, label, kind, size, what, cli_what, queries, night,
                                   others, a, unrelated_phase=True))
        log(f"[{label}] alternating: {len(night)} night runs alone vs with {len(others)} unrelated runs")
        wo = subzero.open_store(twin_without(store_path, night, folder / "without"))
        results.append({"workload": kind, "label": label, "size": size, "n": len(night),
                        "unrelated": len(others), "phase": "paired", "command": a.command,
                        "machine": machine(), "load": os.getloadavg()[0],
                        "when": time.strftime("%Y-%m-%d %H:%M"),
                        "paired": paired(wo, st, what, queries, a.repeats)})
        wo.close()
    st.close()


def measure(st, store_path, label, kind, size, what, cli_what, queries, night, others, a,
            unrelated_phase: bool) -> dict:
    log(f"[{label}] measuring: {len(night)} night runs, {len(others)} unrelated runs")
    t0 = time.perf_counter()
    ib = input_bytes(st, night)
    log(f"    inputs: {ib['on_disk'] / 1e6:.1f} MB on disk vs {ib['copies'] / 1e6:.1f} MB as copies "
        f"(shared inputs: {ib['shared_on_disk'] / 1e6:.1f} vs {ib['shared_copies'] / 1e6:.1f} MB; "
        f"{time.perf_counter() - t0:.1f} s to measure)")
    rec = {"workload": kind, "label": label, "size": size, "n": len(night), "unrelated": len(others),
           "phase": "unrelated" if unrelated_phase else "night", "inputs": ib,
           "queries": measure_queries(st, what, queries, a.repeats, baseline=not unrelated_phase),
           "command": a.command, "machine": machine(),
           "store_bytes": _du(Path(store_path), set()), "when": time.strftime("%Y-%m-%d %H:%M"),
           "load": os.getloadavg()[0]}
    if (unrelated_phase or a.cli_every) and not a.no_cli:
        # the smallest answer (the box; a column's --json lists every affected cell: 26 million at 200 runs)
        qlabel, cells = list(queries.items())[-1]
        rec["cli_impact"] = cli_impact(Path(store_path), cli_what, cells, a.cli_repeats)
        log(f"    CLI impact: {rec['cli_impact']}")
        name = "flat" if kind == "astro" else "matrix"
        to = "stars" if kind == "astro" else "validate"
        rec["cli_trace"] = cli_trace(Path(store_path), night[0], name, cells, to, a.cli_repeats)
        log(f"    CLI trace of one run: {rec['cli_trace']}")
    return rec


def twin_without(store_path: Path, night: list[int], dest: Path) -> Path:
    """A store of the night runs alone, beside ``store_path``: their run folders hard-linked
    (runs are never rewritten: no bytes copied), the store's identity copied, and a catalog
    rebuilt from the runs' signed records by ``subzero.fsck``.  Queries then alternate
    between this store and the one with the unrelated runs, so the machine's load falls
    on both alike."""
    if (dest / "catalog.sqlite").exists():
        have = sorted(int(p.name) for p in (dest / "runs").iterdir() if p.name.isdigit())
        if have == sorted(night):
            return dest
        shutil.rmtree(dest)                 # the night grew since: a new twin (links only)
    (dest / "runs").mkdir(parents=True, exist_ok=True)
    (dest / "store.json").write_bytes((store_path / "store.json").read_bytes())
    for rid in night:
        if not (dest / "runs" / str(rid)).exists():
            subprocess.run(["cp", "-al", str(store_path / "runs" / str(rid)), str(dest / "runs" / str(rid))],
                           check=True)
    left = [f for f in subzero.fsck(dest) if getattr(f, "repaired", True) is False]
    if left:
        log(f"    fsck of the twin left {len(left)} finding(s) unrepaired: {left[:2]}")
    return dest


def paired(st_without, st_with, what, queries: dict[str, str], repeats: int) -> dict:
    """Each query on the store without and the store with the unrelated runs, alternating
    (without, with, without, ...); the median of the per-pair ratios."""
    out = {}
    for label, cells in queries.items():
        for st in (st_without, st_with):
            st.impact(what, cells)
        wo, wi, ratios, n = [], [], [], None
        for _ in range(repeats):
            for st, keep in ((st_without, wo), (st_with, wi)):
                t0 = time.perf_counter()
                res = st.impact(what, cells)
                keep.append(time.perf_counter() - t0)
                n = (n or []) + [len(res.runs)]
            ratios.append(wi[-1] / wo[-1])
        out[label] = {"without": statistics.median(wo), "with": statistics.median(wi),
                      "ratio": statistics.median(ratios), "ratios": ratios, "runs": sorted(set(n))}
        log(f"    {label}, alternating: without {out[label]['without']:.3f} s, with "
            f"{out[label]['with']:.3f} s, median ratio {out[label]['ratio']:.2f}x (runs {out[label]['runs']})")
    return out


# --- report ------------------------------------------------------------------------------------

def mb(b) -> str:
    return f"{b / 1e6:,.1f} MB"


def section(results: list[dict]) -> str:
    cmds = sorted({r["command"] for r in results})
    machines = sorted({r["machine"] for r in results})
    lines = ["## A night, not a run (issue 29): input sharing and impact across runs", "",
             "Measured by " + ("; ".join(f"`{c}`" for c in cmds)) + ", on " + "; ".join(machines)
             + " (2 cores shared with other engineers' jobs: absolute times vary between runs; "
             "the load column is the 1-minute load average when each row was measured).",
             "",
             f"Night run i of the astronomy workflow reads its own exposure pair (the two real "
             f"ImSim exposures at the given size with Gaussian noise of {NOISE_SIGMA:g} counts of "
             f"their own, seeded per run and exposure) and the same bias, dark and flat arrays "
             f"(equal content) in every run; genomics runs all read the same patient table "
             f"(its only input). Unrelated runs are runs of `workflows/example.py` on 64 x 96 "
             f"inputs of their own content. Inputs are passed as arrays to `store.run`; runs "
             f"are built with the in-process engine and the default lineage strategies.", "",
             "### Input bytes: on disk vs one copy per run", "",
             "On disk = the store's `inputs/` folder (when it has one) + each run's own input "
             "arrays (`.zarr`, `.sums.json`) and references (`.input.json`), hard links counted "
             "once; copies = every run holding its own copy of each input. Shared = inputs "
             "whose content more than one night run read (bias, dark, flat; the genomics "
             "table).", "",
             "| workload | runs | shared on disk | shared as copies | shared ratio | all inputs on disk "
             "| all as copies | ratio | target (shared <= 1/100 at 200 runs) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if r["phase"] != "night":
            continue
        ib = r["inputs"]
        tgt = ""
        if r["n"] >= 200 and ib["shared_ratio"] is not None:
            tgt = "met" if ib["shared_ratio"] <= 0.01 else "**missed**"
        lines.append(f"| {r['label']} | {r['n']} | {mb(ib['shared_on_disk'])} | {mb(ib['shared_copies'])} | "
                     f"{ib['shared_ratio']:.3f} | {mb(ib['on_disk'])} | {mb(ib['copies'])} | "
                     f"{ib['ratio']:.3f} | {tgt} |")
    lines += ["", "### Impact queries", "",
              "`store.impact(input, cells)` to the workflow's outputs (astronomy: `stars`; "
              "genomics: `validate`), in-process, median of the repeats after a warm-up call; "
              "per run = total / runs found. Baseline: a loop of `run.trace` per run over the "
              "same runs and cells in the same process (answers checked equal); `impact` also "
              "gives each answer's bounding box and sky/label region (`TraceResult.where`), which "
              "the loop does not ask for.", "",
              "| workload | query | runs | unrelated runs | total | per run | touched | cells affected "
              "(per run) | trace loop | impact / loop | load |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for q, row in r.get("queries", {}).items():
            lo, hi = row["affected_per_run"]
            per = f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"
            loop = f"{row['trace_loop']:.3f} s" if "trace_loop" in row else ""
            ratio = f"{row['vs_trace_loop']:.2f}x" if row.get("vs_trace_loop") else ""
            err = f" ({row['errors']} unanswered)" if row["errors"] else ""
            lines.append(f"| {r['label']} | {q} ({row['cells_in']:,} cells) | {row['runs']}{err} | "
                         f"{r['unrelated']} | {row['seconds']:.3f} s | {1e3 * row['per_run']:.1f} ms | "
                         f"{row['touched']} | {row['affected']:,} ({per}) | {loop} | {ratio} | "
                         + (f"{r['load']:.1f} |" if "load" in r else "not recorded |"))
    # with / without unrelated runs
    pairs = []
    for r in results:
        if r["phase"] != "unrelated":
            continue
        base = [b for b in results if b["phase"] == "night" and b["label"] == r["label"] and b["n"] == r["n"]]
        if base:
            pairs.append((base[-1], r))
    if pairs or any(r["phase"] == "paired" for r in results):
        lines += ["", "### With 10x as many unrelated runs in the store", "",
                  "Sequential: the same queries on the same night runs, after the unrelated runs were "
                  "added (one after the other: the machine's load may differ between the two).", "",
                  "| workload | query | runs | unrelated | without | with | with / without |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for b, r in pairs:
            for q, row in r["queries"].items():
                if q not in b["queries"]:
                    continue
                x = row["seconds"] / b["queries"][q]["seconds"]
                lines.append(f"| {r['label']} | {q} | {r['n']} | {b['unrelated']} -> {r['unrelated']} | "
                             f"{b['queries'][q]['seconds']:.3f} s | {row['seconds']:.3f} s | {x:.2f}x |")
    pairs2 = [r for r in results if r["phase"] == "paired"]
    if pairs2:
        lines += ["", "Alternating (load-fair): the night runs alone in a twin store (their run folders "
                  "hard-linked, the catalog rebuilt by `subzero.fsck`) against the store with the "
                  "unrelated runs, queried in turn, median of the per-pair ratios.", "",
                  "| workload | query | runs | unrelated | without | with | with / without (median of pairs) "
                  "| target (<= 1.2x) | load |", "|---|---|---:|---:|---:|---:|---:|---|---:|"]
        for r in pairs2:
            for q, p in r["paired"].items():
                tgt = "met" if p["ratio"] <= 1.2 else "**missed**"
                lines.append(f"| {r['label']} | {q} | {r['n']} | 0 vs {r['unrelated']} | {p['without']:.3f} s | "
                             f"{p['with']:.3f} s | {p['ratio']:.2f}x | {tgt} | {r['load']:.1f} |")
    clis = [r for r in results if "cli_impact" in r]
    if clis:
        lines += ["", "### End to end through the CLI", "",
                  "Wall time of the command (median of repeats), process start and imports included.", "",
                  "| workload | runs | unrelated | command | wall | runs answered |", "|---|---:|---:|---|---:|---:|"]
        for r in clis:
            c = r["cli_impact"]
            if "error" in c:
                lines.append(f"| {r['label']} | {r['n']} | {r['unrelated']} | `{c.get('command', '')}` | "
                             f"error: {c['error']} | |")
            else:
                lines.append(f"| {r['label']} | {r['n']} | {r['unrelated']} | `{c['command']}` | "
                             f"{c['seconds']:.2f} s | {c['runs']}"
                             + (f" ({mb(c['json_bytes'])} of JSON)" if "json_bytes" in c else "") + " |")
            for c in r.get("cli_impact_more", []):
                lines.append(f"| {r['label']} | {r['n']} | {r['unrelated']} | `{c['command']}` | "
                             f"{c['seconds']:.2f} s | {c['runs']} ({mb(c['json_bytes'])} of JSON) |")
            t = r.get("cli_trace", {})
            if "seconds" in t:
                lines.append(f"| {r['label']} | 1 | {r['unrelated']} | `{t['command']}` | "
                             f"{t['seconds']:.2f} s | 1 |")
    # targets
    lines += ["", "### Targets (issue 29)", ""]
    lines += targets(results)
    lines += ["", "![impact time vs runs, with and without unrelated runs; input bytes](night.png)"]
    return "\n".join(lines)


def targets(results: list[dict]) -> list[str]:
    out = []
    a1 = [r for r in results if r["workload"] == "astro" and r["size"] == 1 and r["phase"] == "night"]
    big = max(a1, key=lambda r: r["n"], default=None)
    if big is None:
        return ["- not measured here: no astronomy night at 1 Mpix."]
    for q, row in big["queries"].items():
        mark = "met" if row["seconds"] < 2.0 else "**missed**"
        out.append(f"- impact over {big['n']} runs at 1 Mpix under 2 s in-process: {q} "
                   f"{row['seconds']:.3f} s -- {mark}" + ("" if big["n"] >= 200 else
                                                         f" (measured at {big['n']} runs, not 200)"))
    u = [r for r in results if r["workload"] == "astro" and r["size"] == 1 and r["phase"] == "unrelated"
         and r["n"] == big["n"]]
    pr = [r for r in results if r["workload"] == "astro" and r["size"] == 1 and r["phase"] == "paired"
          and r["n"] == big["n"]]
    if pr:
        for q, p in pr[-1]["paired"].items():
            out.append(f"- with {pr[-1]['unrelated']} unrelated runs, at most 1.2x as long (alternating): {q} "
                       f"{p['ratio']:.2f}x -- {'met' if p['ratio'] <= 1.2 else '**missed**'}"
                       + ("" if big["n"] >= 200 else f" (at {big['n']} runs, not 200)"))
    elif u:
        for q, row in u[-1]["queries"].items():
            if q in big["queries"]:
                x = row["seconds"] / big["queries"][q]["seconds"]
                out.append(f"- with {u[-1]['unrelated']} unrelated runs, at most 1.2x as long: {q} "
                           f"{x:.2f}x -- {'met' if x <= 1.2 else '**missed**'}"
                           + ("" if big["n"] >= 200 else f" (at {big['n']} runs, not 200)"))
    else:
        out.append("- with 10x unrelated runs: not measured at this N")
    sr = big["inputs"]["shared_ratio"]
    if sr is not None:
        out.append(f"- shared inputs stored once, at most 1/100 of the copies for {big['n']} runs: "
                   f"{sr:.3f} ({mb(big['inputs']['shared_on_disk'])} vs "
                   f"{mb(big['inputs']['shared_copies'])}) -- "
                   f"{'met' if sr <= 0.01 else '**missed**'}"
                   + ("" if big["n"] >= 200 else f" (at {big['n']} runs, not 200)"))
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    labels = sorted({r["label"] for r in results})
    colors = dict(zip(labels, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    qmark = {}
    for lab in labels:
        rs = sorted([r for r in results if r["label"] == lab and r["phase"] == "night"], key=lambda r: r["n"])
        us = [r for r in results if r["label"] == lab and r["phase"] == "paired"]
        qs = list(rs[0]["queries"]) if rs else []
        for q in qs:
            m = qmark.setdefault(q, "osD^v<>"[len(qmark) % 7])
            xs = [r["n"] for r in rs if q in r["queries"]]
            axes[0].plot(xs, [r["queries"][q]["seconds"] for r in rs if q in r["queries"]],
                         marker=m, color=colors[lab], label=f"{lab}: {q}")
            axes[1].plot(xs, [1e3 * r["queries"][q]["per_run"] for r in rs if q in r["queries"]],
                         marker=m, color=colors[lab])
            for u in us:            # alternating: with (hollow) and the night alone (small, black)
                if q in u["paired"]:
                    p = u["paired"][q]
                    for key, style in (("with", {"mfc": "none", "ms": 11, "color": colors[lab]}),
                                       ("without", {"ms": 4, "color": "k"})):
                        axes[0].plot([u["n"]], [p[key]], marker=m, ls="none", **style)
                        axes[1].plot([u["n"]], [1e3 * p[key] / u["n"]], marker=m, ls="none", **style)
        xs = [r["n"] for r in rs]
        axes[2].plot(xs, [r["inputs"]["shared_copies"] for r in rs], "--", marker="o", color=colors[lab],
                     label=f"{lab}: shared, as copies")
        axes[2].plot(xs, [max(1, r["inputs"]["shared_on_disk"]) for r in rs], "-", marker="o",
                     color=colors[lab], label=f"{lab}: shared, on disk")
        axes[2].plot(xs, [r["inputs"]["on_disk"] for r in rs], ":", marker="x", color=colors[lab],
                     label=f"{lab}: all inputs, on disk")
    axes[0].axhline(2.0, color="k", lw=0.8, ls="--")
    axes[0].text(axes[0].get_xlim()[0], 2.0, " target: 2 s at 200 runs (1 Mpix)", va="bottom", fontsize=7)
    axes[0].set_title("impact query, total\n(hollow: with 10x unrelated runs, small black: without, alternating)",
                      fontsize=9)
    axes[0].set_ylabel("seconds")
    axes[1].set_title("impact query, per run found", fontsize=9)
    axes[1].set_ylabel("ms per run")
    axes[2].set_title("input bytes: on disk vs one copy per run")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("bytes")
    for ax in axes:
        ax.set_xlabel("night runs (N)")
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --- main --------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description="A night, not a run: input sharing and impact across runs")
    ap.add_argument("--quick", action="store_true",
                    help="20 runs, 200 unrelated, 1 Mpix astronomy and genomics at 1x, 3 repeats")
    ap.add_argument("--workdir", help="where the stores are kept (and reused); default a new temp folder")
    ap.add_argument("--only", choices=("astro", "genomics"), help="one workload only")
    ap.add_argument("--mpix", type=float, nargs="*", default=None, help="astronomy sizes (default 1 16)")
    ap.add_argument("--n", type=int, nargs="*", default=None, help="night sizes at 1 Mpix (default 20 100 200)")
    ap.add_argument("--n16", type=int, nargs="*", default=None,
                    help="night sizes at sizes above 1 Mpix (default 20)")
    ap.add_argument("--genomics-n", type=int, nargs="*", default=None, help="default: as --n")
    ap.add_argument("--replicate", type=int, default=None, help="genomics replication (default 100)")
    ap.add_argument("--unrelated", type=int, default=10, help="unrelated runs per night run (0: none)")
    ap.add_argument("--column", type=int, default=200, help="the flat's defective column")
    ap.add_argument("--repeats", type=int, default=None, help="impact repeats (default 5, quick 3)")
    ap.add_argument("--cli-repeats", type=int, default=3)
    ap.add_argument("--cli-every", action="store_true", help="CLI timings at every N, not only at the end")
    ap.add_argument("--paired-only", action="store_true",
                    help="only the alternating with/without-unrelated measurement on existing stores")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI timings")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes building runs")
    ap.add_argument("--add", action="store_true", help="keep the records of earlier invocations")
    ap.add_argument("--no-write", action="store_true", help="leave RESULTS.md and the plot alone")
    a = ap.parse_args()
    q = a.quick
    a.mpix = a.mpix if a.mpix is not None else ([1.0] if q else [1.0, 16.0])
    a.n = a.n if a.n is not None else ([20] if q else [20, 100, 200])
    a.n16 = a.n16 if a.n16 is not None else ([] if q else [20])
    a.genomics_n = a.genomics_n if a.genomics_n is not None else a.n
    a.replicate = a.replicate if a.replicate is not None else (1 if q else 100)
    a.repeats = a.repeats if a.repeats is not None else (3 if q else 5)
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="sz-night-")
    a.command = " ".join([".venv/bin/python", "benchmarks/night.py"] + sys.argv[1:])
    Path(a.workdir).mkdir(parents=True, exist_ok=True)
    log(f"night benchmark: stores under {a.workdir}")
    kept = Path(a.workdir) / "night.json"
    results: list[dict] = json.loads(kept.read_text()) if a.add and kept.exists() else []
    new: list[dict] = []

    def save() -> None:     # read again: another invocation with --add may have saved meanwhile
        now = json.loads(kept.read_text()) if a.add and kept.exists() else results
        mine = {(r["label"], r["n"], r["phase"]) for r in new}
        merged = [r for r in now if (r["label"], r["n"], r["phase"]) not in mine] + new
        kept.write_text(json.dumps(merged, indent=1, default=float))

    try:
        if a.only in (None, "astro"):
            for mpix in a.mpix:
                workload("astro", mpix, a.n if mpix <= 1 else a.n16, a, new)
                save()
        if a.only in (None, "genomics"):
            workload("genomics", a.replicate, a.genomics_n, a, new)
            save()
    finally:
        save()
    allr = json.loads(kept.read_text())
    allr.sort(key=lambda r: (r["workload"], r["size"], ("night", "unrelated", "paired").index(r["phase"]), r["n"]))
    body = section(allr)
    print(body)
    if not a.no_write:
        plot(allr, PLOT)
        update_section("night", body)
        log(f"wrote the night section of {os.path.relpath(Path(__file__).parent / 'RESULTS.md')} "
            f"and {os.path.relpath(PLOT)}")


if __name__ == "__main__":
    main()
