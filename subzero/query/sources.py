"""Where a trace step reads lineage pairs from: one declared interface, one
implementation per kind of source.

* stored lineage: :class:`subzero.storage.lineage.StrategyReader` (LMDB and
  R-trees), which satisfies :class:`PairSource` structurally;
* pairs regenerated in memory by re-execution: :class:`MemoryPairs`;
* stored lineage under a query-time planner's budget: :class:`TimedSource`,
  which measures the read's CPU time and progress and gives it up for
  re-execution when the budget says so.

Pairs live in *spaces*: ``"b"`` is keyed by output cells, ``"f<i>"`` by the
cells of input i.  The relation algorithms (``relation.py``) ask only this
interface, so every source answers with the same semantics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Protocol, runtime_checkable

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.errors import Deadline
from subzero.model.cells import csr_take, lengths_to_offsets, merge_unique, rows_hitting, unique
from subzero.model.cellset import CellSet
from subzero.query.planner import ReadBudget
from subzero.storage.encodings import Records, concat_records
from subzero.tuning import TIMED_CHUNK_GROWTH, TIMED_QUERY_CELLS, TIMED_RECORD_PAIRS


@runtime_checkable
class PairSource(Protocol):
    """Lineage pairs a trace step can look up, fetch and scan."""

    def has_space(self, space: str) -> bool:
        """Whether pairs keyed this way exist."""
        ...

    def reach(self, i: int) -> int | None:
        """How far (cells along any axis) an input-``i`` cell of a payload pair can be
        from the pair's output cells, as checked when the pairs were captured; None
        when unknown (a forward step then scans every pair)."""
        ...

    def lookup(self, space: str, q: CellSet) -> np.ndarray:
        """Sorted ids of the pairs whose key cells meet the query cells ``q``."""
        ...

    def records(self, space: str, pids: np.ndarray, fields: list[str]) -> Records:
        """Fields of the given pairs (``"key"``, ``"v<i>"``, ``"v"``, ``"pay"``)."""
        ...

    def all_pairs(self, space: str) -> np.ndarray:
        """Ids of every pair (a scan, for a step against the stored direction)."""
        ...

    def scan_keys(self, space: str, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Key cells of the given pairs as (cells, offsets)."""
        ...

    def covered(self, near: np.ndarray | None = None) -> np.ndarray:
        """Output cells some payload pair covers (composite lineage): at least those
        among the cell ids ``near`` (all of them when None; a sharded source reads
        only the shards ``near`` falls in)."""
        ...


class MemoryPairs:
    """Pairs captured in memory (re-execution), keyed by output cells (space ``b``)."""

    def __init__(self, pairs: Pairs, covered: np.ndarray | None = None):
        self.p = pairs
        self._covered = covered
        fields = {"key": (pairs.out, pairs.out_off)}
        for i in range(len(pairs.ins)):
            fields[f"v{i}"] = (pairs.ins[i], pairs.in_offs[i])
        self.fields = fields

    def has_space(self, space: str) -> bool:
        return space == "b"

    def reach(self, i: int) -> int | None:
        return None        # pairs in memory are few; their reach was never checked

    def lookup(self, space: str, q: CellSet) -> np.ndarray:
        return rows_hitting(self.p.out, self.p.out_off, q)

    def all_pairs(self, space: str) -> np.ndarray:
        return np.arange(self.p.n, dtype=np.int64)

    def records(self, space: str, pids: np.ndarray, fields: list[str]) -> Records:
        out: Records = {}
        for f in fields:
            if f == "pay":
                assert self.p.pay_ids is not None, "payload fields asked of full pairs"
                out["pay"] = (self.p.pay_ids[pids], self.p.payloads)
            else:
                c, o = self.fields[f]
                out[f] = (csr_take(c, o, pids), lengths_to_offsets(o[pids + 1] - o[pids]))
        return out

    def scan_keys(self, space: str, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.records(space, pids, ["key"])["key"]

    def covered(self, near: np.ndarray | None = None) -> np.ndarray:
        return unique(self.p.out) if self._covered is None else self._covered


class TimedSource:
    """A stored read under a query-time planner's :class:`ReadBudget`: between chunks of
    pairs and of query cells it measures the CPU seconds of its own work (this thread's,
    which a busy machine does not stretch) and how far it got, and gives up (raises
    :class:`Deadline`) when the budget says re-execution now costs less than what is
    left.  ``spent`` and ``done`` say where it stopped.

    Progress is the share of the query's cells looked up and their pairs fetched (the
    lookup counts for ``LOOKUP_SHARE`` of each chunk of cells, fetching its pairs for the
    rest: for a cell or two the pairs are the read), or for a scan of the other index the
    share of its pairs read; None until a first piece tells."""

    CHUNK = TIMED_RECORD_PAIRS        # pairs per records() call
    QUERY_CHUNK = TIMED_QUERY_CELLS   # query cells per lookup() call (R-tree probes are slow)
    LOOKUP_SHARE = 0.2                # of a chunk of cells' work (chosen, not measured)

    def __init__(self, source: PairSource, budget: ReadBudget, cells: int,
                 may_switch: Callable[[], bool] | None = None):
        self.source, self.budget, self.cells = source, budget, max(int(cells), 1)
        #: asked once, when the budget first says switch: whether re-execution may be
        #: switched to at all (what it costs to know is paid only by reads that overrun)
        self._may_switch = may_switch
        self._cpu0 = time.thread_time()
        self._looked = 0              # query cells whose pairs were all fetched
        self._cur = 0                 # query cells of the latest lookup
        self._part = 0.0              # how far the latest lookup's cells got (0..1)
        self._scan_spaces: set[str] = set()
        self._scan = 0                # pairs a scan reads ...
        self._scanned = 0             # ... and has read
        self.spent = 0.0
        #: the share of the read's *time* done, by the rate its progress moved at since it
        #: was first measured (None until it moved): the work before that -- decoding
        #: every key of a scan before its first record -- is not what is left
        self.done: float | None = None
        self._from: tuple[float, float] | None = None   # (spent, progress) when first measured

    def progress(self) -> float | None:
        """The share of the read's work done, or None while nothing says."""
        if self._scan:
            return min(1.0, self._scanned / self._scan)
        if self._looked or self._part:
            return min(1.0, (self._looked + self._cur * self._part) / self.cells)
        return None

    def _time_done(self, spent: float, got: float | None) -> float | None:
        """The share of the read's time done when it has spent ``spent`` and made
        ``got`` progress: what is left, ``(1 - got)`` at the rate progress moved since
        it was first measured, against what was spent.  A scan of genomics' extract at
        10,000x spent 429 ms listing its 16 million pairs before its first record, and
        extrapolated from the start as if that were 0.1% of its work it was given up
        for a re-execution of 6.5 s, where reading on took 0.9 s."""
        if got is None:
            return None
        if got >= 1.0:
            return 1.0
        if self._from is None:            # no rate yet: only "most of it done" is known
            self._from = (spent, got)
            return got if got >= self.budget.most_done else None
        s0, g0 = self._from
        if got <= g0 or spent <= s0:
            return self.done              # not moved since: the last estimate stands
        rest = (1.0 - got) * (spent - s0) / (got - g0)
        return spent / (spent + rest)

    def _check(self) -> None:
        self.spent = time.thread_time() - self._cpu0
        self.done = self._time_done(self.spent, self.progress())
        if self.budget.switch(self.spent, self.done):
            if self._may_switch is not None:
                allowed, self._may_switch = self._may_switch(), None
                if not allowed:                 # never again: the read runs to its end
                    self.budget = replace(self.budget, after=float("inf"))
                    return
            raise Deadline()

    def _room(self, share: float) -> Callable[[float], float]:
        """For a call starting now, ``share`` of the read's work: the share of it
        (``done``, 0..1, through) that its next piece may take without a check in
        between -- half of what is left of the budget's ``after`` (before which nothing
        is given up, so a check there is only overhead) at the call's own rate so far
        (its first piece's fixed costs make that pessimistic), or before its first
        piece at the read's own rate so far (none for the read's first call).  At
        1,000x genomics a 565,000-cell lookup under a 148 ms ``after`` took 60 pieces
        of at most 16,384 cells, all before ``after``, and 1.25x the read in one call;
        with pieces sized by the call's own rate alone, every chunk of cells the step
        hands over began small again: 27 lookups where an untimed read makes 14."""
        start = time.thread_time()

        def room(done: float) -> float:
            now = time.thread_time()
            left = self.budget.after - (now - self._cpu0)
            if left <= 0:
                return 0.0
            if done > 0:
                return 0.5 * left * done / max(now - start, 1e-9)
            got, spent = self.progress(), now - self._cpu0
            if not got or spent <= 0 or share <= 0:
                return 0.0
            return 0.5 * left * got / spent / share
        return room

    def has_space(self, space: str) -> bool:
        return self.source.has_space(space)

    def reach(self, i: int) -> int | None:
        return self.source.reach(i)

    def covered(self, near: np.ndarray | None = None) -> np.ndarray:
        self._check()
        return self.source.covered(near)

    def lookup(self, space: str, q: CellSet) -> np.ndarray:
        self._looked += self._cur
        self._cur, self._part = len(q), 0.0
        self._check()
        if len(q) <= self.QUERY_CHUNK:
            return self.source.lookup(space, q)
        ids = []                  # pairs hit by any chunk of the query are hit by the query
        cells = q.ids()
        room = self._room(self.LOOKUP_SHARE * len(cells) / self.cells)
        for a, b in growing_chunks(len(cells), self.QUERY_CHUNK, room=room):
            self._part = self.LOOKUP_SHARE * a / len(cells)
            self._check()
            ids.append(self.source.lookup(space, CellSet.of_sorted(cells[a:b], q.shape)))
        return merge_unique(ids)

    def all_pairs(self, space: str) -> np.ndarray:
        self._check()
        pids = self.source.all_pairs(space)
        self._scan_spaces.add(space)
        self._scan += len(pids)
        return pids

    def scan_keys(self, space: str, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._check()
        return self.source.scan_keys(space, pids)

    def records(self, space: str, pids: np.ndarray, fields: list[str]) -> Records:
        scan = space in self._scan_spaces
        parts = []
        share = len(pids) / self._scan if scan and self._scan else \
            (1 - self.LOOKUP_SHARE) * self._cur / self.cells
        for a, b in growing_chunks(max(len(pids), 1), self.CHUNK, room=self._room(share)):
            if not scan and len(pids):
                self._part = self.LOOKUP_SHARE + (1 - self.LOOKUP_SHARE) * a / len(pids)
            self._check()
            parts.append(self.source.records(space, pids[a:b], fields))
            if scan:
                self._scanned += len(pids[a:b])
        if not scan:
            self._part = 1.0
        return parts[0] if len(parts) == 1 else concat_records(parts, fields)


def growing_chunks(n: int, first: int, most: int = TIMED_CHUNK_GROWTH,
                   room: Callable[[float], float] | None = None) -> Iterator[tuple[int, int]]:
    """``[a, b)`` pieces covering ``range(n)``: ``first`` long, each after twice the one
    before, up to ``most`` times ``first``; or longer, up to the share of ``n`` that
    ``room(a / n)`` says can run without a check (the whole rest when it all can; the
    first piece too when ``room(0)`` says so).  A
    timed read checks its clock between pieces: small ones first notice a read that is
    slow from the start, and growing ones keep the calls few -- in equal pieces of
    ``first``, a 56,500-cell lookup made 55 calls and took 2.4x the read in one call.
    Past what ``room`` allows, a piece is at most ``most`` pieces of ``first``, so a
    switch is never decided later than that much work."""
    first = max(int(first), 1)
    a, size = 0, first
    while a < n:
        free = int(min(room(a / n), 1.0) * n) if room is not None else 0
        b = min(n, a + max(size, free))
        yield a, b
        a, size = b, min(size * 2, first * most)
