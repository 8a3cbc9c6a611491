"""Profiling mode: one cheap run that tells the cost model what every strategy
an operator could store would cost, without storing any of them.

The profiling run is an ordinary, complete run that stores each operator's declared
default where that is stored lineage (mapping functions where operators have them,
black-box elsewhere), so the workload is measured on it at the defaults' speed.
After each operator runs, the profiler

* re-runs it once per lineage mode it supports (Full, Pay, Comp), lineage kept
  in memory, to time the lineage work of each mode (best of 3,
  ``subzero.tuning.FAST_OP_REPEATS``, only when that run is fast: a mode that takes
  seconds is timed once);
* counts what ``lwrite`` produced (pairs, cells on each side, payload bytes);
* encodes a sample of the pairs with every candidate encoding and direction
  into a scratch store and extrapolates bytes and write time to all pairs.
  Sampling matters for operators with a million pairs; a small lineage is
  encoded whole, so its prediction is exact (a sample too small to extrapolate
  grows in one step to the size it needs, or to all pairs);
* reads each strategy's sample back through its index and by a scan, timed in
  CPU seconds (``sampleread.py``): the operator's own decode rate, which the
  cost model compares with its prediction (calibration is synthetic lineage).

The last two (the pricing, most of a profile's work) run in a forked child beside the
run on a machine with two cores or more (``Profiler._beside``): the run goes on with
its next operator meanwhile.  The run's own time (the profile's no-lineage runtime)
then counts only what the profiler did in the run's process.
"""

from __future__ import annotations

import math
import os
import pickle
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from subzero.capture.buffer import Pairs, empty_pairs
from subzero.capture.runner import run_operator, shape_of
from subzero.engines.lineage import space_stats, store_lineage
from subzero.engines.stats import OpStats
from subzero.forked import ChildWatch, cores, fork_child
from subzero.model.cells import csr_take, lengths_to_offsets, unique
from subzero.model.modes import Mode
from subzero.model.operator import Operator, lineage_reproducible, map_p_vectorized, reruns
from subzero.model.strategy import DIRECTIONS, ENCODINGS, Direction, Strategy, default_for
from subzero.model.workflow import load_workflow
from subzero.query.reexec import capture_mode
from subzero.scratch import scratch
from subzero.storage.encodings import REC_PAIRS
from subzero.storage.lineage import LineageStore
from subzero.tuning import (
    BESIDE_POLL_S,
    BESIDE_STALL_S,
    FAST_OP_REPEATS,
    FAST_OP_S,
    KEY_BITS,
    PROFILE_BATCH_BYTES,
    PROFILE_BATCH_JOBS,
    PROFILE_BESIDE,
    PROFILE_BESIDE_MEMORY,
    PROFILE_KEEP_MEMORY_SHARE,
    PROFILE_KEEP_PAIRS_BYTES,
    PROFILE_KEEP_STORED_BYTES,
    SAMPLE_CELLS,
    SAMPLE_PAIRS,
    SMALL_SAMPLE_BYTES,
    WIDE_SAMPLE_PAIRS,
)

from .sampleread import Unread, index_keys, time_reads

LWRITE_MODES = (Mode.FULL, Mode.PAY, Mode.COMP)


def lineage_modes(op) -> list[Mode]:
    """The lwrite modes an operator can be asked for (Comp needs mapping functions)."""
    sup = op.supported_modes()
    return [m for m in LWRITE_MODES if m in sup and (m is not Mode.COMP or op.has_mapping())]


def take_pairs(p: Pairs, rows: np.ndarray) -> Pairs:
    """The given pairs (rows) of ``p``, as a Pairs of their own."""
    def part(c, o):
        return csr_take(c, o, rows), lengths_to_offsets(o[rows + 1] - o[rows])
    out, off = part(p.out, p.out_off)
    if p.pay_ids is not None:
        return Pairs(out, off, pay_ids=p.pay_ids[rows], payloads=p.payloads)
    ins = [part(c, o) for c, o in zip(p.ins, p.in_offs)]
    return Pairs(out, off, [c for c, _ in ins], [o for _, o in ins])


def candidates(m: Mode) -> list[Strategy]:
    """The stored strategies of mode ``m`` a profile prices, in the profile's order."""
    return [Strategy(m, enc, d) for enc in ENCODINGS[m] for d in DIRECTIONS]


#: Modules a pricing child imports on first use (the R-tree writer and reader import
#: rtree lazily, to keep the CLI's start light).  A child is forked from a thread while
#: the run goes on: had the run's own thread been importing one of them at that instant,
#: the child would inherit the module half made and its import lock held by a thread it
#: does not have, and wait for it forever (seen at genomics 1,000x: a child stuck in
#: ``from rtree import index`` while the run wrote its first R-tree).  Imported before
#: each fork, which waits for an import under way to finish.  ``tests/test_profile_beside.py``
#: checks that pricing imports nothing else.  ``numpy.random``: the sample reads draw their
#: cells with it, and a run whose arrays are numpy no longer imports it before (xarray and
#: pandas did).
CHILD_IMPORTS = ("rtree.index", "numpy.random")


#: the file a profiler makes beside its children's folders when the run has ended
#: (``Profiler._read_now``)
RUN_ENDED = "run-ended"


@dataclass
class _Job:
    """One strategy of one operator to price: its pairs of the strategy's lineage mode,
    and the profile record (``rec``) the price goes into."""
    name: str
    op: Operator
    mode: Mode
    pairs: Pairs
    strategy: Strategy
    out_shape: tuple
    in_shapes: list
    rec: dict
    #: read the sample as it is written, whenever that is (else it is read then only
    #: while the run goes on, and otherwise waits in the profile's ``Unread``)
    read: bool = True
    #: price it from one sample, never grown, and leave it unread: a solve that chooses
    #: it has it priced again on all its pairs (``Profiler.rough``)
    rough: bool = False


def _available() -> int | None:
    """Bytes of memory this machine has available now, or None where /proc cannot say."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def _room_for(jobs: list[_Job]) -> bool:
    """Whether memory left on this machine holds ``PROFILE_BESIDE_MEMORY`` times the
    jobs' pairs: a child's samples and reads beside the run's next operator.  Unknown
    (no /proc/meminfo): no."""
    need = PROFILE_BESIDE_MEMORY * sum(_job_bytes(job) for job in jobs)
    avail = _available()
    return avail is not None and need < avail


def _pairs_bytes(p: Pairs) -> int:
    arrays = [p.out, p.out_off, *(p.ins or ()), *(p.in_offs or ())]
    if p.pay_ids is not None:
        arrays.append(p.pay_ids)
    return int(sum(np.asarray(a).nbytes for a in arrays if a is not None))


def _job_bytes(job: _Job) -> int:
    """The bytes pricing ``job`` works on: its pairs', or, for payload pairs, at least the
    cells of the operator's Full pairs (8 bytes each) when the profile captured them.
    Pricing a payload strategy expands each payload to its input cells (``map_p``), so
    its pairs' own bytes say little: genomics' ``model`` at 1,000x has 70 Pay pairs in
    1.7 KB whose four strategies took 8.4 s to price, in the run's process, while the
    run waited (its 70 Full pairs, 61 MB, were priced beside it)."""
    return max(_pairs_bytes(job.pairs), 8 * _expanded_cells(job))


def _job_cells(job: _Job) -> int:
    """The cells pricing ``job`` encodes: its pairs', or, for payload pairs, at least the
    cells of the operator's Full pairs (what its payloads expand to, as ``_job_bytes``)."""
    return max(job.pairs.n_cells(), _expanded_cells(job))


def _expanded_cells(job: _Job) -> int:
    """For payload pairs, the cells of the operator's Full pairs when the profile
    captured them (what ``map_p`` expands the payloads to); else 0."""
    if not job.pairs.is_payload:
        return 0
    full = job.rec.get("modes", {}).get(Mode.FULL.value) or {}
    return int(full.get("cells") or 0)


def _sampled(job: _Job, size: int) -> bool:
    """Whether a rough price of ``job`` encodes a sample of its pairs (more than ``size``
    pairs, or few wide ones), not all of them: only then is it rough.  Lineage priced
    whole either way (genomics 1x's) is priced as any profile prices it, its sample read
    beside the run while it goes on."""
    return job.pairs.n > size or _wide_rows(job.pairs.n, _job_cells(job)) is not None


def _wide_rows(n: int, cells: int, rough: bool = False) -> np.ndarray | None:
    """The pairs of a sample of lineage made of few, wide pairs, or None when it is not:
    at most ``SAMPLE_PAIRS`` pairs (encoded whole otherwise) holding more than
    ``SAMPLE_CELLS`` cells.  Genomics' ``model`` at 1,000x has 70 pairs of 110,000 cells:
    encoded whole, each of its strategies took 0.3-1.5 s to write and as long to read, most
    of what a budget run waited for after its last operator.  A sample of whole pairs,
    spread evenly, of about ``SAMPLE_CELLS`` cells (at least ``WIDE_SAMPLE_PAIRS`` and a
    quarter of the pairs, and at most half of them: the prediction extrapolates from it
    and from its half), grown once, as any sample, when it fills only a few LMDB pages
    (``_encode``); a ``rough`` price (``Profiler.rough``) takes no quarter of the pairs
    (at 10,000x a quarter of ``model``'s pairs is 19 million cells, and its rough R-tree
    prices took 1-4 s each).  Not for R-tree strategies (``_encode``): at 10,000x, with samples of 4
    of ``model``'s 70 pairs, the plan stored its FullMany backward, priced BQ0 at 1.1 s
    and took 2.8 s (1.8x the defaults'); an R-tree's reads need not scale from a few
    of its pairs."""
    if n > SAMPLE_PAIRS or cells <= SAMPLE_CELLS:
        return None
    least = WIDE_SAMPLE_PAIRS if rough else max(WIDE_SAMPLE_PAIRS, -(-n // 4))
    k = max(least, int(n * SAMPLE_CELLS // cells))
    return None if 2 * k > n else _spread(n, k)


def _spread(n: int, k: int) -> np.ndarray:
    """``k`` consecutive of ``n`` rows, in the middle: consecutive pairs share key blocks
    as all of them do (pairs taken every few rows each filled blocks of their own, and a
    forward FullOne sample extrapolated to 2.2x its bytes)."""
    start = (n - k) // 2
    return np.arange(start, start + k, dtype=np.int64)


def _sample_rows(n: int, size: int) -> np.ndarray:
    """``size`` pairs in runs of REC_PAIRS spread evenly over all ``n`` (keeps locality)."""
    runs = max(1, size // REC_PAIRS)
    starts = np.linspace(0, n - REC_PAIRS, runs).astype(np.int64)
    # the runs in order, each cut where the next begins: their union without a sort
    # (np.unique of the runs' rows was 1.9 s of a 28 s budget run of astronomy)
    lens = np.minimum(np.diff(starts, append=starts[-1] + REC_PAIRS), REC_PAIRS)
    offs = np.cumsum(lens) - lens
    return np.repeat(starts - offs, lens) + np.arange(int(lens.sum()), dtype=np.int64)


class Profiler:
    """The driver loop's profiling hook (``store.run(..., profiler=...)``, local engine)."""

    def __init__(self, scratch: Path, sample_pairs: int = SAMPLE_PAIRS, all_ops: bool = False,
                 read_samples: bool = True, beside: bool = False, keep_pairs: bool = False,
                 defer_reads: bool = False, rough: bool = False):
        self.scratch = LineageStore(scratch)
        self.beside_dir = Path(scratch).with_name(Path(scratch).name + "-beside")
        #: price strategies in a child process beside the run (``_beside``)
        self.cores = cores()
        self.beside = beside and hasattr(os, "fork") and self.cores >= 2
        self._queue: list[_Job] = []
        #: children pricing: (pid, result folder, the jobs it was given)
        self._running: list[tuple[int, Path, list[_Job]]] = []
        #: pid -> the watch of its CPU time: a child idle for ``BESIDE_STALL_S`` is
        #: stuck (``_stalled``)
        self._progress: dict[int, ChildWatch] = {}
        #: jobs a child did not price (it failed, died or was stuck): priced here
        self.repriced = 0
        self._done: list[tuple[tuple[int, Path, list[_Job]], int]] = []   # children that ended
        self._here: list[_Job] = []         # jobs to price in this process (no memory)
        self._limit = self.cores - 1        # children: this process is the other worker
        self._ended = False                 # the run has ended: this process prices too
        self._lock = threading.Lock()
        self._feeding = False
        self._feeder: threading.Thread | None = None
        self._forks = 0
        self.arrays_dir = Path(scratch).with_name(Path(scratch).name + "-arrays")
        self.read_samples = read_samples
        #: read only the samples of each operator's defaults as they are written; the
        #: others wait in ``unread`` (``sampleread.Unread``) until a solve chooses them
        self.defer_reads = defer_reads
        self.unread: dict[tuple[str, str], dict] = {}
        #: price an operator's strategies other than its defaults roughly while the run
        #: goes on, when their pairs are kept for the run made from it (``_keep``): from one
        #: sample, not grown to fill pages nor encoded whole when small in bytes, and for an
        #: R-tree from a few wide pairs as the others.  A plan stores only a few of them;
        #: those a solve chooses are priced again as any profile prices (``_encode``) on the
        #: pairs kept, and read (``sampleread.Unread``), before the plan is chosen on them.
        #: Pricing every candidate in full was most of a budget run's CPU time (genomics
        #: 1,000x: 4.5 of the 6.8 s its encodes took were strategies no plan chose)
        self.rough = rough and keep_pairs and defer_reads
        self.all_ops = all_ops
        self.sample_pairs = sample_pairs
        self.ops: dict[str, dict] = {}
        self.seconds = 0.0          # time spent profiling (not part of the workflow's runtime)
        self._n = 0
        self._captured = None       # what the operator's own step captured (driver.Captured)
        #: (operator, mode) -> lineage pairs kept for the run made from the profiling run
        #: (``keep_pairs``, ``subzero.runs.planned``): of a mode the run did not store,
        #: captured by re-running the operator (that run stores them instead of running the
        #: operator again); of a mode it stored, its own (not read back from its lineage)
        self.pairs: dict[tuple[str, str], Pairs] = {}
        self.keep_pairs = keep_pairs
        self._kept = {False: 0, True: 0}    # bytes kept of modes the run did not / did store
        #: array -> SHA-256 of each chunk's values as the run wrote them (``keep_pairs``):
        #: the run made from this one links those chunks, and its drop of an array it does
        #: not keep takes their sums from here instead of reading them back
        self.sums: dict[str, dict[int, bytes]] = {}

    def close(self) -> None:
        """Release the scratch store; children still pricing (the run failed) are stopped
        and nothing more is started."""
        with self._lock:
            self._queue.clear()
            for pid, path, _jobs in self._running:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
                shutil.rmtree(path, ignore_errors=True)
            self._running.clear()
        self.scratch.close()

    def __call__(self, name: str, op, inputs: list, out, run_s: float, captured=None,
                 arrays=None) -> None:
        t0 = time.perf_counter()
        self._captured = captured
        try:
            self.ops[name] = self._profile(name, op, inputs, out, run_s)
            self.ops[name]["drop_saves"] = self._drop_saves(name, out, arrays)
            if self.keep_pairs and arrays is not None:
                sums = arrays.chunk_sums(name)
                if sums is not None:
                    self.sums[name] = sums
        finally:
            self.seconds += time.perf_counter() - t0

    def _drop_saves(self, name: str, out, arrays=None) -> int:
        """Bytes not keeping the operator's array frees in a run: its stored chunks, as
        the run's array store (``arrays``) has just written them (compressed), less the
        checksums a dropped array keeps instead.  Read there as the step ends: the
        profiling run may drop the array when it ends (``--keep auto``).  Without the
        run's store (an engine that does not hand it over) or the array in it, the array
        is written to a scratch folder and measured there (2.4 s of the profiling run at
        genomics 1,000x, every array written twice)."""
        from subzero.runs.keep import drop_saving
        from subzero.storage.arrays import ArrayStore
        try:
            if arrays is not None and arrays.path(name).exists():
                return drop_saving(arrays, name)
        except Exception:               # measured the other way
            pass
        folder = self.arrays_dir
        try:
            scratch = ArrayStore(folder)
            scratch.write(name, out)
            return drop_saving(scratch, name)
        except Exception:               # measured another way (its size in memory)
            return 0
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _profile(self, name, op, inputs, out, run_s) -> dict:
        in_shapes = [shape_of(x) for x in inputs]
        out_shape = shape_of(out)
        mode = capture_mode(op)
        own = default_for(op)
        rec = {"class": type(op).__name__, "in_shapes": [list(s) for s in in_shapes],
               "out_shape": list(out_shape),
               "in_bytes": int(sum(np.asarray(x).nbytes for x in inputs)),
               "out_bytes": int(np.asarray(out).nbytes),
               "supports": sorted(m.value for m in op.supported_modes()),
               "has_mapping": op.has_mapping(),
               "all_to_all": [bool(op.is_all_to_all(i)) for i in range(len(inputs))],
               "map_p_batched": bool(op.map_p_batched),
               "map_p_vectorized": map_p_vectorized(op),
               "deterministic": lineage_reproducible(op), "reruns": reruns(op),
               "reexec_mode": mode.value if mode else None, "modes": {}, "strategies": {},
               "defaults": [str(s) for s in own if s.stored]}
        reps = FAST_OP_REPEATS if run_s < FAST_OP_S else 1
        if self._captured is None:
            base = min([run_s] + [self._time(name, op, inputs, ())[0] for _ in range(reps - 1)])
        else:          # the step's time includes making its lineage: timed once without
            base = min(self._time(name, op, inputs, ())[0] for _ in range(max(reps - 1, 1)))
        rec["run_s"] = base
        mapped = Mode.MAP in op.supported_modes() and op.has_mapping()
        rec["profiled"] = self.all_ops or not mapped
        for m in (lineage_modes(op) if rec["profiled"] else []):
            best, pairs, lw = self._time_mode(name, op, inputs, m)
            if pairs is None:
                pairs = empty_pairs(len(inputs), m is not Mode.FULL)
            self._keep(name, op, m, pairs)
            # priced on the pairs kept when there are (a stored mode's: its step's own, of
            # which a fast operator's re-run for its timing made a copy): a rough price is
            # priced again on them, and the copy is freed
            kept = (name, m.value) in self.pairs
            pairs = self.pairs.get((name, m.value), pairs)
            # a slow operator's own jitter can hide its lineage work: lwrite time is a floor
            info = {"run_s": best, "gen_s": max(lw, best - base), "pairs": pairs.n,
                    "out_cells": int(pairs.out.size),
                    "in_cells": [int(a.size) for a in pairs.ins],
                    "cells": pairs.n_cells()}
            if pairs.is_payload and pairs.n:
                lens = np.array([len(p) for p in pairs.payloads], np.int64)
                info["payload_bytes"] = float(lens[pairs.pay_ids].mean())
                info["payloads"] = int(unique(pairs.pay_ids).size)   # np.unique imports numpy.ma
            rec["modes"][m.value] = info
            for s in candidates(m):             # a job each: children share them out
                job = _Job(name, op, m, pairs, s, out_shape, in_shapes, rec)
                job.rough = self.rough and kept and s not in own and _sampled(job, self.sample_pairs)
                job.read = not self.defer_reads or s in own     # a rough job: see _read_now
                if not self._beside(job):
                    self._merge(job, self._price(job))
        return rec

    def _keep(self, name: str, op, m: Mode, pairs: Pairs) -> None:
        """Keep the pairs of mode ``m`` in memory for the run made from this one:

        * a mode the run did not store: ``pairs``, when the operator's lineage is the same
          on every run of it (pairs from a re-run describe the run's own output) and they
          fit ``PROFILE_KEEP_PAIRS_BYTES`` with those kept before (else that run runs the
          operator again for them);
        * a mode the run stored: the pairs its own step captured (what it encoded), when
          they fit ``PROFILE_KEEP_STORED_BYTES`` (else that run reads them back from the
          run's lineage: 1.7 s of the budget run at genomics 1,000x, 3.7 s at 10,000x).

        Each only while it is at most a ``PROFILE_KEEP_MEMORY_SHARE``-th of the memory the
        machine has available as it is kept (pairs kept are pairs the run does not free)."""
        c = self._captured
        if not self.keep_pairs:
            return
        stored = c is not None and m in c.modes
        if c is not None and stored:
            own = c.pay if m in (Mode.PAY, Mode.COMP) else c.full
            if own is None:
                return
            pairs = own
        elif not lineage_reproducible(op):
            return
        size = _pairs_bytes(pairs) + sum(len(b) for b in (pairs.payloads or ()))
        limit = PROFILE_KEEP_STORED_BYTES if stored else PROFILE_KEEP_PAIRS_BYTES
        if self._kept[stored] + size > limit:
            return
        avail = _available()           # never more than a share of what the machine has
        if avail is None or size > avail // PROFILE_KEEP_MEMORY_SHARE:
            return
        self._kept[stored] += size
        self.pairs[(name, m.value)] = pairs

    def _price(self, job: "_Job") -> dict:
        """The job's strategy priced on samples of its pairs."""
        s = job.strategy
        return {str(s): self._encode(job.name, job.op, s, job.pairs, job.out_shape,
                                     job.in_shapes, read=self._read_now(job),
                                     cells=_job_cells(job), rough=job.rough)}

    def _read_now(self, job: "_Job") -> bool:
        """Whether to read ``job``'s sample as it is written: always for a job that says so
        (``defer_reads`` off, or an operator's default), else only while the run goes on.
        Reads beside the run cost the run nothing (at genomics 1x the whole pricing fits
        beside it, and deferring its reads made the budget run no faster); a read once the
        run has ended is waited for, and a plan reads only the samples it chooses.  A
        child learns that the run has ended from a file its parent makes (``RUN_ENDED``).
        Never a rough price's sample: the plan reads the one it prices again."""
        if job.rough:
            return False
        if job.read:
            return True
        return not self._ended and not (self.beside_dir / RUN_ENDED).exists()

    def _merge(self, job: "_Job", priced: dict) -> None:
        rec, m = job.rec, job.mode
        for s, v in priced.items():       # a sample left unread: where it is, not in the profile
            pending = v.pop("unread", None)
            if pending is not None:
                self.unread[(job.name, s)] = {**pending, "op": job.op, "strategy": job.strategy,
                                              "out_shape": job.out_shape,
                                              "in_shapes": job.in_shapes}
                if v.get("rough"):      # priced again on these (kept for the made run too)
                    self.unread[(job.name, s)].update(pairs=job.pairs, cells=_job_cells(job),
                                                      sample_pairs=self.sample_pairs)
                v["unread"] = True
        rec["strategies"].update(priced)
        first = f"{m.value}:{ENCODINGS[m][0]}:forward"
        if m is not Mode.FULL and first in priced:   # cells map_p expands payloads to, per input
            rec["modes"][m.value]["expanded"] = [
                priced[first]["spaces"].get(f"f{i}", {}).get("key_cells", 0)
                for i in range(len(job.in_shapes))]

    # -- pricing beside the run ---------------------------------------------------------
    def _beside(self, job: "_Job") -> bool:
        """Price ``job`` in a forked child while the run goes on (False: price it in this
        process).  The samples' writes and timed reads are most of a profile (11 of 19 s
        at genomics 1,000x) and one core's work; the run uses one core too, so on two
        the children's work is hidden behind the operators after it.  Jobs wait in a
        queue that a thread of this process feeds to children as they finish (one child
        fewer than the cores; once the run has ended this process takes jobs from the
        queue too: :meth:`finish`); fed only
        at the next operator's end, the queue stood still through a 2 s operator.  A
        child takes the jobs queued when it starts, up to ``PROFILE_BATCH_BYTES`` of
        them (:meth:`_batch`): small jobs share a child, whose fork, store and exit cost
        more than one of them (at genomics 1x, a child each made the budget run take
        1.3x the CPU time), and a large one has a child of its own.  Jobs whose pairs the
        machine's free memory could not hold ``PROFILE_BESIDE_MEMORY`` times over are
        priced in this process at the end.  The children time their reads in their own
        CPU seconds, as this process would."""
        if not self.beside:
            return False
        with self._lock:
            self._queue.append(job)
            self._wake()
        return True

    def _batch(self, free: int) -> "list[_Job]":
        """The queued jobs the next child takes (called with the lock held): the first,
        then the next ones while their bytes together (``_job_bytes``) stay under
        ``PROFILE_BATCH_BYTES``, at most ``PROFILE_BATCH_JOBS`` of them and at most an
        even share of the queue among the ``free`` children that can start now and,
        once the run has ended, this process (:meth:`finish`): the run's last operators'
        jobs are shared out, not given to one child while the other core waits."""
        workers = max(free, 1) + (1 if self._ended else 0)
        share = min(-(-len(self._queue) // workers), PROFILE_BATCH_JOBS)
        jobs = [self._queue.pop(0)]
        size = _job_bytes(jobs[0])
        while self._queue and len(jobs) < share:
            more = _job_bytes(self._queue[0])
            if size + more >= PROFILE_BATCH_BYTES:
                break
            jobs.append(self._queue.pop(0))
            size += more
        return jobs

    def _wake(self) -> None:
        """Start the feeding thread unless it runs (called with the lock held)."""
        if not self._feeding:
            self._feeding = True
            self._feeder = threading.Thread(target=self._feed, name="subzero-profile-beside",
                                            daemon=True)
            self._feeder.start()

    def _feed(self) -> None:
        """Reap finished children and start queued jobs while fewer than the limit run;
        return when there is nothing left to do (``_wake`` starts it again)."""
        while True:
            with self._lock:
                for child in list(self._running):
                    done, status = os.waitpid(child[0], os.WNOHANG)
                    if done:
                        self._running.remove(child)
                        self._progress.pop(child[0], None)
                        self._done.append((child, status))
                    elif self._stalled(child[0]):
                        os.kill(child[0], signal.SIGKILL)   # reaped above, priced here
                while self._queue and len(self._running) < self._limit:
                    jobs = self._batch(self._limit - len(self._running))
                    started = self._fork(jobs) if _room_for(jobs) else None
                    if started is None:
                        self._here.extend(jobs)
                    else:
                        self._running.append(started)
                if not self._running and not self._queue:
                    self._feeding = False
                    return
            time.sleep(BESIDE_POLL_S)

    def _stalled(self, pid: int) -> bool:
        """Whether child ``pid`` has used no CPU time for ``BESIDE_STALL_S`` while not
        waiting on the disk: stuck on a lock it inherited (see ``CHILD_IMPORTS``), which
        would otherwise hold the run's end forever.  Never, where /proc cannot say."""
        watch = self._progress.get(pid)
        if watch is None:
            watch = self._progress[pid] = ChildWatch(pid, BESIDE_STALL_S)
        return watch.stuck()

    def idle(self) -> bool:
        """Whether no child is pricing and no job is queued (after :meth:`ended`, none is
        started until :meth:`finish`): the cores are this process's."""
        with self._lock:
            return not self._feeding and not self._queue

    def ended(self) -> None:
        """The run's last operator has ended: samples not read yet wait for a plan to choose
        them (``_read_now``), in this process and in the children, which learn it from
        the file made here (``RUN_ENDED``)."""
        with self._lock:
            self._ended = True
        if self.defer_reads:
            try:                               # children defer the reads they have not begun
                self.beside_dir.mkdir(parents=True, exist_ok=True)
                (self.beside_dir / RUN_ENDED).touch()
            except OSError:
                pass

    def finish(self) -> None:
        """Every operator priced: the queue drained by the children and, now that the run
        has ended, by this process as well (a job at a time, so the last ones go to
        whichever worker is free; a child per core with this process waiting left one
        core idle behind the child with the most jobs), every child waited for and its
        prices merged (a child that failed or died has its jobs priced here), the jobs
        no child took priced here, and each operator's prices in the candidates' order."""
        self.ended()
        if self._feeder is not None:
            with self._lock:
                self._wake()
            while True:
                with self._lock:
                    job = self._queue.pop(0) if self._queue else None
                if job is None:
                    break
                self._merge(job, self._price(job))
            while self._feeder.is_alive():
                self._feeder.join(timeout=1.0)
        done, here = self._done, self._here
        self._done, self._here = [], []
        for child, status in done:
            self._merge_child(child, status)
        for job in here:
            self._merge(job, self._price(job))
        order = {str(c): k for k, c in enumerate(
            c for mode in LWRITE_MODES for c in candidates(mode))}
        for rec in self.ops.values():   # in the candidates' order, whichever was priced first
            rec["strategies"] = dict(sorted(rec["strategies"].items(),
                                            key=lambda kv: order.get(kv[0], len(order))))

    def _fork(self, jobs: "list[_Job]") -> "tuple[int, Path, list[_Job]] | None":
        """A child pricing ``jobs`` into a result file of its own: (pid, folder, jobs), or
        None when no process could be made."""
        self._forks += 1
        path = self.beside_dir / f"{self._forks}-{jobs[0].name}"
        path.mkdir(parents=True, exist_ok=True)

        def price() -> list[tuple[str, object]]:      # in the child
            self.scratch = LineageStore(path / "scratch")   # never the parent's
            out: list[tuple[str, object]] = []
            for job in jobs:                  # a job that fails is priced by the parent
                try:
                    out.append(("ok", self._price(job)))
                except Exception as e:
                    out.append(("error", f"{type(e).__name__}: {e}"))
            return out
        # a child that fails as a whole leaves no result: the parent prices every job
        pid = fork_child(path / "result.pkl", price, CHILD_IMPORTS)
        if pid is None:
            return None
        return pid, path, jobs

    def _merge_child(self, child, status: int) -> None:
        """What a finished child priced; the jobs a child did not price (it failed on
        them, or died) are priced here instead (a profile never misses an operator)."""
        _pid, path, jobs = child
        try:
            results = pickle.loads((path / "result.pkl").read_bytes())
        except Exception:
            results = []
        if any(isinstance(v, dict) and any("unread" in p for p in v.values())
               for _kind, v in results):
            (path / "result.pkl").unlink(missing_ok=True)   # its store holds samples to read
        else:
            shutil.rmtree(path, ignore_errors=True)
        for k, job in enumerate(jobs):
            kind, value = results[k] if k < len(results) else ("error", f"exit status {status}")
            if kind == "ok" and isinstance(value, dict):
                self._merge(job, value)
            else:
                self.repriced += 1
                self._merge(job, self._price(job))

    def _time_mode(self, name, op, inputs, m: Mode):
        """(seconds, pairs, lwrite seconds) of one run capturing mode ``m``: best of
        ``FAST_OP_REPEATS`` when that run is fast (timer noise), else the one run -- a
        lineage mode that takes seconds is measured well enough once, and re-running it
        is what made profiling cost several workflow runs."""
        probe = (Strategy(m, ENCODINGS[m][0], Direction.BACKWARD),)
        best = self._from_run(m)
        if best is None:
            best = self._time(name, op, inputs, probe)
        for _ in range(FAST_OP_REPEATS - 1 if best[0] < FAST_OP_S else 0):
            t = self._time(name, op, inputs, probe)
            if t[0] < best[0]:
                best = t
        return best

    def _from_run(self, m: Mode):
        """(seconds, pairs, lwrite seconds) of mode ``m`` as the operator's own step in the
        profiling run captured it (it stores the operator's defaults), or None: a mode
        that takes seconds is not run again for its pairs.  Only a step that captured
        ``m`` alone: its time is then that mode's."""
        c = self._captured
        if c is None or c.modes != frozenset({m}):
            return None
        pairs = c.pay if m in (Mode.PAY, Mode.COMP) else c.full
        return (c.run_s, pairs, c.lwrite_s) if pairs is not None else None

    @staticmethod
    def _time(name, op, inputs, strategies):
        t0 = time.perf_counter()
        _out, full, pay, ctx = run_operator(name, op, inputs, strategies, capture=bool(strategies))
        dt = time.perf_counter() - t0
        return dt, (pay if strategies and strategies[0].payload else full), ctx.lwrite_seconds

    def _write(self, name, op, s, pairs, out_shape, in_shapes) -> dict:
        self._n += 1
        st = OpStats(name, "", [], [], out_shape)
        full, pay = (None, pairs) if s.payload else (pairs, None)
        key = f"{name}#{self._n}"
        store_lineage(key, op, (s,), full, pay, out_shape, in_shapes, self.scratch, st)
        return {**st.per_strategy[0], "key": key}

    def _reads(self, name, op, s, w, pairs, out_shape, in_shapes, read: bool = True) -> dict:
        """The sample's own index read and scan, timed (``sampleread``): ``{"sample": ...}``;
        when not ``read`` now, where to read them later instead (``{"unread": ...}``,
        which :meth:`_merge` moves to ``unread``).  The index keys a later read asks go in
        a file beside the sample, not in memory (the pairs are dropped once priced)."""
        if not self.read_samples:
            return {"sample": None}
        keys = index_keys(s, pairs)
        if read:
            return {"sample": time_reads(self.scratch, w["key"], name, op, s, keys, out_shape,
                                         in_shapes, w["spaces"])}
        kept = None
        if keys is not None:
            kept = self.scratch.path / f"keys-{w['key'].replace('#', '-')}.npy"
            np.save(kept, keys)
        return {"sample": None, "unread": {"store": str(self.scratch.path), "key": w["key"],
                                           "keys": None if kept is None else str(kept),
                                           "spaces": w["spaces"]}}

    def _encode(self, name, op, s, pairs, out_shape, in_shapes, read: bool = True,
                cells: int | None = None, rough: bool = False) -> dict:
        """Bytes, write seconds and space sizes of ``s`` over all pairs, from a sample
        (``cells``: the cells encoding all pairs works on, when more than their own:
        ``_job_cells``).  ``rough``: from the first sample, however few pages it fills,
        and an R-tree's from a few wide pairs too (:attr:`rough`); its price then says
        ``"rough"`` and its sample is left unread."""
        n, size = pairs.n, self.sample_pairs
        rows = None if s.many and not rough else _wide_rows(
            n, pairs.n_cells() if cells is None else cells, rough)
        wide = rows is not None
        if rows is not None:                   # few, wide pairs: a few of them
            sample = take_pairs(pairs, rows)
            big = self._write(name, op, s, sample, out_shape, in_shapes)
            if big["bytes"] < SMALL_SAMPLE_BYTES and not rough:   # a few pages: grow it once
                want = int(len(rows) * SMALL_SAMPLE_BYTES / max(big["bytes"], 1.0) * 1.25)
                rows = None if 2 * want > n else _spread(n, want)
                if rows is None:
                    size = n                   # all pairs, below
                else:
                    sample = take_pairs(pairs, rows)
                    big = self._write(name, op, s, sample, out_shape, in_shapes)
            if rows is not None:
                half = rows[: len(rows) // 2]
        while rows is None:
            if n <= size:
                w = self._write(name, op, s, pairs, out_shape, in_shapes)
                return {"bytes": w["bytes"], "write_s": w["write_s"], "spaces": w["spaces"],
                        "exact": True,
                        **self._reads(name, op, s, w, pairs, out_shape, in_shapes, read)}
            picked = _sample_rows(n, size)
            sample = take_pairs(pairs, picked)
            big = self._write(name, op, s, sample, out_shape, in_shapes)
            if big["bytes"] >= SMALL_SAMPLE_BYTES or rough:
                rows, half = picked, picked[: len(picked) // 2]
                break
            # a few LMDB pages extrapolate badly; small lineage is cheap to encode.  Grow
            # straight to the size whose bytes should reach SMALL_SAMPLE_BYTES (at least
            # 4x), and to all pairs when that is most of them: each sample is encoded
            # afresh, so stepping up 4x at a time encoded the pairs ~1.7 times over
            want = size * SMALL_SAMPLE_BYTES / max(big["bytes"], 1.0) * 1.25
            size = int(max(size * 4, want))
            if 2 * size > n:
                size = n
        small = self._write(name, op, s, take_pairs(pairs, half), out_shape, in_shapes)
        scale = n / len(rows)
        spaces = space_stats(s, pairs, out_shape, in_shapes)
        for sp, d in big["spaces"].items():           # map_p expansions: only sampled
            if s.payload and s.direction == "forward":
                spaces[sp] = {**d, "pairs": int(d["pairs"] * scale),
                              "key_cells": int(d["key_cells"] * scale),
                              "key_blocks": int(min(d["key_blocks"] * scale,
                                                    -(-d["key_size"] // 2**KEY_BITS))),
                              "value_cells": int(d["value_cells"] * scale),
                              "record_cells": int(d["record_cells"] * scale)}
        grow = _power if wide else _extrapolate
        return {"bytes": int(grow(small["bytes"], big["bytes"], len(half), len(rows), n)),
                "write_s": grow(small["write_s"], big["write_s"], len(half), len(rows), n),
                "spaces": spaces, "exact": False, "sample_frac": len(rows) / n,
                **({"rough": True} if rough else {}),
                **self._reads(name, op, s, big, sample, out_shape, in_shapes, read and not rough)}


def _power(y1: float, y2: float, n1: int, n2: int, n: int) -> float:
    """A sample of few wide pairs grown to all ``n``: through the two sample sizes as a
    power of the pairs, its exponent between 0 and 1 (never above linear).  Wide pairs'
    keys interleave (genomics' ``model``: each of its 70 pairs spans the input), so a
    few of them fill key blocks that all of them share: linear, the forward strategies
    of ``model`` at 1,000x came out 1.5-1.9x their bytes."""
    if y1 <= 0 or y2 <= 0 or n2 <= n1:
        return _extrapolate(y1, y2, n1, n2, n)
    b = min(1.0, max(0.0, math.log(y2 / y1) / math.log(n2 / n1)))
    return max(y2 * (n / n2) ** b, y2)


def _extrapolate(y1: float, y2: float, n1: int, n2: int, n: int) -> float:
    """Linear through two sample sizes (fixed overhead + per pair), never below proportional
    scaling's lower bound."""
    slope = max(0.0, (y2 - y1) / max(n2 - n1, 1))
    fixed = max(0.0, y2 - slope * n2)
    return max(fixed + slope * n, y2)


def _profiling_strategies(op) -> str:
    """What the profiling run stores for ``op``: nothing where mapping functions answer;
    else its declared default when that stores lineage -- the workload is measured by
    tracing this run, and black-box re-execution made that most of the profile's time
    at cohort scale (BlackBox traces of seconds each at 1,000x, minutes at 10,000x),
    where the defaults answer in milliseconds -- else black-box."""
    if Mode.MAP in op.supported_modes() and op.has_mapping():
        return "map"
    own = default_for(op)
    return "+".join(str(s) for s in own) if any(s.stored for s in own) else "blackbox"


def _price_again(folder: Path, name: str, pending: dict) -> dict:
    """A strategy the profile priced roughly (``Profiler.rough``), priced as a profile
    prices every other (``Profiler._encode``) on the pairs kept, in a scratch store of
    its own (``folder``, removed after), and its sample read: its price's new fields."""
    prof = Profiler(folder / "scratch", sample_pairs=pending.get("sample_pairs", SAMPLE_PAIRS))
    try:
        return prof._encode(name, pending["op"], pending["strategy"], pending["pairs"],
                            pending["out_shape"], pending["in_shapes"], read=True,
                            cells=pending.get("cells"))
    finally:
        prof.close()
        shutil.rmtree(folder, ignore_errors=True)


def profile_workflow(store, workflow, params: dict | None = None, inputs: dict | None = None,
                     progress=None, all_ops: bool = False, read_samples: bool = True,
                     beside: bool = PROFILE_BESIDE, keep_pairs: bool = False,
                     defer_reads: bool = False, rough: bool = False,
                     while_pricing: Callable[[int, bool], None] | None = None) -> dict:
    """Run ``workflow`` once in profiling mode; save the profile in the catalog and return it.

    ``progress`` as in ``Store.run``: by default the operators done (each profiled as
    it runs) are shown when stderr is a terminal.  ``read_samples=False`` leaves out
    the timed reads of each strategy's sample (the calibration's own profile, whose
    lineage the calibration reads anyway).  ``beside``: price the strategies in child
    processes beside the run (``Profiler._beside``); the calibration, which times the
    machine itself, says False.  ``keep_pairs``: return, as ``"pairs"``, the lineage pairs
    the profiler kept in memory (``Profiler.pairs``) and, as ``"sums"``, its arrays'
    chunk sums as the run wrote them (``Profiler.sums``), for a run made from this one;
    the run then keeps every array (that run links them rather than making again those
    ``--keep auto`` would drop).  ``defer_reads``: read at once only the samples of each
    operator's defaults; the others are returned unread, as ``"unread"`` (a
    :class:`~optimizer.sampleread.Unread`, or None when none are; the caller closes it),
    and marked ``"unread"`` in the profile.  ``rough`` (with both of those): the others
    are priced roughly too, and priced again when they are read (``Profiler.rough``).
    ``while_pricing(run_id, idle)``: called once the run has ended, while the children
    price what it left queued, before this process prices its share (a budget run
    measures its workload there: :func:`optimizer.plan._measure_early`); ``idle``: no
    child is pricing and nothing is queued (:meth:`Profiler.idle`).

    Operators with mapping functions are timed but their stored strategies are not
    priced (the optimizer prefers mapping there) unless ``all_ops``."""
    wf = load_workflow(workflow, dict(params or {}))
    plain = {n: _profiling_strategies(st.operator) for n, st in wf.steps.items()}
    held = scratch("profile")          # a profile killed outright leaves nothing behind
    tmp = held.path
    try:
        prof = Profiler(tmp / "scratch", all_ops=all_ops, read_samples=read_samples,
                        beside=beside, keep_pairs=keep_pairs, defer_reads=defer_reads,
                        rough=rough)
    except BaseException:
        held.close()
        raise
    unread, ended = None, False
    try:
        t0 = time.perf_counter()
        # a run made from this one takes its arrays: kept, they are linked, not made again
        more = {"keep": "all"} if keep_pairs else {}
        run = store.run(wf, inputs=inputs, strategies=plain, profiler=prof, progress=progress,
                        **more)
        wall = time.perf_counter() - t0
        if while_pricing is not None:
            prof.ended()
            while_pricing(run.id, prof.idle())
        prof.finish()
        ended = True
    finally:
        prof.close()
        if ended and prof.unread:
            # it removes the folder when closed
            unread = Unread(tmp, prof.unread, CHILD_IMPORTS, workers=prof.cores,
                            price=_price_again, held=held)
        else:
            held.close()
    try:
        # the run's own lineage (the defaults it stored) is not part of the no-lineage time
        stored = sum(float(o.get("lwrite_s") or 0.0) + float(o.get("lineage_s") or 0.0)
                     for o in run.ops())
        base_s = max(wall - prof.seconds - stored, 1e-6)
        store.catalog.add_profile(run.id, wf.name, wf.params, base_s, prof.ops)
    except BaseException:
        if unread is not None:
            unread.close()
        raise
    return {"run_id": run.id, "base_s": base_s, "ops": prof.ops, "pairs": prof.pairs,
            "sums": prof.sums, "unread": unread}
