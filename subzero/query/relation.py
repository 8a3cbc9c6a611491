"""What lineage means: one trace step over a set of pairs.

The same algorithms serve every :class:`~subzero.query.sources.PairSource`
(stored lineage, pairs collected in memory by re-execution), so every method
answers with the same semantics:

* full pair (O, I_0..I_k): every cell of O depends on every cell of I_i;
* payload pair (O, p): every cell of O depends on ``map_p(O, p, i)``;
* composite: output cells covered by a payload pair use it, every other
  output cell uses the mapping functions ``map_b``/``map_f``.

Query sets are :class:`~subzero.model.cellset.CellSet` values (sorted ids,
membership tests whose cost follows the cells); results are packed cells of
the target array.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from numpy.typing import ArrayLike

from subzero.errors import LineageError
from subzero.model.cells import (
    as_cells,
    csr_take,
    pack,
    rows_hitting,
    unique,
    unpack,
)
from subzero.model.cellset import CellSet
from subzero.model.operator import Operator, OperatorContext, map_p_vectorized, own_code
from subzero.model.reach import grown
from subzero.model.strategy import Direction
from subzero.query.sources import PairSource
from subzero.tuning import PAYLOAD_CALLS_VECTORIZED, REACH_GROWN_CELLS, SCAN_PAIRS


def per_payload(batched: bool, vectorized: bool, pairs: float, payloads: float) -> bool:
    """Whether a backward step over ``pairs`` payload pairs of ``payloads`` distinct
    payloads calls ``map_p`` once per payload (True) or ``map_p_pairs`` once for every
    pair (False; the operator's vectorized version, or the default's loop per pair).

    A batched ``map_p`` expands each payload once for all the cells that share it, which
    saves work when many pairs share few payloads; when most pairs have their own
    (``PAYLOAD_CALLS_VECTORIZED`` or more, fewer than two pairs each) those calls are a
    Python loop per pair, and a vectorized ``map_p_pairs`` does the same expansion at
    once.  The cost model prices steps by the same rule."""
    if not batched:
        return False
    return not vectorized or payloads < PAYLOAD_CALLS_VECTORIZED or 2 * payloads <= pairs


class StepContext:
    """Shapes and callbacks one step needs (plain data + the operator)."""

    def __init__(self, name: str, operator: Operator, mapctx: OperatorContext,
                 out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]):
        self.name, self.op, self.mapctx = name, operator, mapctx
        self.out_shape = tuple(out_shape)
        self.in_shapes = [tuple(s) for s in in_shapes]

    def checked(self, cells: ArrayLike, shape: tuple[int, ...], what: str) -> np.ndarray:
        try:
            c = as_cells(cells, len(shape))
        except (ValueError, TypeError) as e:
            raise LineageError(f"operator {self.name!r}: {what} returned bad cells: {e}") from e
        if len(c) and (c.min() < 0 or bool((c >= np.asarray(shape)).any())):
            bad = (c < 0) | (c >= np.asarray(shape))
            row = c[np.flatnonzero(bad.any(axis=1))[0]]
            raise LineageError(f"operator {self.name!r}: {what} returned cell "
                               f"{tuple(int(x) for x in row)} outside its array (shape {tuple(shape)})")
        return pack(c, shape)

    # -- mapping functions -------------------------------------------------------
    def map_b(self, q_packed: np.ndarray, i: int) -> np.ndarray:
        if q_packed.size == 0:
            return q_packed
        with own_code(self.name, self.op, "map_b"):
            res = self.op.map_b(unpack(q_packed, self.out_shape), i, self.mapctx)
        return self.checked(res, self.in_shapes[i], "map_b")

    def map_f(self, q_packed: np.ndarray, i: int) -> np.ndarray:
        if q_packed.size == 0:
            return q_packed
        with own_code(self.name, self.op, "map_f"):
            res = self.op.map_f(unpack(q_packed, self.in_shapes[i]), i, self.mapctx)
        return self.checked(res, self.out_shape, "map_f")

    # -- payloads ---------------------------------------------------------------
    def payload_backward(self, keys: np.ndarray, key_off: np.ndarray, pay_ids: np.ndarray,
                         payloads: Sequence[bytes], i: int) -> np.ndarray:
        """Union of map_p over the given pairs (output cells packed)."""
        n = len(key_off) - 1
        if n == 0:
            return np.zeros(0, np.int64)
        shape_in = self.in_shapes[i]
        out_cells = unpack(keys, self.out_shape)
        res = []
        distinct = unique(pay_ids) if self.op.map_p_batched else None
        if distinct is not None and per_payload(True, map_p_vectorized(self.op), n, distinct.size):
            with own_code(self.name, self.op, "map_p"):
                for pid in distinct.tolist():
                    rows = np.flatnonzero(pay_ids == pid)
                    cells = csr_take(out_cells, key_off, rows)
                    res.append(self.checked(self.op.map_p(cells, payloads[pid], i, self.mapctx),
                                            shape_in, "map_p"))
        else:
            with own_code(self.name, self.op, "map_p_pairs"):
                cells, _owner = self.op.map_p_pairs(out_cells, key_off, payloads, pay_ids, i,
                                                    self.mapctx)
            res.append(self.checked(cells, shape_in, "map_p"))
        return np.concatenate(res) if res else np.zeros(0, np.int64)

    def payload_owners(self, keys: np.ndarray, key_off: np.ndarray, pay_ids: np.ndarray,
                       payloads: Sequence[bytes], i: int, q: CellSet) -> np.ndarray:
        """Pairs whose map_p result intersects the query on input i."""
        if len(key_off) <= 1:
            return np.zeros(0, np.int64)
        with own_code(self.name, self.op, "map_p_pairs"):
            cells, owner = self.op.map_p_pairs(unpack(keys, self.out_shape), key_off, payloads,
                                               pay_ids, i, self.mapctx)
        packed = self.checked(cells, self.in_shapes[i], "map_p")
        owner = np.asarray(owner, np.int64)
        return unique(owner[q.contains(packed)])


def backward(src: PairSource, payload: bool, direction: Direction, sc: StepContext, i: int,
             q: CellSet) -> np.ndarray:
    """Input-i cells that the output cells ``q`` depend on, per stored pairs."""
    if direction == Direction.BACKWARD:
        pids = src.lookup("b", q)
        if not payload:
            return src.records("b", pids, [f"v{i}"])[f"v{i}"][0]
        rec = src.records("b", pids, ["key", "pay"])
        keys, off = rec["key"]
        pay_ids, table = rec["pay"]
        return sc.payload_backward(keys, off, pay_ids, table, i)
    space = f"f{i}"
    if not src.has_space(space):
        return np.zeros(0, np.int64)
    return _scan(src, space, "v", q)


def forward(src: PairSource, payload: bool, direction: Direction, sc: StepContext, i: int,
            q: CellSet) -> np.ndarray:
    """Output cells that depend on the input-i cells ``q``, per stored pairs."""
    if direction == Direction.FORWARD:
        space = f"f{i}"
        if not src.has_space(space):
            return np.zeros(0, np.int64)
        pids = src.lookup(space, q)
        return src.records(space, pids, ["v"])["v"][0]
    if not src.has_space("b"):
        return np.zeros(0, np.int64)
    if not payload:
        return _scan(src, "b", f"v{i}", q)
    found = []
    for pids in _chunks(_payload_candidates(src, sc, i, q)):
        rec = src.records("b", pids, ["key", "pay"])
        keys, off = rec["key"]
        pay_ids, table = rec["pay"]
        hit = sc.payload_owners(keys, off, pay_ids, table, i, q)
        found.append(csr_take(keys, off, hit))
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def _payload_candidates(src: PairSource, sc: StepContext, i: int, q: CellSet) -> np.ndarray:
    """The backward-keyed payload pairs a forward step from the input-i cells ``q``
    must decode: with a reach recorded for input i (checked on every pair when they
    were captured, :mod:`subzero.model.reach`), only those with an output cell within
    the reach of a query cell -- a key lookup whose cost follows the query; otherwise,
    or when the grown query would be too large to be worth it, every pair."""
    r = src.reach(i)
    if r is not None and not q.is_entire and len(sc.in_shapes[i]) == len(sc.out_shape):
        near = grown(q.ids(), sc.in_shapes[i], r, sc.out_shape, REACH_GROWN_CELLS)
        if near is not None:
            return src.lookup("b", CellSet.of_sorted(near, sc.out_shape))
    return src.all_pairs("b")


def _chunks(pids: np.ndarray) -> Iterator[np.ndarray]:
    """A scan's pair ids in pieces of SCAN_PAIRS, so its memory follows the piece, not
    the operator's lineage."""
    for a in range(0, len(pids), SCAN_PAIRS):
        yield pids[a:a + SCAN_PAIRS]


def _scan(src: PairSource, space: str, field: str, q: CellSet) -> np.ndarray:
    """Key cells of every pair of ``space`` whose ``field`` cells meet ``q``: a step
    against the stored index reads every pair, one piece at a time."""
    hits = []
    for pids in _chunks(src.all_pairs(space)):
        vals, off = src.records(space, pids, [field])[field]
        hit = rows_hitting(vals, off, q)
        if hit.size:
            hits.append(pids[hit])
    if not hits:
        return np.zeros(0, np.int64)
    # one call for the pairs hit in every piece: a One encoding finds key cells by
    # decoding its whole key index, and a call per piece decoded it once per piece
    # (5 times over for a backward step scanning genomics' extract at 1,000x)
    return src.scan_keys(space, np.concatenate(hits))[0]


def composite(src: PairSource, direction_stored: Direction, sc: StepContext, i: int,
              backward_step: bool, q: CellSet) -> np.ndarray:
    """Composite lineage: payload pairs where they cover, mapping elsewhere.  The
    covered cells are read as sorted ids, so the split costs the query and the
    covered cells, not the output array."""
    if backward_step:
        ids = q.ids()
        covered = CellSet.of_ids(src.covered(ids), sc.out_shape)
        inside = covered.contains(ids)
        qc = CellSet.of_sorted(ids[inside], sc.out_shape)
        res = [backward(src, True, direction_stored, sc, i, qc), sc.map_b(ids[~inside], i)]
        return np.concatenate(res)
    fwd = forward(src, True, direction_stored, sc, i, q)
    dflt = sc.map_f(q.ids(), i)
    covered = CellSet.of_ids(src.covered(dflt), sc.out_shape)
    return np.concatenate([fwd, dflt[~covered.contains(dflt)]])
