"""Where a trace step reads lineage pairs from: one declared interface, one
implementation per kind of source.

* stored lineage: :class:`subzero.storage.lineage.StrategyReader` (LMDB and
  R-trees), which satisfies :class:`PairSource` structurally;
* pairs regenerated in memory by re-execution: :class:`MemoryPairs`;
* either of them under a deadline: :class:`TimedSource`, the query-time
  planner's switch to re-execution.

Pairs live in *spaces*: ``"b"`` is keyed by output cells, ``"f<i>"`` by the
cells of input i.  The relation algorithms (``relation.py``) ask only this
interface, so every source answers with the same semantics.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.errors import Deadline
from subzero.model.cells import csr_take, lengths_to_offsets, rows_hitting, unique
from subzero.model.cellset import CellSet
from subzero.storage.encodings import Records, concat_records
from subzero.tuning import TIMED_QUERY_CELLS, TIMED_RECORD_PAIRS


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
    """A source that gives up (raises :class:`Deadline`) once ``until`` (a
    ``time.perf_counter`` value) has passed, checked between chunks of pairs and of
    query cells, so that a slow read is abandoned within one chunk."""

    CHUNK = TIMED_RECORD_PAIRS        # pairs per records() call
    QUERY_CHUNK = TIMED_QUERY_CELLS   # query cells per lookup() call (R-tree probes are slow)

    def __init__(self, source: PairSource, until: float):
        self.source, self.until = source, until

    def _check(self) -> None:
        if time.perf_counter() > self.until:
            raise Deadline()

    def has_space(self, space: str) -> bool:
        return self.source.has_space(space)

    def reach(self, i: int) -> int | None:
        return self.source.reach(i)

    def covered(self, near: np.ndarray | None = None) -> np.ndarray:
        self._check()
        return self.source.covered(near)

    def lookup(self, space: str, q: CellSet) -> np.ndarray:
        self._check()
        if len(q) <= self.QUERY_CHUNK:
            return self.source.lookup(space, q)
        ids = []                  # pairs hit by any chunk of the query are hit by the query
        cells = q.ids()
        for a in range(0, len(cells), self.QUERY_CHUNK):
            self._check()
            ids.append(self.source.lookup(space, CellSet.of_sorted(cells[a:a + self.QUERY_CHUNK],
                                                                   q.shape)))
        return unique(np.concatenate(ids))

    def all_pairs(self, space: str) -> np.ndarray:
        self._check()
        return self.source.all_pairs(space)

    def scan_keys(self, space: str, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._check()
        return self.source.scan_keys(space, pids)

    def records(self, space: str, pids: np.ndarray, fields: list[str]) -> Records:
        if len(pids) <= self.CHUNK:
            self._check()
            return self.source.records(space, pids, fields)
        parts = []
        for a in range(0, len(pids), self.CHUNK):
            self._check()
            parts.append(self.source.records(space, pids[a:a + self.CHUNK], fields))
        return concat_records(parts, fields)

