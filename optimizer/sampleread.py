"""Reading an operator's own lineage sample: what one stored strategy of *this*
operator costs to decode, measured while profiling.

The calibration fits the cost model on synthetic lineage.  A real operator's
lineage can decode several times slower per record block (sparse keys in a big
array, payloads whose ``map_p`` is the operator's own code), and no calibrated
feature can see that: genomics' ``extract`` lineage scanned backward cost 5-25x
its prediction, and plans built on that prediction were many times slower than
the defaults on the command line.  So the profiler, which has just written a
sample of each strategy into its scratch store, reads that sample back the two
ways a query step reads lineage — through the strategy's own index, and by a
scan of it for a step in the other direction — and keeps the CPU seconds (median
of up to ``SAMPLE_READ_REPEATS``; CPU time, since a busy machine inflates wall time).

The cost model prices the same two reads on the sample's own sizes; measured /
predicted is then that strategy's decode factor (``CostModel.own_factor``), and
how far it is from 1 is how far the calibration can vouch for the strategy
(``CostModel.vouched``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from subzero.capture.context import Context
from subzero.forked import fork_child
from subzero.heap import release
from subzero.model.cells import unique
from subzero.model.cellset import CellSet
from subzero.model.strategy import Strategy
from subzero.query import steps as run_step
from subzero.query.planner import blocks_of, runs_of
from subzero.query.relation import StepContext
from subzero.tuning import (
    SAMPLE_READ_BIG_CELLS,
    SAMPLE_READ_CELLS,
    SAMPLE_READ_OUT_CELLS,
    SAMPLE_READ_REPEATS,
    SAMPLE_SCAN_ONCE_S,
    SLOW_OBSERVATION_S,
)

from .stats import median


def _query(shape, keys: np.ndarray | None, n: int, rng) -> CellSet:
    """``n`` cells of ``shape``: cells that are keys of the sample when they are known (an
    index read then finds pairs, as a real query's does), else scattered cells.  Drawn
    as ids, never as a bitmap of the whole array: a 1,000x genomics output is 10^8 cells,
    and its bitmaps took most of the profile's time (issue 33)."""
    size = int(np.prod(shape))
    pool = None
    if keys is not None and keys.size:      # a few times n of the keys, not all of them
        pool = unique(keys[rng.choice(keys.size, min(keys.size, 4 * n), replace=False)])
    if pool is None or pool.size == 0:
        ids = rng.choice(size, min(n, size), replace=False)
    else:
        ids = rng.choice(pool, min(n, pool.size), replace=False)
    return CellSet.of_sorted(np.sort(np.asarray(ids, np.int64)), shape)


def index_keys(s: Strategy, pairs) -> np.ndarray | None:
    """The cells the strategy's index is keyed by in ``pairs`` (its outputs' for a backward
    index, its first input's for a forward one): what :func:`time_reads` asks its index."""
    if s.backward:
        return pairs.out
    return pairs.ins[0] if pairs.ins else None


def time_reads(lineage, key: str, name: str, op, s: Strategy, keys: np.ndarray | None, out_shape,
               in_shapes, spaces: dict, repeats: int = SAMPLE_READ_REPEATS) -> dict:
    """The sample's index read and scan (through input 0), each asked one cell and
    ``SAMPLE_READ_CELLS`` cells (a step's cost does not grow alike with its cells in
    every method, so one size would correct the other wrongly; fewer, or a slow scan
    once, when those reads would take seconds: :func:`_second_size`), and a FullOne or
    PayOne index read once more with up to ``SAMPLE_READ_BIG_CELLS`` (:func:`_big_size`:
    the factor of big queries, whose cost is per cell, not per block), each timed ``repeats``
    times (fewer once they add up to ``SLOW_OBSERVATION_S``), median kept, CPU seconds.
    ``key``: the sample's name in ``lineage`` (the profiler's scratch store);
    ``keys``: the cells its index is keyed by (:func:`index_keys`), which its index reads
    ask; ``spaces``: the sample's own sizes, which the cost model prices the reads by."""
    rng = np.random.default_rng(0)
    sc = StepContext(name, op, Context(name, op, frozenset(), in_shapes, out_shape),
                     out_shape, in_shapes)
    reader = lineage.reader(key, s)
    reads: list[dict] = []
    sizes = (1, SAMPLE_READ_CELLS, SAMPLE_READ_BIG_CELLS)
    for backward, n in ((b, n) for b in (s.backward, not s.backward) for n in sizes):
        shape = tuple(out_shape) if backward else tuple(in_shapes[0])
        index = backward == s.backward
        asked = keys if index else None      # an index read: ask cells the index holds
        if n > 1:
            n = _big_size(reads, index and not s.many, asked, n) \
                if n == SAMPLE_READ_BIG_CELLS else _second_size(reads[-1], index, n)
            if n <= 1:
                continue
        q = _query(shape, asked, n, rng)
        times: list[float] = []
        n_out = 0
        while len(times) < repeats and sum(times) < SLOW_OBSERVATION_S:
            reader.clear_cache()
            release()      # fresh pages, as a trace's query has (heap.py)
            c0, w0 = time.process_time(), time.perf_counter()
            res = run_step.stored(reader, s, sc, 0, backward, q)
            # CPU time is what the read costs (a busy machine inflates the wall time); a
            # wall time below it means threads shared the work
            times.append(min(time.process_time() - c0, time.perf_counter() - w0))
            n_out = len(res)
        reads.append({"backward": backward, "cells_in": len(q), "cells_out": int(n_out),
                      "blocks": blocks_of(q), "runs": runs_of(q),
                      "seconds": median(times),
                      "spread": (max(times) - min(times)) / max(median(times), 1e-9)})
    return {"spaces": spaces, "reads": reads}


def _big_size(reads: list[dict], index: bool, keys, n: int) -> int:
    """The cells of the third, large read of a FullOne or PayOne index (``index``; none,
    1, otherwise): ``n``, at most the keys the sample holds, fewer when they would return
    more than ``SAMPLE_READ_OUT_CELLS`` cells, and none when that is not 4x the second
    read or the second took ``SAMPLE_SCAN_ONCE_S`` already.  Queries of 10^5 cells
    priced from the 64-cell read's factor were 2x short: a small read pays per block, a
    large one per cell, and an operator's lineage can differ from the calibration's in
    either.  An R-tree read pays per probe, as its 64-cell read did, and 262,144 probes
    took seconds (6 of a 26 s profile at genomics 1,000x): not read again."""
    if not index or len(reads) < 2 or reads[-1]["seconds"] >= SAMPLE_SCAN_ONCE_S:
        return 1
    second = reads[-1]
    have = keys.size if keys is not None and keys.size else n     # _query draws at most these
    n = int(min(n, have, _capped(second)))
    return n if n >= 4 * second["cells_in"] else 1


def _capped(read: dict) -> float:
    """The cells a read may ask that would return at most ``SAMPLE_READ_OUT_CELLS``, at
    the rate ``read`` returned them."""
    return SAMPLE_READ_OUT_CELLS // max(read["cells_out"] / max(read["cells_in"], 1), 1.0)


def _second_size(first: dict, index: bool, n: int) -> int:
    """The cells the second, larger read of a kind asks (after ``first``, the one-cell
    read): ``n``, fewer when ``n`` of them would return more than ``SAMPLE_READ_OUT_CELLS``
    cells through the index, and none (1) after a scan of ``SAMPLE_SCAN_ONCE_S`` or more.
    A scan decodes the whole sample whatever it is asked, so a slow one is measured
    well enough once; an index read of cells that each name a million others (genomics'
    ``model`` at 10,000x) returned 70 million cells for 64.  Those two reads were 40 s
    of that profile."""
    if not index:
        return 1 if first["seconds"] >= SAMPLE_SCAN_ONCE_S else n
    return int(min(n, max(2, _capped(first))))


class Unread:
    """Samples a profile wrote and did not read yet: the reads are most of a profile's
    work (2.4 of 3.1 s of pricing at genomics 100x), and a plan keeps only a few of an
    operator's strategies, so the profiler reads at once only the samples of what a
    run without a plan stores (each operator's defaults: every run's query-time planner
    prices them from their reads) and leaves the others here, to be read when a solve
    chooses them (``optimizer.plan``).  ``pending``: (operator, strategy) -> where the
    sample lies (``store``, a scratch lineage store of the profile; ``key``, its name
    there), the file of its index keys (``keys``, or None), its own sizes (``spaces``)
    and the operator, strategy and shapes to read it with.  Owns ``folder`` (the
    profile's scratch folder) and removes it when closed.  ``child_imports``: modules
    imported before :meth:`read_all` forks (as the profiler's children: never
    inherited half made); ``workers``: the processors this process may run on (the
    profiler's ``cores``; :meth:`read_all` forks only with two or more).

    A sample the profiler priced roughly (``Profiler.rough``: its pending entry holds the
    ``pairs``) is not read as it lies: ``price(folder, operator, entry)`` prices the
    strategy again on all those pairs, as a profile prices any other, and reads that."""

    def __init__(self, folder, pending: dict[tuple[str, str], dict],
                 child_imports: tuple[str, ...] = (), workers: int = 1,
                 price: Callable[[Path, str, dict], dict] | None = None, held=None):
        self.folder = folder
        #: the folder's hold (``subzero.scratch.Scratch``), let go of when closed
        self.held = held
        self.pending = pending
        self.child_imports = child_imports
        self.workers = workers
        self.price = price
        self._stores: dict[str, object] = {}
        self._priced = 0

    def __contains__(self, item: tuple[str, str]) -> bool:
        return item in self.pending

    def __len__(self) -> int:
        return len(self.pending)

    def read(self, op: str, strategy: str) -> dict:
        """What reading one pending sample adds to its strategy's price, which is then no
        longer pending: its timed reads (``time_reads``) as ``"sample"``; for a rough
        price, the whole price made again (``price``)."""
        import os

        from subzero.errors import CorruptLineage, OptimizerError
        from subzero.storage.lineage import LineageStore
        p = self.pending.pop((op, strategy))
        try:
            if p.get("pairs") is not None and self.price is not None:
                self._priced += 1
                return self.price(self.folder / f"again-{os.getpid()}-{self._priced}", op, p)
            store = self._stores.get(p["store"])
            if store is None:
                store = self._stores[p["store"]] = LineageStore(p["store"], readonly=True)
            keys = np.load(p["keys"]) if p["keys"] else None
            return {"sample": time_reads(store, p["key"], op, p["op"], p["strategy"], keys,
                                         p["out_shape"], p["in_shapes"], p["spaces"])}
        except (CorruptLineage, OSError, ValueError) as e:
            raise OptimizerError(f"the profile's lineage sample of {op}'s {strategy} in "
                                 f"{self.folder} is missing or damaged before it was read "
                                 f"({type(e).__name__}: {e}); optimize again (it profiles the "
                                 f"workflow again with `--reprofile`)") from e

    def read_all(self, items: list[tuple[str, str]]) -> dict[tuple[str, str], dict]:
        """:meth:`read` of several pending samples, shared with a forked child on a
        machine with two cores or more (each times its reads in its own CPU seconds, as
        the profiler's children do): the reads a plan waits for after the run, half the
        wall time.  A sample the child did not read (it failed or died) is read here."""
        import os
        import pickle
        if len(items) < 2 or not hasattr(os, "fork") or self.workers < 2:
            return {k: self.read(*k) for k in items}
        theirs, mine = items[1::2], items[0::2]
        result = self.folder / f"reads-{os.getpid()}-{len(self.pending)}.pkl"
        self._close_stores()            # no LMDB environment is open across the fork

        def read() -> list:             # in the child
            got = [(k, self.read(*k)) for k in theirs]
            self._close_stores()
            return got
        pid = fork_child(result, read, self.child_imports)
        if pid is None:
            return {k: self.read(*k) for k in items}
        out = {k: self.read(*k) for k in mine}
        os.waitpid(pid, 0)
        try:
            out.update(dict(pickle.loads(result.read_bytes())))
        except Exception:
            pass
        result.unlink(missing_ok=True)
        for k in theirs:
            if k in out:
                self.pending.pop(k, None)
            else:
                out[k] = self.read(*k)
        return out

    def _close_stores(self) -> None:
        for store in self._stores.values():
            store.close()               # type: ignore[attr-defined]
        self._stores.clear()

    def close(self) -> None:
        """Close the samples' stores and remove the folder."""
        import shutil
        self._close_stores()
        self.pending.clear()
        if self.held is not None:       # removes the folder
            self.held.close()
        else:
            shutil.rmtree(self.folder, ignore_errors=True)
