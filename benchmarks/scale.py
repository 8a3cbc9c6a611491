"""Scale (issue 12): the LSST workflow on the real amplifier tiled to 1, 4, 16 and
64 megapixels (``workflows/astronomy.py``'s ``megapixels``), in-process engine,
default strategies, and the DuckDB peer of ``peer.py`` side by side.

Per size, each measurement runs in a fresh child process (so its peak memory,
``ru_maxrss``, is its own and a size that does not fit fails alone):

- ``plain``: a run with no lineage -- time, peak memory;
- ``subzero``: a run with the default strategies -- time, peak memory, lineage
  bytes; then, with an empty block cache each time, a star's peak pixel traced
  back to ``raw_1`` for ~10 stars (median, max), a forward 10x10 box ``raw_1 ->
  stars``, and FQ0 / FQ0Slow (a raw_1 box forward to ``rmoverscan_1`` with and
  without the entire-array short-cut);
- ``blackbox``: a run with every operator on the black-box strategy, and star
  traces by re-execution;
- ``peer``: the complete lineage captured (every operator on ``full``) and loaded
  into DuckDB -- capture and load time, bytes on disk -- and the same queries
  by joins.  Every answer of the black-box run and of the peer is checked
  equal to SubZero's (the benchmark stops on a mismatch).

    .venv/bin/python benchmarks/scale.py [--sizes 1 4 16 64] [--quick] [--stars 10] [--no-write]

Results: ``benchmarks/.work/scale.json``, the plot ``benchmarks/scale.png`` and
(without ``--no-write``) a section of RESULTS.md.

``--box-threads R`` adds, in the black-box child after its star traces, R rounds
of each star traced twice, alternated: with native thread pools (OpenMP, BLAS) on
one thread in box re-runs, as SubZero runs them (``subzero.query.threads``), and
left with all their threads, as before that (the median of each is printed and
kept in the JSON as ``star_one_s`` / ``star_all_s``).

``--kinds subzero blackbox`` measures only those children (the black-box star
traces need the ``subzero`` child's answers to check against): a focused run
whose table is printed and kept in ``benchmarks/.work/scale-kinds.json``, while
RESULTS.md's section, the plot and ``scale.json`` (which need every kind) are
left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
from _common import command_line, machine, run_child, update_section  # noqa: E402

HERE = Path(__file__).resolve().parent
FORWARD_BOX = ((1000, 200), (1010, 210))     # raw_1 -> stars
FQ0_BOX = ((100, 0), (110, 10))              # raw_1 -> rmoverscan_1 (the paper's FQ0)
KINDS = ("plain", "subzero", "blackbox", "peer")


# -- the children: one measurement each ------------------------------------------------------------
def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9    # Linux: KiB


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _box(lo, hi) -> np.ndarray:
    from subzero.model.cells import box
    return box(lo, hi)


def child(kind: str, mp: float, folder: Path, n_stars: int, n_blackbox: int,
          box_threads: int = 0) -> dict:
    import subzero
    from subzero.workflows import astronomy

    wf = astronomy.workflow(megapixels=mp)
    if kind == "peer":
        return child_peer(wf, folder)
    st = subzero.open_store(folder / f"store-{kind}")
    try:
        if kind == "plain":
            _, sec = _timed(lambda: st.run(wf, capture=False, progress=False))
            return {"run_s": sec, "peak_gb": _peak_gb()}
        strat = {n: "blackbox" for n in wf.steps} if kind == "blackbox" else None
        run, sec = _timed(lambda: st.run(wf, strategies=strat, progress=False))
        out = {"run_s": sec, "peak_gb": _peak_gb(), "lineage_bytes": run.lineage_bytes(),
               "shape": list(run.shapes()["raw_1"])}
        ex = run.executor()

        def trace(start, cells, to, shortcut=True):
            ex.clear_cache()
            res, s = _timed(lambda: run.trace(start, cells, to=to, shortcut=shortcut, record=False))
            return res.cells, s

        if kind == "subzero":
            stars = pick_stars(run, n_stars)
            answers: dict[str, np.ndarray] = {"stars": stars}
            times = []
            for k, cell in enumerate(stars):
                answers[f"star{k}"], s = trace("stars", [tuple(cell)], "raw_1")
                times.append(s)
            answers["forward"], out["forward_s"] = trace("raw_1", _box(*FORWARD_BOX), "stars")
            answers["fq0"], out["fq0_s"] = trace("raw_1", _box(*FQ0_BOX), "rmoverscan_1")
            slow, out["fq0slow_s"] = trace("raw_1", _box(*FQ0_BOX), "rmoverscan_1", shortcut=False)
            check(slow, answers["fq0"], "FQ0Slow", "FQ0")
            out.update(star_s=times, star_cells=[len(answers[f"star{k}"]) for k in range(len(stars))],
                       forward_cells=len(answers["forward"]), fq0_cells=len(answers["fq0"]))
            np.savez(folder / "answers.npz", **answers)
        else:                   # blackbox: star traces by re-execution, checked against SubZero's
            answers = dict(np.load(folder / "answers.npz"))
            times = []
            for k, cell in enumerate(answers["stars"][:n_blackbox]):
                got, s = trace("stars", [tuple(cell)], "raw_1")
                check(got, answers[f"star{k}"], f"black-box star {k}", "SubZero")
                times.append(s)
            out["star_s"] = times
            if box_threads:
                out.update(compare_box_threads(trace, answers, n_blackbox, box_threads))
        return out
    finally:
        st.close()


def compare_box_threads(trace, answers: dict, n: int, rounds: int) -> dict:
    """Each star traced with box re-runs on one native thread (SubZero's way) and with
    every thread (SERIAL_BOX_CELLS below every box), alternated, ``rounds`` times."""
    from subzero.query import threads
    one = threads.SERIAL_BOX_CELLS
    got: dict[str, list[float]] = {"star_one_s": [], "star_all_s": []}
    for _ in range(rounds):
        for k, cell in enumerate(answers["stars"][:n]):
            for key, limit in (("star_all_s", -1), ("star_one_s", one)):
                threads.SERIAL_BOX_CELLS = limit
                try:
                    cells, s = trace("stars", [tuple(cell)], "raw_1")
                finally:
                    threads.SERIAL_BOX_CELLS = one
                check(cells, answers[f"star{k}"], f"black-box star {k}", "SubZero")
                got[key].append(s)
    return got


def child_peer(wf, folder: Path) -> dict:
    from peer import Peer, capture_full

    answers = dict(np.load(folder / "answers.npz"))
    peer = Peer(folder / "peer.duckdb")
    try:
        load_s = 0.0

        def sink(name, pairs):       # each operator's pairs into DuckDB as soon as it has run
            nonlocal load_s
            _, s = _timed(lambda: peer.add(name, pairs))
            load_s += s
        _, cap_s = capture_full(wf, {n: np.asarray(load(wf, n)) for n in wf.inputs}, sink)
        _, s = _timed(peer.checkpoint)
        load_s += s
        out = {"capture_s": cap_s, "load_s": load_s, "bytes": peer.bytes_on_disk(), "peak_gb": _peak_gb()}
        times = []
        for k, cell in enumerate(answers["stars"]):
            got, s = _timed(lambda c=cell: peer.trace("stars", [tuple(c)], "raw_1"))
            check(got, answers[f"star{k}"], f"peer star {k}", "SubZero")
            times.append(s)
        out["star_s"] = times
        got, out["forward_s"] = _timed(lambda: peer.trace("raw_1", _box(*FORWARD_BOX), "stars"))
        check(got, answers["forward"], "peer forward box", "SubZero")
        got, out["fq0_s"] = _timed(lambda: peer.trace("raw_1", _box(*FQ0_BOX), "rmoverscan_1"))
        check(got, answers["fq0"], "peer FQ0", "SubZero")
        return out
    finally:
        peer.close()


def load(wf, name: str):
    """An input's value as a run loads it (a path is read, a tiled input built)."""
    from subzero.storage.inputs import load_path
    d = wf.resolve_default(name)
    return load_path(d, name) if isinstance(d, (str, os.PathLike)) else d


def pick_stars(run, n: int) -> np.ndarray:
    """The peak pixel (brightest in ``rmcr``) of ``n`` stars spread over the label range."""
    from scipy import ndimage
    labels = np.asarray(run.array("stars").values)
    ids = np.unique(labels[labels > 0])
    ids = ids[np.unique(np.linspace(0, len(ids) - 1, min(n, len(ids))).round().astype(int))]
    peaks = ndimage.maximum_position(np.asarray(run.array("rmcr").values), labels, ids)
    return np.asarray(peaks, np.int64).reshape(-1, 2)


class Mismatch(common.Mismatch):
    """Two ways of tracing gave different answers."""


def check(got, want, what: str, against: str) -> None:
    from peer import same_cells
    if not same_cells(np.asarray(got), np.asarray(want)):
        raise Mismatch(f"MISMATCH: {what} answers {len(got)} cells, {against} {len(want)}")


def child_main(a) -> None:
    folder = Path(a.folder)
    common.child_main(lambda: child(a.child, a.megapixels, folder, a.stars, a.blackbox_stars,
                                    a.box_threads), folder / f"{a.child}.json")


# -- the parent ------------------------------------------------------------------------------------
def measure(kind: str, mp: float, folder: Path, a) -> dict:
    """Run one child; a child that dies (killed, out of memory) is reported, not fatal."""
    res_file = folder / f"{kind}.json"
    res_file.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", kind, "--megapixels", str(mp), "--folder", str(folder),
           "--stars", str(a.stars), "--blackbox-stars", str(a.blackbox_stars),
           "--box-threads", str(a.box_threads)]
    res, wall = run_child(cmd, res_file, f"{mp} Mpix, {kind}")
    res["wall_s"] = wall
    return res


def summarise(r: dict) -> dict:
    """Derived numbers of one size (None where a child failed)."""
    p, s, b, q = (r.get(k, {}) for k in KINDS)
    ok = {k: "error" not in r.get(k, {"error": 1}) for k in KINDS}
    out: dict = {"ok": ok}
    if ok["subzero"]:
        out["star_med_ms"] = statistics.median(s["star_s"]) * 1000
        out["star_max_ms"] = max(s["star_s"]) * 1000
        out["forward_ms"] = s["forward_s"] * 1000
        out["fq0_speedup"] = s["fq0slow_s"] / s["fq0_s"]
    if ok["plain"] and ok["subzero"]:
        out["runtime_ratio"] = s["run_s"] / p["run_s"]
    if ok["blackbox"]:
        out["blackbox_med_s"] = statistics.median(b["star_s"])
        out["blackbox_max_s"] = max(b["star_s"])
    if ok["peer"] and ok["subzero"]:
        out["peer_star_ratio"] = statistics.median(q["star_s"]) / statistics.median(s["star_s"])
        out["peer_forward_ratio"] = q["forward_s"] / s["forward_s"]
        out["peer_fq0_ratio"] = q["fq0_s"] / s["fq0_s"]
        out["peer_bytes_ratio"] = q["bytes"] / max(s["lineage_bytes"], 1)
        out["peer_capture_ratio"] = (q["capture_s"] + q["load_s"]) / s["run_s"]
    return out


def _f(x, fmt: str, scale: float = 1.0) -> str:
    return "—" if x is None else format(x * scale, fmt)


def table(results: dict) -> list[str]:
    head = ("| Mpix | shape | run no lineage | run lineage | ratio | peak GB (no lin. / lin.) | lineage MB "
            "| star ms (med / max) | fwd box ms | black-box star s (med / max) | FQ0 / FQ0Slow ms | short-cut "
            "| peer capture+load s | peer MB | peer star ms | peer / SZ: star, fwd, FQ0, bytes | size took |")
    lines = [head, "|" + "|".join([" ---: "] * (head.count("|") - 1)) + "|"]
    for mp, r in results.items():
        p, s, b, q = (r.get(k, {}) for k in KINDS)
        d = summarise(r)

        def err(x):
            return x.get("error", "failed")[:40] if x else "not measured"
        cells = [f"{mp:g}", "x".join(map(str, s.get("shape", []))) or "—",
                 _f(p.get("run_s"), ".1f") + " s" if "run_s" in p else err(p),
                 _f(s.get("run_s"), ".1f") + " s" if "run_s" in s else err(s),
                 _f(d.get("runtime_ratio"), ".2f") + "x" if "runtime_ratio" in d else "—",
                 f"{_f(p.get('peak_gb'), '.2f')} / {_f(s.get('peak_gb'), '.2f')}",
                 _f(s.get("lineage_bytes"), ".3f", 1e-6),
                 f"{_f(d.get('star_med_ms'), '.1f')} / {_f(d.get('star_max_ms'), '.1f')}",
                 _f(d.get("forward_ms"), ".1f"),
                 f"{_f(d.get('blackbox_med_s'), '.2f')} / {_f(d.get('blackbox_max_s'), '.2f')}"
                 if "star_s" in b else err(b),
                 f"{_f(s.get('fq0_s'), '.1f', 1e3)} / {_f(s.get('fq0slow_s'), '.1f', 1e3)}",
                 _f(d.get("fq0_speedup"), ".0f") + "x" if "fq0_speedup" in d else "—",
                 (f"{q['capture_s']:.1f}+{q['load_s']:.1f}" if "capture_s" in q else err(q)),
                 _f(q.get("bytes"), ".1f", 1e-6),
                 _f(statistics.median(q["star_s"]) * 1000 if "star_s" in q else None, ".1f"),
                 ", ".join(_f(d.get(k), ".0f") + "x" for k in ("peer_star_ratio", "peer_forward_ratio",
                                                              "peer_fq0_ratio", "peer_bytes_ratio")),
                 f"{r['took_s']:.0f} s"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mps = list(results)

    def series(fn):
        xs, ys = [], []
        for mp in mps:
            try:
                v = fn(results[mp])
            except (KeyError, TypeError, ValueError):
                continue
            xs.append(mp)
            ys.append(v)
        return xs, ys

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    med = statistics.median
    for label, fn in [("SubZero star trace (median)", lambda r: med(r["subzero"]["star_s"]) * 1e3),
                      ("SubZero star trace (max)", lambda r: max(r["subzero"]["star_s"]) * 1e3),
                      ("SubZero forward box", lambda r: r["subzero"]["forward_s"] * 1e3),
                      ("SubZero FQ0", lambda r: r["subzero"]["fq0_s"] * 1e3),
                      ("peer star trace (median)", lambda r: med(r["peer"]["star_s"]) * 1e3),
                      ("peer forward box", lambda r: r["peer"]["forward_s"] * 1e3),
                      ("black-box star trace", lambda r: med(r["blackbox"]["star_s"]) * 1e3)]:
        axes[0].plot(*series(fn), marker="o", label=label)
    axes[0].set_title("query latency (cold block cache)")
    axes[0].set_ylabel("ms")
    for label, fn in [("no lineage", lambda r: r["plain"]["peak_gb"]),
                      ("SubZero", lambda r: r["subzero"]["peak_gb"]),
                      ("peer capture+load", lambda r: r["peer"]["peak_gb"])]:
        axes[1].plot(*series(fn), marker="o", label=label)
    axes[1].set_title("peak memory of the run (GB)")
    for label, fn in [("SubZero lineage", lambda r: r["subzero"]["lineage_bytes"] / 1e6),
                      ("peer DuckDB file", lambda r: r["peer"]["bytes"] / 1e6)]:
        axes[2].plot(*series(fn), marker="o", label=label)
    axes[2].set_title("lineage on disk (MB)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("megapixels")
        ax.set_xticks(mps, [f"{m:g}" for m in mps])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description="SubZero scale benchmark (issue 12)")
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64], help="megapixels")
    ap.add_argument("--quick", action="store_true", help="3 stars, 1 black-box star trace")
    ap.add_argument("--stars", type=int, default=10)
    ap.add_argument("--blackbox-stars", type=int, default=3)
    ap.add_argument("--box-threads", type=int, default=0, metavar="R",
                    help="R more rounds of black-box star traces, box re-runs on one native "
                         "thread and on all, alternated")
    ap.add_argument("--no-write", action="store_true", help="leave RESULTS.md alone")
    ap.add_argument("--add", action="store_true",
                    help="keep the other sizes of the last results (benchmarks/.work/scale.json)")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                    help="measure only these children (a subset leaves RESULTS.md, the plot and "
                         "scale.json alone; blackbox and peer need subzero)")
    ap.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--megapixels", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child_main(a)
    if a.quick:
        a.stars, a.blackbox_stars = min(a.stars, 3), 1
    focused = set(a.kinds) != set(KINDS)
    if focused and not {"blackbox", "peer"}.isdisjoint(a.kinds) and "subzero" not in a.kinds:
        ap.error("--kinds: blackbox and peer check their answers against subzero's; add subzero")
    if focused and a.add:
        ap.error("--add keeps the sizes of a run of every kind; not with --kinds")
    work = Path(tempfile.mkdtemp(prefix="sz-scale-"))
    results: dict = {}
    last = HERE / ".work" / "scale.json"
    if a.add and last.is_file():     # earlier sizes, each measured whole in its own invocation
        for k, r in json.loads(last.read_text())["sizes"].items():
            if float(k) not in a.sizes:
                r.pop("summary", None)
                results[float(k)] = r
    try:
        for mp in a.sizes:
            folder = work / f"{mp:g}"
            folder.mkdir()
            t0 = time.perf_counter()
            r: dict = {}
            for kind in (k for k in KINDS if k in a.kinds):
                if kind in ("blackbox", "peer") and "error" in r["subzero"]:
                    r[kind] = {"error": "skipped: the SubZero run failed"}
                    continue
                r[kind] = measure(kind, mp, folder, a)
                print(f"{mp:g} Mpix {kind}: " + ("FAILED " + r[kind]["error"] if "error" in r[kind] else
                                                 f"{r[kind]['wall_s']:.0f} s"), file=sys.stderr, flush=True)
            r["took_s"] = time.perf_counter() - t0
            r["command"] = command_line()
            results[mp] = r
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = dict(sorted(results.items()))
    commands = sorted({r.get("command", command_line()) for r in results.values()})
    lines = table(results)
    print("\n".join(lines))
    for mp, r in results.items():
        b = r.get("blackbox", {})
        if b.get("star_one_s"):
            print(f"{mp:g} Mpix black-box star trace, {a.box_threads} alternated rounds: box re-runs "
                  f"on one native thread median {statistics.median(b['star_one_s']):.2f} s (max "
                  f"{max(b['star_one_s']):.2f}), on every thread median "
                  f"{statistics.median(b['star_all_s']):.2f} s (max {max(b['star_all_s']):.2f})")
    (HERE / ".work").mkdir(exist_ok=True)
    if focused:
        (HERE / ".work" / "scale-kinds.json").write_text(json.dumps(
            {"command": command_line(), "machine": machine(), "kinds": a.kinds,
             "sizes": {f"{mp:g}": {**r, "summary": summarise(r)} for mp, r in results.items()}},
            indent=1))
        return
    (HERE / ".work" / "scale.json").write_text(json.dumps(
        {"command": command_line(), "machine": machine(),
         "sizes": {f"{mp:g}": {**r, "summary": summarise(r)} for mp, r in results.items()}}, indent=1))
    plot(results, HERE / "scale.png")
    if not a.no_write:
        update_section("scale", "\n".join(
            ["## Scale (issue 12)", "", "Commands: " + "; ".join(f"`{c}`" for c in commands) + f" — machine: {machine()}.", "",
             "The LSST workflow on the real amplifier tiled to each size (`workflow(megapixels=N)`), in-process "
             "engine, default strategies; every measurement in a fresh child process (peak memory = its "
             "`ru_maxrss`). Star traces: a star's peak pixel back to `raw_1`, empty block cache, "
             f"{a.stars} stars; black-box: every operator on `blackbox`, {a.blackbox_stars} stars. The peer: "
             "the complete lineage (every operator on `full`) in DuckDB, one table per operator side, sorted "
             "by cell, traced with joins along the same DAG paths; every peer and black-box answer was "
             "checked equal to SubZero's. `peer / SZ` = the peer's latency (or bytes) over SubZero's.",
             "", "![scale](scale.png)", ""] + lines))


if __name__ == "__main__":
    main()
