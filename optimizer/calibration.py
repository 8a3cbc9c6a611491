"""The calibration benchmark: fits the cost model's coefficients on this machine,
and measures how far the fitted model can be trusted.

It runs a small synthetic workflow whose operators write region pairs of four
shapes (one output cell from a 3x3 window, 4x4 tiles from 8x8 windows, 32x32
tiles from 48x48 windows, and 65,536 small pairs of 2x2 cells a side), stores
every encoding and direction of Full, Pay and Comp lineage, then traces queries
of 1, 64, 2048 and 16384 scattered cells and 32x32 and 96x96 boxes (a quarter
of the array, scattered and as a box, for the small pairs) through every method
— stored lineage with the matched and the mismatched index, mapping functions,
re-execution — with the real executor.  The cost model's features for each
observed step (computed by the same code that prices real workflows) are fit to
the observed seconds by non-negative least squares on relative errors, one
coefficient set per way of reading (``costmodel.STORED_FAMILIES``, mapping,
re-execution).  The fitted model's errors on those steps, by kind and size, are
the **error model** (``costmodel.error_table``) the optimizer and the
query-time planner use to decide how far to trust a prediction.  R-tree bulk
loads are timed separately: they slow down as the file grows, which a sample
cannot show.

Every timing is CPU seconds where the work is CPU work (the wall clock when it is
lower: threads), the median of several, so a calibration made while other
processes share the cores prices steps as they cost on a quiet machine; a probe
before and after (``busy.py``) records how busy the machine was, and a busy one
gets a one-line warning.  The fitted model still prices one operator's lineage by
the synthetic lineage's decode rates; the profiler's reads of each operator's own
sample correct that (``sampleread.py``, ``CostModel.own_factor``).

The result is stored in the catalog per host and reused until ``subzero optimize
--recalibrate`` (or a new cost model version).  A calibration made on a quiet
machine is also kept in the user's cache (``$SUBZERO_CACHE_DIR``, else
``$XDG_CACHE_HOME/subzero``, else ``~/.cache/subzero``), so that a new store on the
same machine starts from it instead of spending half a minute calibrating again;
it is taken only for the same machine (host name, processor, cores, Python and
numpy), the same cost model and a well-formed file, else the benchmark runs.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from subzero import Mode, Operator, Workflow
from subzero.errors import StoreError, warn
from subzero.model.strategy import DIRECTIONS, ENCODINGS, Strategy
from subzero.operators import WindowComposite, box_payloads
from subzero.scratch import scratch
from subzero.tuning import (
    CALIBRATION_REPEATS,
    CAPTURE_OVERHEAD_REPEATS,
    LOAD_REPEATS,
)

from . import busy
from .costmodel import FEATURES, CostModel, error_kind, error_table, method_family
from .observers import Child, number, observe_all
from .profile import profile_workflow
from .progress import Progress, ProgressArg
from .stats import for_run, required

#: The calibration's version: a calibration of another is made again.  7: cold reads
#: decode their blocks together (``codec.unpack_concat``), which changed what stored
#: reads cost; 8: a backward payload step over pairs of their own payloads calls the
#: operator's vectorized ``map_p_pairs`` once (``relation.per_payload``), not ``map_p``
#: per payload; 9: every observation starts from a heap given back to the system
#: (``heap.release``), as each query of a ``subzero trace`` does, so that a step's price
#: includes the first touch of the memory it allocates; 10: a re-execution reads numeric
#: inputs without xarray (``ArrayStore.read_value``), which changed its cold and warm cost,
#: and the observations are made by observer processes side by side; 11: a scan tests
#: the cells it decodes against the query through a bitmap of the query's span
#: (``CellSet.contains``), which changed what a scan costs; 12: the fresh trace process
#: closes the lineage store before each trace, as ``trace --workload`` does before each
#: query, and what a trace costs beyond its steps is kept (``trace_query_s``)
VERSION = 12

#: The environment variable naming the folder of the user's cache (calibrations)
CACHE_ENV = "SUBZERO_CACHE_DIR"
#: The largest calibration file the cache holds (they are some 20 kB)
CACHE_FILE_BYTES = 1 << 22


class CalibrationPatches(WindowComposite):
    """Output tiles of ``out`` x ``out`` cells, each depending on the ``inp`` x
    ``inp`` input window around it (Full pairs, or a box payload); the
    identity mapping functions are the Map and Comp default, and every 10th
    tile is a Comp exception.  ``spin`` adds work that is not lineage.  The
    mapping functions are the built-in composite's (identity, box payloads)."""

    lineage_modes = frozenset({Mode.FULL, Mode.PAY, Mode.COMP, Mode.MAP, Mode.BLACKBOX})

    def __init__(self, out: int, inp: int, spin: int = 0):
        self.out, self.inp, self.spin = out, inp, spin

    def run(self, ctx, a):
        res = np.asarray(a, float) * 2.0 + 1.0
        for _ in range(self.spin):
            res = res + np.sort(res, axis=None).reshape(res.shape) * 0.0
        if not ctx.modes:
            return res
        shape = res.shape
        cells = np.argwhere(np.ones(shape, bool))
        ntx = -(-shape[1] // self.out)
        tile = (cells[:, 0] // self.out) * ntx + cells[:, 1] // self.out
        ntiles = int(tile.max()) + 1
        origin = np.column_stack([np.arange(ntiles) // ntx, np.arange(ntiles) % ntx]) * self.out
        lo = np.clip(origin - (self.inp - self.out) // 2, 0, None)
        hi = np.minimum(lo + self.inp, shape)
        pays = box_payloads(lo, hi)
        if Mode.FULL in ctx.modes:
            off = np.stack(np.meshgrid(np.arange(self.inp), np.arange(self.inp), indexing="ij"),
                           -1).reshape(-1, 2)
            win = lo[:, None, :] + off[None, :, :]
            ok = (win < hi[:, None, :]).all(-1)
            groups = np.repeat(np.arange(ntiles), len(off)).reshape(ntiles, -1)
            ctx.lwrite_groups(cells, tile, (win[ok], groups[ok]))
        if Mode.PAY in ctx.modes:
            ctx.lwrite_groups(cells, tile, payload=pays)
        if Mode.COMP in ctx.modes:
            keep = tile % 10 == 0
            ctx.lwrite_groups(cells[keep], tile[keep], payload=pays[::10])
        return res


def calibration_workflow(huge: bool = True) -> Workflow:
    """The calibration's operators; ``huge=False`` leaves out the two extra tiers (the
    capture-overhead runs need only the core three)."""
    wf = Workflow("subzero-calibration")
    small = wf.input("small")
    big = wf.input("big")
    wf.add("p1", CalibrationPatches(1, 3), small)
    wf.add("p4", CalibrationPatches(4, 8), big)
    wf.add("p32", CalibrationPatches(32, 48, spin=4), big)
    if huge:          # many small pairs: per-pair costs at scale (2 x 2 cells each side)
        wf.add("p2", CalibrationPatches(2, 2), wf.input("huge"))
        # a tiny lineage: the fixed costs of a read, which big lineages hide (a scan of a
        # few hundred pairs is not free)
        wf.add("p1t", CalibrationPatches(1, 3), wf.input("tiny"))
    return wf


#: The calibration's queries: scattered cells, and square boxes of these sides.
SCATTERED = (1, 64, 2048, 16384)
BOXES = (32, 96)
QUERY_CELLS = sum(SCATTERED) + sum(b * b for b in BOXES)
#: The many-pairs tier: one operator of small pairs (2 x 2 cells a side) on a 512 x 512
#: input, 65,536 pairs, asked a quarter of the array scattered and as a box, through the
#: index reads and one scan per encoding: per-pair costs dominate real lineage of a few
#: cells per pair (a data-dependent UDF's), which the other operators' big pairs hide.
HUGE_SIDE = 512
HUGE_SCATTERED = (16384,)
HUGE_BOXES = (256,)
HUGE_CELLS = sum(HUGE_SCATTERED) + sum(b * b for b in HUGE_BOXES)
#: The tiny tier: 24 x 24 cells, asked 1 and 64 cells and an 8 x 8 box.
TINY_SIDE = 24
TINY_SCATTERED = (1, 64)
TINY_BOXES = (8,)
TINY_CELLS = sum(TINY_SCATTERED) + sum(b * b for b in TINY_BOXES)
#: The tier whose steps warm up an observer's re-execution and mapping functions
WARM_OP = "p1t"
#: Queries per tier: (scattered sizes, box sides, cells in all).
TIERS = {"p2": (HUGE_SCATTERED, HUGE_BOXES, HUGE_CELLS),
         "p1t": (TINY_SCATTERED, TINY_BOXES, TINY_CELLS)}


def _queries(shape, rng, scattered=SCATTERED, boxes=BOXES) -> list[np.ndarray]:
    cells = np.argwhere(np.ones(shape, bool))
    out = [cells[rng.choice(len(cells), n, replace=False)] for n in scattered]
    y, x = shape[0] // 3, shape[1] // 3
    for side, (oy, ox) in zip(boxes, ((y, x), (y // 2, x // 2))):
        out.append(np.argwhere(np.ones((side, side), bool)) + [oy, ox])
    return out


def _observation_tasks(wf: Workflow, runs, rng) -> tuple[list[dict], list[np.ndarray]]:
    """The observations to make, in the calibration's fixed order: one task per (run,
    operator, direction, query), each with the methods it is traced by and its share of
    the progress bar; the queries' cells are drawn from ``rng`` in that order."""
    tasks: list[dict] = []
    queries: list[np.ndarray] = []
    for k, (run, group) in enumerate(runs):
        for op in wf.steps:
            for backward in (True, False):
                start = op if backward else wf.steps[op].inputs[0]
                scattered, boxes, _ = TIERS.get(op, (SCATTERED, BOXES, 0))
                for cells in _queries(run.shapes()[start], rng, scattered, boxes):
                    methods = [(f"stored:{s}", str(s)) for s in group if s.stored]
                    if k == 1:
                        methods += [("map", "map"), ("reexec", "reexec")]
                    if op == "p2":
                        methods = [m for m in methods if _huge_method(m[0], backward)]
                    tasks.append({"i": len(tasks), "run": k, "op": op, "start": start,
                                  "methods": methods,
                                  "weight": _observation_weight(wf.steps[op].operator, len(cells),
                                                                len(methods))})
                    queries.append(cells)
    return tasks, queries


def _load_costs() -> tuple[float, float]:
    """(seconds per array, seconds per byte) to load an input array from the array
    store (re-execution reads its operator's inputs), from arrays of 1, 4 and 16 MB
    (each the median of ``LOAD_REPEATS`` reads, CPU seconds or wall when lower: the
    arrays are in the page cache, so a read is decompression and copying).
    Opening a Zarr array costs milliseconds whatever its size, so both terms count."""
    from subzero.storage.arrays import ArrayStore
    held = scratch("load")
    tmp = held.path
    rng = np.random.default_rng(1)
    sizes, times = [], []
    try:
        store = ArrayStore(tmp)
        for k, n in enumerate((2**17, 2**19, 2**21)):
            store.write(f"a{k}", rng.random((n // 512, 512)))
            store.read_value(f"a{k}")                         # first touch: imports, metadata
            ts = []
            for _ in range(LOAD_REPEATS):
                c0, t0 = time.process_time(), time.perf_counter()
                store.read_value(f"a{k}")
                ts.append(min(time.perf_counter() - t0, time.process_time() - c0))
            sizes.append(n * 8)
            times.append(float(np.median(ts)))
    finally:
        held.close()
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(times), 1)
    return float(max(intercept, 0.0)), float(max(slope, 0.0))


_COLD_CODE = ("import sys, time\n"
              "from subzero.storage.arrays import ArrayStore\n"
              "from subzero.query.warmup import import_arrays\n"
              "s = ArrayStore(sys.argv[1])\n"
              "t = time.process_time()\n"
              "import_arrays()\n"
              "s.read_value('a')\n"
              "print(time.process_time() - t)\n")
_RTREE_COLD_CODE = ("import time\nt = time.process_time()\n"
                    "from rtree import index\n"
                    "print(time.process_time() - t)\n")


def _cold_load_child(folder: Path) -> Child:
    """A child measuring the CPU seconds a fresh process pays on its first array read of a
    re-execution (the executor's imports of the array store, ``import_arrays``, then a
    numeric array read), of an array written to ``folder`` (kept until the child is
    read): a command-line trace is such a process, and its first re-execution pays this
    on top of the warm price.  A labelled input's first read also imports xarray, which
    its step pays."""
    from subzero.storage.arrays import ArrayStore
    ArrayStore(folder).write("a", np.zeros((8, 8)))
    return Child(_COLD_CODE, str(folder))


#: The steps a fresh process traces to measure what a command-line trace pays that a warm
#: one does not: (operator, backward, cells, preferred method, run) -- index reads of the
#: three stored kinds a plan picks most, and a mapping function's.
FRESH_STEPS = (("p4", True, 1, "full:fullone:backward", 0),
               ("p4", False, 1, "full:fullone:forward", 0),
               ("p4", True, 1, "pay:payone:backward", 0),
               ("p4", True, 64, "full:fullone:backward", 0),
               ("p4", False, 64, "full:fullone:forward", 0),
               ("p4", True, 1, "map", 1))
#: ... each traced this many times in that process (the first is the fresh one; the
#: least of the others is the warm cost)
FRESH_PASSES = 4
#: ... by this many such processes side by side, the least of their figures kept
#: (:func:`_least_fresh_costs`)
FRESH_CHILDREN = 2

_FRESH_CODE = """
import json, sys, time
import numpy as np
import subzero
from subzero.heap import release, steady
steady()                       # as the command line's own process does
store = subzero.open_store(sys.argv[1], create=False)
runs = [store.get(int(r)) for r in sys.argv[2].split(",")]
__import__(sys.argv[3])        # the operators' module: a workflow's own import, not a trace's
from subzero.optimizer import planner_for
for run in runs:               # what `subzero trace` does before its first query
    run.planner = planner_for(run)
steps = json.loads(sys.argv[4])
out = []
for _ in range(int(sys.argv[5])):
    row = []
    for start, cells, op, prefer, k in steps:
        run = runs[k]
        run.executor().clear_cache(close=True)     # as `trace --workload` before each query
        release()
        c0 = time.process_time()
        res = run.trace(start, np.asarray(cells, np.int64), path=[(op, 0)], prefer=prefer)
        row.append([time.process_time() - c0, res.steps[0].cpu])
    out.append(row)
print(json.dumps(out))
"""


def _fresh_child(store, runs, wf, rng) -> Child:
    """A child measuring (first uses, extra per stored step) of a fresh process tracing, in CPU seconds: a
    child process traces ``FRESH_STEPS`` ``FRESH_PASSES`` times over, through a
    query-time planner as ``subzero trace`` does.  Its first pass costs more than its
    later ones twice over: the trace's first uses (the planner's and the lineage
    store's, readers made, modules imported on first call), counted once per process,
    and each stored read's first run through code a warm process ran long ago.  The
    observations above, and the profile's sample reads, time each read again and
    again; a ``subzero trace`` reads each once (at genomics 1x its one-cell steps took
    2-4x the model's warm price).  The extra is the median over the one-cell stored
    reads of first - least later (a larger read's first run also pays one-off set-ups
    of its own, and is priced from its sample's first read); a plan's query prices
    add it per stored step, and report the first uses beside them ((0.0, 0.0) when the
    child fails)."""
    specs = []
    for op, backward, n, prefer, k in FRESH_STEPS:
        start = op if backward else wf.steps[op].inputs[0]
        cells = np.argwhere(np.ones(runs[k].shapes()[start], bool))
        pick = cells[np.sort(rng.choice(len(cells), n, replace=False))]
        specs.append([start, pick.tolist(), op, prefer, k])
    module = type(wf.steps[FRESH_STEPS[0][0]].operator).__module__
    return Child(_FRESH_CODE, str(store.path), ",".join(str(r.id) for r in runs),
                  module, json.dumps(specs), str(FRESH_PASSES))


def _fresh_costs(passes) -> tuple[float, float, float]:
    """(first uses, extra per stored step, around each trace) from what
    :func:`_fresh_child` printed; zeros when that is not a pass per row of steps (a
    child that failed or printed something else).

    Around each trace is what a trace costs beyond its steps once nothing is a first
    use any more: the lineage store opened again (the child closes it before each
    trace, as ``trace --workload`` does before each query, and as a process of its own
    starts without it), the planner asked, the answer put together and logged.  At
    genomics 1x that was 1-2 ms a query, as much as the steps; a plan's per-query
    prices add it (the median over the steps of the least later pass)."""
    try:
        got = np.asarray(passes, float)
    except (TypeError, ValueError):          # ragged or not numbers
        return 0.0, 0.0, 0.0
    if got.ndim != 3 or got.shape[0] < 2 or got.shape[1:] != (len(FRESH_STEPS), 2):
        return 0.0, 0.0, 0.0
    first, later = got[0], got[1:]
    one = [k for k, (_, _, n, prefer, _) in enumerate(FRESH_STEPS) if n == 1 and prefer != "map"]
    extra = first[one, 1] - later[:, one, 1].min(axis=0)
    outside = (later[:, :, 0] - later[:, :, 1]).min(axis=0)
    around = (first[:, 0] - first[:, 1]) - outside
    return (max(0.0, float(around.sum())), max(0.0, float(np.median(extra))),
            max(0.0, float(np.median(outside))))


def _least_fresh_costs(printed: list) -> tuple[float, float, float]:
    """The least of each figure :func:`_fresh_costs` finds in what several fresh children
    printed, among the children that measured anything (zeros when none did).  A process
    has one first pass, so each child's figures rest on single timings, and what moves
    them is one-sided (an interruption, a cache another process emptied only add time):
    two calibrations on one quiet machine, a child each, found a stored step's fresh
    extra 0.18 and 0.90 ms and the first uses 1.4 and 4.3 ms."""
    got = [c for c in (_fresh_costs(p) for p in printed) if any(c)]
    if not got:
        return 0.0, 0.0, 0.0
    first, step, around = (min(v) for v in zip(*got))
    return first, step, around


def _rtree_quadratic() -> float:
    """b in t(n) = a n + b n^2 for an R-tree bulk load of n boxes (written to disk), in
    CPU seconds (or wall, when lower)."""
    from rtree import index as rindex
    rng = np.random.default_rng(0)
    held = scratch("rtree")
    tmp = held.path
    ns, ts = [], []
    try:
        for k, n in enumerate((16384, 65536, 262144)):
            lo = rng.random((n, 2)) * 1000
            props = rindex.Property()
            props.dimension = 2
            c0, t0 = time.process_time(), time.perf_counter()
            idx = rindex.Index(str(tmp / f"t{k}"), (np.arange(n, dtype=np.int64), lo, lo + 1),
                               properties=props)
            idx.close()
            ns.append(n)
            ts.append(min(time.perf_counter() - t0, time.process_time() - c0))
    finally:
        held.close()
    # imported only to fit: a cached calibration is loaded without scipy.optimize (0.36 s
    # of every budget run's start)
    from scipy.optimize import nnls

    x = np.asarray(ns, float)
    coef, _ = nnls(np.column_stack([x, x * x]) / np.asarray(ts)[:, None], np.ones(len(x)))
    return float(coef[1])


def _capture_overheads(store, wf, inputs,
                       repeats: int = CAPTURE_OVERHEAD_REPEATS) -> tuple[float, float]:
    """Runtime a run pays for lineage beyond each operator's own lineage work: once
    per run with capture (the LMDB environment) and once per stored strategy (its
    sub-database, statistics and catalog rows).  From alternating runs of the
    calibration workflow: no capture, capture storing nothing, one small strategy."""
    plain = {o: "map" for o in wf.steps}
    one = {**plain, "p32": "full:fullone:backward"}
    times: dict[str, list[float]] = {"none": [], "empty": [], "one": []}
    inner = []
    for _ in range(repeats):
        for key, kw in (("none", {"capture": False}), ("empty", {"strategies": plain}),
                        ("one", {"strategies": one})):
            t0 = time.perf_counter()
            run = store.run(wf, inputs=inputs, progress=False, **kw)
            times[key].append(time.perf_counter() - t0)
            op = {o["name"]: o for o in run.ops()}["p32"]
            if key == "empty":
                base_op = op["run_s"]
            elif key == "one":
                inner.append(op["run_s"] - base_op + op["lineage_s"])
    med = {k: float(np.median(v)) for k, v in times.items()}
    return (max(0.0, med["empty"] - med["none"]),
            max(0.0, med["one"] - med["empty"] - float(np.median(inner))))


#: Coefficients fixed by what the features mean rather than fitted: re-execution's ``load``
#: is already in seconds (measured directly by ``_load_costs``: the calibration's inputs
#: are too alike in size to separate loading from the constant) and ``run`` is the
#: operator's own profiled runtime with lineage (a re-execution cannot run it faster;
#: fitted freely, the calibration's operators, whose runtime grows with their pairs,
#: made it absorb the pair scan and under-price re-execution of big lineage).
FIXED = {"reexec": {"load": 1.0, "run": 1.0}}


def fit(observations: list[dict], model: CostModel) -> tuple[dict, dict, dict]:
    """NNLS on relative errors, per method family; returns (coef, quality, errors):
    ``errors`` is the error model (``costmodel.error_table``) of the fitted
    coefficients on these observations."""
    rows: dict[str, list] = {f: [] for f in FEATURES}
    for o in observations:
        fam = method_family(o["method"])
        got = model.features(o["op"], o["method"] if fam == "stored" else fam, o["input"],
                             o["direction"] == "backward", o["cells_in"], o["cells_out"],
                             blocks=o["blocks_in"], runs=o.get("runs_in", 0))
        if got is None or got[0].split(".")[0] != fam:      # e.g. nothing to re-execute
            continue
        rows[got[0]].append((got[1], o["seconds"], o))
    from scipy.optimize import nnls  # only to fit (see _rtree_quadratic)

    coef, quality = {}, {}
    predicted = []
    for fam, obs in rows.items():
        if not obs:
            raise RuntimeError(f"calibration observed no {fam} steps")
        X = np.array([x for x, _, _ in obs])
        t = np.array([s for _, s, _ in obs])
        fixed = np.zeros(X.shape[1])
        for name, v in FIXED.get(fam, {}).items():
            fixed[FEATURES[fam].index(name)] = v
        rest = np.clip(t - X @ fixed, 1e-6, None)
        free = fixed == 0
        c = fixed.copy()
        c[free], _ = nnls(X[:, free] / t[:, None], rest / t)
        coef[fam] = c.tolist()
        pred = np.maximum(X @ c, 1e-6)
        err = np.abs(pred / t - 1)
        quality[fam] = {"observations": len(t), "median_rel_error": float(np.median(err)),
                        "p90_rel_error": float(np.quantile(err, 0.9))}
        for (_, s, o), p in zip(obs, pred):
            method = o["method"] if fam.startswith("stored") else fam.split(".")[0]
            bk = o["direction"] == "backward"
            predicted.append((error_kind(method, bk),
                              model.error_size(o["op"], method, o["input"], bk, o["cells_in"],
                                               o["cells_out"]), float(s / p)))
    return coef, quality, error_table(predicted)


def _observation_weight(op: Operator, cells: int, methods: int) -> float:
    """Expected share of the time one group of observations takes, for the progress
    bar's time left: traced cells times methods, dearer where pairs are smaller."""
    assert isinstance(op, CalibrationPatches)
    return cells * methods * (1.0 / op.out ** 2 + 0.01)


#: Wall time of the calibration's other phases relative to all its observations (measured
#: with the observers side by side, 2 cores: the profiling run ~30%, the two storing runs
#: ~25%, load/fit/capture/R-tree timings and their children ~35%).
_PHASE_SHARE = {"profile": 0.3, "runs": 0.25, "tail": 0.35}


def _huge_method(method: str, backward: bool) -> bool:
    """The large tier's methods: every index read in its own direction, and one scan
    per lineage mode (FullOne, PayOne) — scans grow with the array, not the answer."""
    if not method.startswith("stored:"):
        return True
    spec = method[len("stored:"):]
    matched = spec.endswith(":backward") == backward
    return matched or spec in ("full:fullone:backward", "pay:payone:forward")


def _cpu_with_children() -> float:
    """CPU seconds of this process and of the child processes it has waited for (the
    observers and the fresh-process measurements: most of a calibration's CPU)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def calibrate(repeats: int = CALIBRATION_REPEATS, seed: int = 0,
              progress: ProgressArg = False) -> dict:
    """Run the calibration benchmark; returns the calibration (not yet stored).

    ``progress``: a bar with the time left on stderr (see :class:`Progress`)."""
    import subzero  # the public API: the optimizer is its client
    t0 = time.perf_counter()
    prog = Progress.of(progress)
    probes = [busy.probe()]
    phases: dict[str, float] = {}
    c0 = _cpu_with_children()

    def phase(name: str) -> None:   # CPU seconds per phase, its child processes' too, for the record
        nonlocal c0
        phases[name] = _cpu_with_children() - c0
        c0 = _cpu_with_children()
    held = scratch("calibration")
    tmp = held.path
    rng = np.random.default_rng(seed)
    inputs = {"small": rng.random((192, 192)), "big": rng.random((384, 384)),
              "huge": rng.random((HUGE_SIDE, HUGE_SIDE)),
              "tiny": rng.random((TINY_SIDE, TINY_SIDE))}
    wf = calibration_workflow()
    ops = list(wf.steps)
    full_pay = [Strategy(m, e, d) for m in (Mode.FULL, Mode.PAY) for e in ENCODINGS[m]
                for d in DIRECTIONS]
    comp = [Strategy(Mode.COMP, e, d) for e in ENCODINGS[Mode.COMP] for d in DIRECTIONS]
    groups = [full_pay, comp + [Strategy(Mode.MAP)]]
    n_methods = [sum(1 for s in groups[0] if s.stored), sum(1 for s in groups[1] if s.stored) + 2]
    obs_weight = sum(2 * _observation_weight(wf.steps[op].operator,
                                             TIERS.get(op, (0, 0, QUERY_CELLS))[2], n)
                     for n in n_methods for op in ops)
    share = {k: v * obs_weight for k, v in _PHASE_SHARE.items()}
    store = subzero.open_store(tmp / "store")
    try:
        with prog.bar("calibrating", obs_weight + sum(share.values())) as advance:
            profile_workflow(store, wf, inputs=inputs, all_ops=True, read_samples=False,
                             beside=False)
            advance(share["profile"])
            phase("profile")
            runs = [(store.run(wf, inputs=inputs, progress=False,
                               strategies={o: tuple(group) for o in ops}), group)
                    for group in groups]
            advance(share["runs"])
            phase("runs")
            tasks, queries = _observation_tasks(wf, runs, rng)
            obs = observe_all(store, [r for r, _ in runs], tasks, queries, repeats, tmp, advance,
                              WARM_OP)
            phase("observations")
            load_fixed_s, load_byte_s = _load_costs()
            uncalibrated = {"coef": {f: [1.0] * len(v) for f, v in FEATURES.items()},
                            "load_fixed_s": load_fixed_s, "load_byte_s": load_byte_s}
            model = CostModel(uncalibrated, required(for_run(store, runs[0][0]), "the calibration"))
            both = required(for_run(store, runs[1][0]), "the calibration")
            for s, info in both.ops.items():                             # both runs' stored sizes
                model.stats.ops[s].strategies.update(info.strategies)
            coef, quality, errors = fit(obs, model)
            phase("load and fit")
            small = calibration_workflow(huge=False)
            capture_s, strategy_s = _capture_overheads(
                store, small, {k: v for k, v in inputs.items() if k in ("small", "big")})
            phase("capture overheads")
            rtree_quadratic = _rtree_quadratic()
            children = (_cold_load_child(tmp / "cold"), Child(_RTREE_COLD_CODE))
            fresh = [_fresh_child(store, [r for r, _ in runs], wf, rng)
                     for _ in range(FRESH_CHILDREN)]
            cold_s, rtree_cold_s = children[0].cpu_s(), children[1].cpu_s()
            first_use_s, fresh_step_s, trace_query_s = _least_fresh_costs(
                [c.json() for c in fresh])
            advance(share["tail"])
            phase("rtree and cold start")
    finally:
        store.close()
        held.close()
    probes.append(busy.probe())
    load = busy.summarise(probes)
    return {"version": VERSION, "load": load, "cpu_s": phases, "coef": coef,
            "features": {f: list(v) for f, v in FEATURES.items()},
            "rtree_quadratic": rtree_quadratic, "quality": quality, "errors": errors,
            "capture_fixed_s": capture_s, "strategy_fixed_s": strategy_s,
            "load_fixed_s": load_fixed_s, "load_byte_s": load_byte_s, "reexec_cold_s": cold_s,
            "rtree_cold_s": rtree_cold_s, "trace_first_s": first_use_s,
            "fresh_step_s": fresh_step_s, "trace_query_s": trace_query_s,
            "seconds": time.perf_counter() - t0, "host": os.uname().nodename,
            "machine": machine()}


def machine() -> dict:
    """What a calibration is a calibration of: this host's name, processor and cores,
    and the Python and numpy its timings ran on."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    import platform
    return {"host": os.uname().nodename, "cpu": cpu or platform.processor(),
            "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__}


def cache_dir() -> Path:
    """The user's cache folder for SubZero: ``$SUBZERO_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/subzero``, else ``~/.cache/subzero``."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "subzero"


def cache_file() -> Path:
    """Where this host's calibration is cached for every store of this user."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.uname().nodename)
    return cache_dir() / f"calibration-{host or 'host'}.json"


def well_formed(cal) -> bool:
    """Whether ``cal`` is a calibration the cost model can use as it is: this model's
    version and features, finite coefficients of the right lengths, an error model of
    the right shape.  A cached file is checked before it is used: a damaged or
    hand-edited one is made again, never a crash in the middle of a plan."""
    if not isinstance(cal, dict) or cal.get("version") != VERSION:
        return False
    if cal.get("features") != {f: list(v) for f, v in FEATURES.items()}:
        return False
    coef = cal.get("coef")
    if not isinstance(coef, dict) or not all(
            isinstance(coef.get(f), list) and len(coef[f]) == len(v) and all(map(number, coef[f]))
            for f, v in FEATURES.items()):
        return False
    scalars = ("seconds", "rtree_quadratic", "capture_fixed_s", "strategy_fixed_s",
               "load_fixed_s", "load_byte_s", "reexec_cold_s", "rtree_cold_s",
               "trace_first_s", "fresh_step_s", "trace_query_s")
    if not all(number(cal[k]) for k in scalars if k in cal) or not number(cal.get("seconds")):
        return False
    errors = cal.get("errors", {})
    if not isinstance(errors, dict):
        return False
    for table in errors.values():
        if not isinstance(table, dict) or not number(table.get("max_cells")):
            return False
        rows = table.get("buckets")
        if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == 4 and all(map(number, r)) for r in rows):
            return False
    return isinstance(cal.get("load"), dict) and isinstance(cal.get("quality", {}), dict)


def cached_calibration() -> dict | None:
    """This machine's calibration as another store of this user made it, or None:
    none cached, unreadable, for another machine or cost model, made on a busy
    machine, or malformed.  The file is read as the store's files are (never through
    a symbolic link, never blocking on a FIFO, bounded in size)."""
    from subzero.storage.files import read_regular
    try:
        cal = json.loads(read_regular(cache_file(), CACHE_FILE_BYTES, "the cached calibration"))
    except (OSError, ValueError, StoreError):      # missing, a link, too big, not JSON
        return None
    if not well_formed(cal) or cal.get("machine") != machine() or cal["load"].get("busy", True):
        return None
    return cal


def keep_for_host(cal: dict) -> Path | None:
    """Cache a calibration for this user's other stores on this machine (only one made
    on a quiet machine); written whole or not at all.  A cache that cannot be written
    is no error: the next store calibrates again.  Returns where it was written."""
    if cal["load"].get("busy", True) or not well_formed(cal):
        return None
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".calibration-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({k: v for k, v in cal.items() if k not in ("id", "created")}, f)
            os.replace(tmp, cache_file())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return None
    return cache_file()


def ensure_calibration(store, recalibrate: bool = False, progress: ProgressArg = False) -> dict:
    """The stored calibration of this host, running the benchmark when there is none
    (or when asked)."""
    host = os.uname().nodename
    prog = Progress.of(progress)
    if not recalibrate:
        cal = store.catalog.latest_calibration(host)
        features = {f: list(v) for f, v in FEATURES.items()}
        if cal is not None and cal.get("version") == VERSION and cal.get("features") == features:
            return cal                        # same machine, same cost model: still valid
        cached = cached_calibration()
        if cached is not None:                # made for another store on this machine
            prog.note(f"using this machine's calibration from {cache_file()} (--recalibrate "
                      f"makes a new one)")
            store.catalog.add_calibration(host, cached["seconds"], cached)
            return store.catalog.latest_calibration(host)
    prog.note("calibrating this machine's cost model (once per host, or with --recalibrate)")
    cal = calibrate(progress=prog)
    said = busy.warning(cal["load"])
    if said:
        warn(said)
    store.catalog.add_calibration(host, cal["seconds"], cal)
    keep_for_host(cal)
    return store.catalog.latest_calibration(host)


def quality_summary(cal: dict) -> str:
    q = cal.get("quality", {})
    return ", ".join(f"{f} median error {v['median_rel_error']:.0%} ({v['observations']} steps)"
                     for f, v in q.items())
