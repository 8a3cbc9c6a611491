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

import statistics
import time

import numpy as np

from subzero.capture.context import Context
from subzero.model.cells import unique
from subzero.model.cellset import CellSet
from subzero.model.strategy import Strategy
from subzero.query import steps as run_step
from subzero.query.planner import blocks_of, runs_of
from subzero.query.relation import StepContext
from subzero.tuning import (
    SAMPLE_READ_CELLS,
    SAMPLE_READ_OUT_CELLS,
    SAMPLE_READ_REPEATS,
    SAMPLE_SCAN_ONCE_S,
    SLOW_OBSERVATION_S,
)


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


def time_reads(lineage, key: str, name: str, op, s: Strategy, pairs, out_shape,
               in_shapes, spaces: dict, repeats: int = SAMPLE_READ_REPEATS) -> dict:
    """The sample's index read and scan (through input 0), each asked one cell and
    ``SAMPLE_READ_CELLS`` cells (a step's cost does not grow alike with its cells in
    every method, so one size would correct the other wrongly; fewer, or a slow scan
    once, when those reads would take seconds: :func:`_second_size`), each timed ``repeats``
    times (fewer once they add up to ``SLOW_OBSERVATION_S``), median kept, CPU seconds.
    ``key``: the sample's name in ``lineage`` (the profiler's scratch store);
    ``spaces``: the sample's own sizes, which the cost model prices the reads by."""
    rng = np.random.default_rng(0)
    sc = StepContext(name, op, Context(name, op, frozenset(), in_shapes, out_shape),
                     out_shape, in_shapes)
    reader = lineage.reader(key, s)
    reads: list[dict] = []
    for backward, n in ((b, n) for b in (s.backward, not s.backward) for n in (1, SAMPLE_READ_CELLS)):
        shape = tuple(out_shape) if backward else tuple(in_shapes[0])
        index = backward == s.backward
        if n > 1:
            n = _second_size(reads[-1], index, n)
            if n <= 1:
                continue
        keys = None
        if index:                        # an index read: ask cells the index holds
            keys = pairs.out if backward else (pairs.ins[0] if pairs.ins else None)
        q = _query(shape, keys, n, rng)
        times: list[float] = []
        n_out = 0
        while len(times) < repeats and sum(times) < SLOW_OBSERVATION_S:
            reader.clear_cache()
            c0, w0 = time.process_time(), time.perf_counter()
            res = run_step.stored(reader, s, sc, 0, backward, q)
            # CPU time is what the read costs (a busy machine inflates the wall time); a
            # wall time below it means threads shared the work
            times.append(min(time.process_time() - c0, time.perf_counter() - w0))
            n_out = len(res)
        reads.append({"backward": backward, "cells_in": len(q), "cells_out": int(n_out),
                      "blocks": blocks_of(q), "runs": runs_of(q),
                      "seconds": statistics.median(times),
                      "spread": (max(times) - min(times)) / max(statistics.median(times), 1e-9)})
    return {"spaces": spaces, "reads": reads}


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
    per_cell = first["cells_out"] / max(first["cells_in"], 1)
    return int(min(n, max(2, SAMPLE_READ_OUT_CELLS // max(per_cell, 1.0))))
