"""The cost model: what storing a strategy costs (disk bytes, runtime
overhead) and what a query step costs with each method.

Storage costs come straight from the statistics (profile or real runs).  A
query step's cost is a linear function of a few *features* computed from the
step's sizes and what is stored — cells decoded from LMDB blocks, cells in and
out, Python ``map_p`` calls, cells ``map_p`` expands to, R-tree probes, bitmap
sizes; for re-execution the operator's own runtime, the pairs it regenerates
and the input bytes it loads.  The coefficients are not guesses: they are fit
on this machine by the calibration benchmark (``calibration.py``), which runs
the very same executor over synthetic lineage and fits these same features.
The trace log then corrects them per operator input and method (``learn``): one
operator can be cheap to trace through one input and costly through another.

Block counts assume query cells fall uniformly over the key array: the
expected number of distinct blocks hit by ``n`` cells among ``B`` blocks is
``B (1 - (1 - 1/B)^n)``.  That over-counts for compact boxes, so predictions
err on the slow side, which keeps the planner conservative.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import defaultdict
from functools import lru_cache

import numpy as np

from subzero.model.modes import Mode
from subzero.model.strategy import Strategy, parse_one
from subzero.query.methods import Mapping, Reexec, Stored
from subzero.query.relation import per_payload
from subzero.storage.encodings import KEY_BITS, REC_PAIRS
from subzero.tuning import (
    CORRECTION_KEYS_CACHED,
    CORRECTION_MIN_STEPS,
    CORRECTION_RANGE,
    CORRECTION_RECENT_STEPS,
    DEFAULT_MARGIN,
    ERROR_BUCKET_MIN_STEPS,
    ERROR_BUCKETS,
    EXTRAPOLATION_GROWTH,
    OWN_FACTOR_RANGE,
    PRICE_MEMO_ENTRIES,
    VOUCH_FACTOR,
)

from .stats import OpInfo, WorkflowStats, median

STORED_FEATURES = ("one", "many", "dec", "blk", "scan", "kscan", "sblk", "io", "call", "exp",
                   "sexp", "ptab", "box", "arr", "pairs")
#: Stored reads are fitted apart by how they read — through the index of the step's
#: direction or by a scan of the other, one record per cell (``one``) or R-tree regions
#: (``many``), explicit pairs (``full``) or payloads expanded by ``map_p`` (``pay``, Comp
#: too): their costs grow with different features, and one coefficient set for all of
#: them fitted none well (R-tree and payload reads were 3-20x off on big steps).
STORED_FAMILIES = tuple(f"stored.{how}.{enc}.{kind}" for how in ("index", "scan")
                        for enc in ("one", "many") for kind in ("full", "pay"))
FEATURES = {
    **{f: STORED_FEATURES for f in STORED_FAMILIES},
    "map": ("const", "io", "arr"),
    "reexec": ("const", "run", "pcells", "io", "load", "arr"),
}


def touched(n: float, bins: float) -> float:
    """Expected distinct bins hit by ``n`` uniform draws among ``bins``."""
    if n <= 0 or bins <= 0:
        return 0.0
    if bins <= 1:
        return 1.0
    return bins * -math.expm1(n * math.log1p(-1.0 / bins))


def method_family(method) -> str:
    """'stored', 'map' or 'reexec' for a query method, a Strategy or a method name."""
    if isinstance(method, (Stored, Mapping, Reexec)):
        return method.family
    if isinstance(method, Strategy):
        return "stored"
    m = str(method)
    if m.startswith("stored:"):
        return "stored"
    if m.startswith("reexec"):
        return "reexec"
    return "map"


def error_kind(method, backward: bool) -> str:
    """What a prediction's error depends on: the coefficient family that priced it — a
    stored read through the index of the step's direction or by a scan of the other,
    one record per cell or R-tree regions ('stored.index.one.full', ...), mapping functions
    ('map') or re-execution ('reexec')."""
    fam = method_family(method)
    if fam != "stored":
        return fam
    return _stored_family(_strategy(method), backward)


def error_table(observed) -> dict:
    """The error model from (kind, cells, measured / predicted) of calibration steps:
    per kind, buckets of step size (cells in or out, the larger) with the 10th and
    90th percentile of measured / predicted; a bucket with fewer than
    ``ERROR_BUCKET_MIN_STEPS`` steps joins the next larger one.  ``max_cells``: the
    largest step observed (beyond it predictions are extrapolations, and
    ``CostModel.margin`` widens them)."""
    out: dict = {}
    for kind in sorted({k for k, _, _ in observed}):
        sizes = np.array([n for k, n, _ in observed if k == kind], float)
        ratios = np.array([r for k, _, r in observed if k == kind], float)
        buckets, lo_edge = [], 0.0
        for edge in (*ERROR_BUCKETS, math.inf):
            sel = (sizes > lo_edge) & (sizes <= edge)
            if sel.sum() >= ERROR_BUCKET_MIN_STEPS or (edge == math.inf and sel.any()):
                r = ratios[sel]
                buckets.append([min(edge, float(sizes[sel].max())),
                                max(1.0, float(np.quantile(r, 0.9))),
                                min(1.0, float(np.quantile(r, 0.1))), int(sel.sum())])
                lo_edge = edge
        out[kind] = {"buckets": buckets, "max_cells": float(sizes.max())}
    return out


@lru_cache(maxsize=CORRECTION_KEYS_CACHED)
def correction_key(method, backward: bool) -> str:
    """What a learned correction applies to: mapping, re-execution, or one stored
    strategy read through its index or by a scan (their costs scale differently)."""
    fam = method_family(method)
    if fam != "stored":
        return fam
    s = _strategy(method)
    return f"stored:{s}:" + ("index" if s.backward == backward else "scan")


def _strategy(method) -> Strategy:
    """The strategy a stored method reads (a query method, a Strategy or a method name)."""
    if isinstance(method, Stored):
        return method.strategy
    if isinstance(method, Strategy):
        return method
    return parse_one(str(method)[len("stored:"):])


class CostModel:
    """Prices storage and query steps for one workflow (its statistics) on one
    machine (its calibration)."""

    def __init__(self, calibration: dict, stats: WorkflowStats,
                 corrections: dict[tuple[str, int, str], float] | None = None):
        self.calibration = calibration
        self.coef = {f: np.asarray(calibration["coef"][f], float) for f in FEATURES}
        self.rtree_b = float(calibration.get("rtree_quadratic", 0.0))
        self.capture_fixed_s = float(calibration.get("capture_fixed_s", 0.0))
        self.strategy_fixed_s = float(calibration.get("strategy_fixed_s", 0.0))
        # calibrations before version 4 priced loading per byte through the fitted
        # coefficient; theirs stay usable until the next `subzero optimize` recalibrates
        self.load_in_seconds = "load_byte_s" in calibration
        self.load_fixed_s = float(calibration.get("load_fixed_s", 0.0))
        self.load_byte_s = float(calibration.get("load_byte_s", 0.0))
        #: a fresh process's first array read: imports a warm process paid long ago
        self.reexec_cold_s = float(calibration.get("reexec_cold_s", 0.0))
        #: ... and its first R-tree read: the R-tree library's import (tens of ms, more
        #: than a small query's whole work)
        self.rtree_cold_s = float(calibration.get("rtree_cold_s", 0.0))
        #: what a stored read costs a fresh process (a `subzero trace`) beyond the warm
        #: repeats the model was fitted on, per step; and what such a process pays once
        #: before its first answer (calibration ``_fresh_costs``).  The plan's reports
        #: add them; its choices leave them out
        self.fresh_step_s = float(calibration.get("fresh_step_s", 0.0))
        self.trace_first_s = float(calibration.get("trace_first_s", 0.0))
        #: ... and what each trace costs beyond its steps (the store opened again, the
        #: planner asked, the answer logged): the plan's per-query prices add it
        self.trace_query_s = float(calibration.get("trace_query_s", 0.0))
        self.stats = stats
        self.corrections = dict(corrections or {})
        self._memo: dict[tuple, tuple | None] = {}
        self._own: dict[tuple[str, str, bool], list[tuple[float, float]]] = {}

    # -- how far predictions can be trusted ----------------------------------------------
    def margin(self, kind: str, cells: float) -> tuple[float, float]:
        """(low, high) factors around a prediction of a step of this kind and size: the
        calibration's 10th and 90th percentile of measured / predicted for steps that
        size, widened by ``EXTRAPOLATION_GROWTH`` per decade beyond the largest step it
        measured.  An older calibration without an error model gets ``DEFAULT_MARGIN``."""
        table = (self.calibration.get("errors") or {}).get(kind)
        if not table or not table["buckets"]:
            return 1.0 / DEFAULT_MARGIN, DEFAULT_MARGIN
        buckets = table["buckets"]
        row = next((b for b in buckets if cells <= b[0]), buckets[-1])
        hi, lo = row[1], row[2]
        if cells > table["max_cells"] > 0:
            grow = 1.0 + EXTRAPOLATION_GROWTH * math.log10(cells / table["max_cells"])
            hi, lo = hi * grow, lo / grow
        return lo, hi

    def error_size(self, op: str, method, i: int, backward: bool, n_in: float,
                   n_out: float) -> float:
        """The size a prediction's error is judged by: the cells a step reads — its
        input and output for index reads, mapping functions and re-execution, the
        whole scanned lineage for a scan (which grows with the array, not the answer)."""
        size = max(n_in, n_out)
        if error_kind(method, backward).startswith("stored.scan"):
            info = self.stats.ops.get(op)
            si = info.strategies.get(str(_strategy(method))) if info else None
            s = _strategy(method)
            sp = (si.spaces.get("b" if s.backward else f"f{i}") or {}) if si else {}
            size = max(size, float(sp.get("record_cells", 0)) + float(sp.get("key_cells", 0)))
        return size

    def high_factor(self, op: str, method, i: int, backward: bool, n_in: float,
                    n_out: float) -> float:
        """How much slower than predicted a step of this kind and size may be (nine
        cases out of ten, by the calibration)."""
        size = self.error_size(op, method, i, backward, n_in, n_out)
        return self.margin(error_kind(method, backward), size)[1]

    # -- storage and capture --------------------------------------------------------
    def info(self, op: str) -> OpInfo:
        return self.stats.op(op)

    def disk(self, op: str, s: Strategy) -> float:
        return self.info(op).strategies[str(s)].bytes

    def write_s(self, op: str, s: Strategy) -> float:
        """Encoding + writing time (without the fixed per-strategy cost).  A sampled R-tree
        build is extrapolated with the calibrated super-linear term (bulk loads slow down
        as the file grows)."""
        si = self.info(op).strategies[str(s)]
        w = si.write_s
        if s.many and not si.measured and si.sample_frac < 1:
            w += sum(self.rtree_b * sp["pairs"] ** 2 * (1 - si.sample_frac)
                     for sp in si.spaces.values())
        return w

    def gen_s(self, op: str, mode: Mode | str) -> float:
        m = self.info(op).modes.get(Mode(mode).value)
        return 0.0 if m is None else float(m["gen_s"])

    def runtime(self, op: str, strategies) -> float:
        """Runtime overhead of storing ``strategies`` together: each lineage mode's
        work is paid once however many encodings share it, each encoding is paid
        (and its fixed cost: sub-database, statistics).  A run that stores anything
        also pays ``capture_fixed_s`` once (``ilp.Problem.fixed_runtime_s``)."""
        stored = [s for s in strategies if s.stored]
        return (sum(self.gen_s(op, m) for m in {s.mode for s in stored})
                + sum(self.write_s(op, s) + self.strategy_fixed_s for s in stored))

    # -- queries ----------------------------------------------------------------------------
    def cost(self, op: str, method, i: int, backward: bool, n_in: float, n_out: float,
             loaded: bool = False, blocks: int = 0, tiles: float = 1.0,
             runs: int = 0, fresh: bool = True) -> float | None:
        """Predicted seconds of one step; None when the statistics cannot price it.

        ``blocks``: distinct key blocks the step's input cells span (0 = unknown:
        assume they are scattered).  ``tiles``: the share of the operator's tiles a
        re-execution runs (tile-parallel operators re-run only the touched tiles).
        ``runs``: runs of consecutive input cells, the probes of an R-tree lookup (0 =
        unknown: estimated from ``blocks``).  ``fresh``: add the first uses this process
        has not made yet (:meth:`cold_s`), as a query-time planner does; a plan's prices
        and what is learnt from a step leave them out."""
        key = (op, method, i, backward, n_in, n_out, loaded, blocks, tiles, runs)
        base = self._memo.get(key)
        if base is None:
            # the planner prices the same steps again and again (every method of every
            # step, then the step it observed); the calibrated part is a pure function
            base = self._memo[key] = self._base_cost(op, method, i, backward, n_in, n_out,
                                                      loaded, blocks, tiles, runs)
            if len(self._memo) > PRICE_MEMO_ENTRIES:
                self._memo.clear()
        if base is None:
            return None
        compute, load = base
        if compute is None:
            return 0.0
        corr = self.corrections.get((op, i, correction_key(method, backward)), 1.0)
        return compute * corr + load + (self.cold_s(op, method, loaded) if fresh else 0.0)

    def cold_s(self, op: str, method, loaded: bool = False) -> float:
        """What a method pays on top of its warm price in a process that has not made its
        first use yet: a re-execution the array store's imports until an array was read
        (``reexec_cold_s``), an R-tree read the R-tree library's (``rtree_cold_s``).  Every
        ``subzero trace`` is such a process: priced warm, a switch into re-execution
        looked cheap and then took seconds on the command line, and a FullMany read chosen
        over a FullOne one doubled a small query (issue 33)."""
        fam = method_family(method)
        if fam == "stored":
            return self.rtree_cold_s if self.rtree_cold_s and _strategy(method).many \
                and "rtree" not in sys.modules else 0.0
        if loaded or not self.reexec_cold_s or fam != "reexec" or "zarr" in sys.modules:
            return 0.0
        info = self.stats.ops.get(op)
        return self.reexec_cold_s if info is not None and info.reexec_mode is not None else 0.0

    def _base_cost(self, op, method, i, backward, n_in, n_out, loaded, blocks, tiles=1.0, runs=0):
        """(compute seconds before corrections, load seconds) or None."""
        got = self.features(op, method, i, backward, n_in, n_out, loaded, blocks, tiles, runs)
        if got is None:
            return None
        fam, x = got
        if fam == "none":
            return (None, 0.0)
        load = 0.0
        if fam == "reexec":            # loading inputs is I/O: corrections are for the compute
            k = FEATURES["reexec"].index("load")
            load = float(self.coef[fam][k] * x[k])
        own = self.own_factor(op, method, backward, n_in)
        return max(float(self.coef[fam] @ x) - load, 1e-6) * own, load

    # -- the operator's own lineage sample ------------------------------------------------------
    def sample_ratio(self, op: str, method, index: bool, n_in: float = 1.0) -> float | None:
        """Measured / predicted seconds of reading this strategy's own sample through its
        index (``index``) or by a scan, as the profile timed it (``sampleread``), for the
        timed query nearest ``n_in`` cells in size (log scale); None when it was not
        timed (an older profile, or not a stored method)."""
        if method_family(method) != "stored":
            return None
        s = _strategy(method)
        key = (op, str(s), index)
        if key not in self._own:
            self._own[key] = self._sample_ratios(op, s, index)
        got = self._own[key]
        if not got:
            return None
        size = math.log(max(n_in, 1.0))
        return min(got, key=lambda t: abs(math.log(max(t[0], 1.0)) - size))[1]

    def _sample_ratios(self, op: str, s: Strategy, index: bool) -> list[tuple[float, float]]:
        """(cells in, measured / predicted) of each timed read of the sample."""
        info = self.stats.ops.get(op)
        si = info.strategies.get(str(s)) if info else None
        smp = si.sample if si else None
        reads = [r for r in (smp or {}).get("reads", ())
                 if (r["backward"] == s.backward) == index and r["seconds"] > 0]
        if info is None or si is None or smp is None or not reads:
            return []
        # the sample's own sizes; what the profile extrapolated to all pairs, cut back
        frac = si.sample_frac
        mode = dict(info.modes.get(s.mode.value, {}))
        for k in ("payloads", "out_cells"):
            if mode.get(k):
                mode[k] = mode[k] * frac
        if mode.get("expanded"):
            mode["expanded"] = [e * frac for e in mode["expanded"]]
        small = dataclasses.replace(info, modes={**info.modes, s.mode.value: mode})
        out = []
        for read in reads:
            backward = bool(read["backward"])
            src = math.prod(info.out_shape if backward else info.in_shapes[0])
            tgt = math.prod(info.in_shapes[0] if backward else info.out_shape)
            x = self._stored(small, s, smp["spaces"], 0, backward, read["cells_in"],
                             read["cells_out"], src + tgt, read["blocks"], read["runs"])
            pred = float(self.coef[_stored_family(s, backward)] @ x)
            if pred > 0:
                out.append((float(read["cells_in"]), read["seconds"] / pred))
        return out

    def sample_read(self, op: str, strategy: str, sample: dict) -> None:
        """The timed reads of a sample the profile left unread (``sampleread.Unread``),
        read now: prices of that strategy use its decode factors from here on."""
        si = self.stats.ops[op].strategies[strategy]
        si.sample, si.unread = sample, False
        self._own = {k: v for k, v in self._own.items() if k[:2] != (op, strategy)}
        self._memo.clear()

    def repriced(self, op: str, strategy: str, rec: dict) -> None:
        """A strategy the profile priced roughly, priced again in full on all its pairs and
        its sample read (``sampleread.Unread.read``): its bytes, write time, sizes and
        timed reads from ``rec``, the new price."""
        si = self.stats.ops[op].strategies[strategy]
        si.bytes, si.write_s = float(rec["bytes"]), float(rec["write_s"])
        si.spaces, si.sample_frac = rec["spaces"], float(rec.get("sample_frac", 1.0))
        self.sample_read(op, strategy, rec["sample"])

    def prepare(self, strategies: dict[str, tuple[Strategy, ...]]) -> None:
        """Work out, once, what every price of these operators' stored strategies uses
        and no query changes: each one's decode factors from its own sample, through its
        index and by a scan (``sample_ratio``).  A query-time planner is prepared when it
        is made: left to the first step that prices a strategy, those feature vectors
        (three to ten per strategy) cost that step 0.3-0.9 ms in a fresh process, more
        than a step's own read at genomics 1x."""
        for op, ss in strategies.items():
            for s in ss:
                if s.stored:
                    for index in (True, False):
                        self.sample_ratio(op, s, index)

    def own_factor(self, op: str, method, backward: bool, n_in: float = 1.0) -> float:
        """The factor this operator's own lineage decodes at, against the calibration's
        synthetic lineage: measured / predicted on its sample (clamped to
        ``OWN_FACTOR_RANGE``), for the way a step reads it (index or scan) and the timed
        query nearest its size; 1 when the profile did not time it."""
        if method_family(method) != "stored":
            return 1.0
        r = self.sample_ratio(op, method, _strategy(method).backward == backward, n_in)
        if r is None:
            return 1.0
        lo, hi = OWN_FACTOR_RANGE
        return min(hi, max(lo, r))

    def vouched(self, op: str, s: Strategy) -> tuple[bool, str]:
        """Whether the calibration can vouch for its prices of ``s`` on this operator:
        (ok, why not).  Not when reading the operator's own sample took more than
        ``VOUCH_FACTOR`` times, or less than 1 / ``VOUCH_FACTOR`` of, what it predicted,
        through the index or by a scan: the model then extrapolates from a sample of a
        few thousand pairs, not from anything it was fitted on."""
        for index in (True, False):
            self.sample_ratio(op, s, index)              # fills self._own for (op, s, index)
            for n, r in self._own.get((op, str(s), index), []):
                if not 1.0 / VOUCH_FACTOR <= r <= VOUCH_FACTOR:
                    how = "through its index" if index else "by a scan"
                    return False, (f"reading {op}'s own {s} sample {how} ({n:.0f} cells) took "
                                   f"{r:.1f}x the calibrated prediction")
        return True, ""

    def features(self, op: str, method, i: int, backward: bool, n_in: float, n_out: float,
                 loaded: bool = False, blocks: int = 0, tiles: float = 1.0, runs: int = 0):
        info = self.stats.ops.get(op)
        if info is None:
            return None
        src = math.prod(info.out_shape if backward else info.in_shapes[i])
        tgt = math.prod(info.in_shapes[i] if backward else info.out_shape)
        if method_family(method) == "stored":
            method = _strategy(method)
        if isinstance(method, Strategy):
            si = info.strategies.get(str(method))
            if si is None:
                return None
            x = self._stored(info, method, si.spaces, i, backward, n_in, n_out, src + tgt, blocks, runs)
            return _stored_family(method, backward), x
        if method_family(method) == "reexec":
            mode = info.reexec_mode
            if mode is None:                # nothing to regenerate: mapping or all-to-all
                return ("map", _vec("map", const=1, io=n_in + n_out, arr=src + tgt)) \
                    if info.has_map else ("none", None)
            m = info.modes.get(mode, {"run_s": info.run_s, "cells": 0})
            # a tile-limited re-run runs, regenerates and reads that share of the whole;
            # an operator whose lineage is not declared deterministic runs twice
            k = tiles * info.reruns
            return "reexec", _vec("reexec", const=1, run=m["run_s"] * k,
                                  pcells=m["cells"] * k, io=n_in + n_out,
                                  load=0 if loaded else self.load_s(info) * tiles, arr=src + tgt)
        return "map", _vec("map", const=1, io=n_in + n_out, arr=src + tgt)

    def load_s(self, info: OpInfo) -> float:
        """Seconds to load an operator's inputs from the array store (re-execution); for
        an older calibration, the bytes its per-byte coefficient prices."""
        if not self.load_in_seconds:
            return float(info.in_bytes)
        return len(info.in_shapes) * self.load_fixed_s + info.in_bytes * self.load_byte_s

    def _stored(self, info: OpInfo, s: Strategy, spaces: dict, i: int, backward: bool,
                n_in: float, n_out: float, arr: float, blocks: int, runs: int = 0) -> np.ndarray:
        """Features of reading stored lineage.  Matched index: the key blocks the query
        touches and the record blocks of the pairs it hits are decoded.  Mismatched
        index: every record (and, for FullOne, every key block) is decoded and
        scanned.  Payloads add ``map_p`` calls and the cells they expand to."""
        f = dict(arr=arr, io=n_in + n_out)
        f["one" if not s.many else "many"] = 1
        sp = spaces.get("b" if s.backward else f"f{i}")
        if not sp or not sp["pairs"]:
            return _vec(_stored_family(s, backward), **f)
        P, K, KB, N = sp["pairs"], sp["key_cells"], max(sp["key_blocks"], 1), max(sp["key_size"], 1)
        R = -(-P // REC_PAIRS)
        rec_cells = sp["record_cells"]
        mode = info.modes.get(s.mode.value, {})
        expanded = (mode.get("expanded") or [0] * len(info.in_shapes))[i] or K
        q, density = float(n_in), K / N
        u = (sp.get("payloads", mode.get("payloads", P)) or P) if s.payload else 0
        per_block = min(REC_PAIRS, u / R)                 # payload table entries per record block
        f["scan"] = f["sblk"] = 0.0
        if s.mode is Mode.COMP and backward:
            covered = mode.get("out_cells", sp.get("covered", 0))
            f["scan"] += covered                          # the covered set is read first
            q = n_in * min(1.0, covered / max(math.prod(info.out_shape), 1))
            density = 1.0                                 # those cells all have payload pairs
        if s.backward == backward:       # the index matches the step
            # scattered query cells hit one pair each; a compact region hits the pairs
            # that tile it; the blocks the cells span say where in between a query is
            nb = -(-N // (1 << KEY_BITS))
            spread = touched(q, nb)
            local = min(1.0, blocks / spread) if blocks and spread else 1.0
            hit_s = touched(max(q * density, 1.0) if q > 0 else 0.0, P)
            hit_c = min(hit_s, max(1.0, q * P / max(K, 1)))
            hit = hit_c + (hit_s - hit_c) * local
            rb_c = -(-hit // REC_PAIRS)
            rb = rb_c + (touched(hit, R) - rb_c) * local
            kb = 0.0 if s.many else spread * local * min(1.0, KB / nb)
            f.update(dec=kb * K / KB + rb * rec_cells / R, blk=kb + rb, ptab=rb * per_block,
                     pairs=rb * min(REC_PAIRS, P),       # pairs decoded: cost per pair, not cell
                     box=(runs or q * local) * math.log2(max(P, 2)) if s.many else 0.0)  # probes x depth
            if s.payload and s.backward:
                u_hit = touched(hit, u)     # the distinct payloads of the pairs hit
                f["call"] = u_hit if per_payload(info.map_p_batched, info.map_p_vectorized,
                                                 hit, u_hit) else \
                    (1.0 if info.map_p_vectorized else hit)
                f["exp"] = min(hit * expanded / P, max(n_out, 1.0) * 8)
        else:                                              # a full scan of the other index
            one_full = not s.many and not s.payload
            f["scan"] += rec_cells
            f["pairs"] = P
            f["kscan"] = K if one_full else 0.0
            f["sblk"] = R + (KB if one_full else 0)
            f["ptab"] = R * per_block
            if s.payload and s.backward:    # map_p over every pair
                f["sexp"] = expanded
                f["call"] = 1.0 if info.map_p_vectorized else P
        return _vec(_stored_family(s, backward), **f)

    def predict_out(self, op: str, i: int, backward: bool, n_in: float) -> float:
        """Expected cells a step reaches (before running it): the lineage's cells per
        side, saturated at the target array's size."""
        info = self.stats.ops.get(op)
        if info is None:
            return n_in
        tgt = math.prod(info.in_shapes[i] if backward else info.out_shape)
        for m in info.modes.values():
            ins = m.get("in_cells") or []
            if m.get("out_cells") and i < len(ins) and ins[i]:
                ratio = ins[i] / m["out_cells"] if backward else m["out_cells"] / ins[i]
                return touched(n_in * ratio, tgt)
        return min(n_in, tgt)

    # -- feedback from the trace log ----------------------------------------------------------
    def learn(self, steps: list[dict], min_obs: int = CORRECTION_MIN_STEPS,
              recent: int = CORRECTION_RECENT_STEPS) -> None:
        """Per operator, input and method (``correction_key``): the median of observed /
        predicted over the latest warm traced steps (not ``cold``: a first read in its
        process) corrects the calibration (clamped).  A step
        counts the CPU seconds of its own work when the log has them; a switched step
        counts twice: its abandoned read by what it would have cost by its progress (at
        least what it ran), its re-execution by its own time without the read's."""
        ratios: dict[tuple[str, int, str], list[float]] = defaultdict(list)
        self.corrections = {}

        def add(st: dict, method, backward: bool, own: float,
                read: tuple[float, float] | None = None) -> None:
            pred = self.cost(st["op"], method, st["input"], backward, st["cells_in"],
                             st["cells_out"], loaded=True, blocks=st.get("blocks_in") or 0,
                             runs=st.get("runs_in") or 0, fresh=False)
            if pred:
                r, floor = read_ratio(*read, pred) if read is not None else (own / pred, 0.0)
                ratios[(st["op"], st["input"], correction_key(method, backward))].append(
                    max(1.0, floor) if r is None else max(r, floor))   # a floor: no faster
        for st in steps:
            method = st["method"]
            if method in ("all-to-all", "empty") or st["op"] not in self.stats.ops \
                    or st.get("cold"):     # cold caches: not what the method costs warm
                continue
            fam = method_family(method)
            m, backward = (method if fam == "stored" else fam), st["direction"] == "backward"
            own = own_seconds(st.get("cpu_s") or 0.0, st["seconds"])
            if st.get("abandoned"):
                spent, done = float(st.get("abandoned_s") or 0.0), float(st.get("done") or 0.0)
                add(st, st["abandoned"], backward, 0.0, read=(spent, done))
                own -= spent
            if own > 0:
                add(st, m, backward, own)
        lo, hi = CORRECTION_RANGE
        for key, rs in ratios.items():
            if len(rs) >= min_obs:
                self.corrections[key] = min(hi, max(lo, median(rs[-recent:])))


def own_seconds(cpu: float, seconds: float) -> float:
    """What a step's own work cost: its CPU seconds when measured (a busy machine
    stretches wall time, not the work), else (an older trace log) its wall seconds."""
    return cpu if cpu > 0 else seconds


def read_ratio(spent: float, done: float, pred: float) -> tuple[float | None, float]:
    """What an abandoned read teaches, against its prediction ``pred``: (its measured /
    predicted cost, extrapolated from the CPU seconds it ran and the share of its work
    done; None when its progress was not measured) and the floor (it cost at least what
    it ran).  A read abandoned early by a noisy clock but nearly done extrapolates to
    cheap, and moves its correction down again."""
    floor = spent / pred
    return (spent / done / pred if done > 0 else None), floor


@lru_cache(maxsize=256)
def _stored_family(s: Strategy, backward: bool) -> str:
    return (f"stored.{'index' if s.backward == backward else 'scan'}.{'many' if s.many else 'one'}"
            f".{'pay' if s.payload else 'full'}")


def _vec(family: str, **values) -> np.ndarray:
    return np.array([float(values.get(k, 0.0)) for k in FEATURES[family]])
