"""Running one method for one trace step.

Each function maps the query cells of one step through one operator and
returns the reached cells of the step's target array, either as packed cell
ids (possibly with duplicates) or, when a whole-bitmap path produced it, as a
boolean bitmap of the target's shape; :func:`settle` turns either into the
bitmap the next step starts from.  Choosing the method, falling back when one
fails, and the planner's deadline are the executor's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from subzero.capture.buffer import empty_pairs
from subzero.errors import QueryError
from subzero.model.cells import bitmap_from_packed
from subzero.model.modes import Mode
from subzero.model.strategy import Direction, Strategy
from subzero.query import relation
from subzero.query.reexec import capture_mode, check_region, rerun, verify_output
from subzero.query.relation import StepContext
from subzero.query.sources import MemoryPairs, PairSource
from subzero.query.tilerun import TileAccess, rerun_tiles
from subzero.tuning import FIRST_CHUNK, LOOKUP_CHUNK, SMALL_QUERY


def target_shape(sc: StepContext, i: int, backward: bool) -> tuple[int, ...]:
    return sc.in_shapes[i] if backward else sc.out_shape


def settle(res: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    """A step's result as (bitmap, sorted unique packed cells or None): a small result
    keeps its sorted cells, so the next step never scans a whole bitmap for them."""
    if res.dtype == bool:
        return res, None
    if res.size <= SMALL_QUERY:
        q = np.unique(res)
        return bitmap_from_packed(q, shape), q
    return bitmap_from_packed(res, shape), None


def mapping(sc: StepContext, bm: np.ndarray, i: int, backward: bool,
            q: np.ndarray | None) -> np.ndarray:
    """Mapping functions, through the operator's whole-bitmap fast path when it has one
    (``q``, the packed cells, is computed only when there is none)."""
    op = sc.op
    fast = (op.map_b_bitmap if backward else op.map_f_bitmap)(bm, i, sc.mapctx)
    if fast is not NotImplemented:
        tgt = target_shape(sc, i, backward)
        fast = np.asarray(fast, dtype=bool)
        if fast.shape != tuple(tgt):
            raise QueryError(f"operator {sc.name!r}: its bitmap mapping returned shape "
                             f"{fast.shape}, expected {tuple(tgt)}")
        return fast
    if q is None:
        q = relation.packed_query(bm)[0]
    return sc.map_b(q, i) if backward else sc.map_f(q, i)


def stored(source: PairSource, s: Strategy, sc: StepContext, i: int, backward: bool,
           q: np.ndarray, q_flat: np.ndarray) -> np.ndarray:
    """Stored pairs of strategy ``s``.  A lookup through the matching index goes in
    chunks so that a step whose target fills up stops early: a high fan-out step (a
    model cell feeds thousands of predictions) often fills it from its first few
    cells.  Chunks grow 8x while the cells so far could still fill the target at
    their fan-out; otherwise the rest goes in LOOKUP_CHUNK pieces.  Only the speed
    depends on this: the answer is the union over chunks either way."""
    direction = s.direction
    assert direction is not None, f"{s} stores no lineage"
    if s.mode is Mode.COMP:
        return relation.composite(source, direction, sc, i, backward, q, q_flat)
    fn = relation.backward if backward else relation.forward
    if s.backward != backward or q.size <= FIRST_CHUNK:
        return fn(source, s.payload, direction, sc, i, q, q_flat)
    tgt_shape = target_shape(sc, i, backward)
    size = int(np.prod(tgt_shape, dtype=np.int64))
    out = np.zeros(size, bool)
    a, step = 0, FIRST_CHUNK
    while a < q.size:
        b = min(q.size, a + step)
        out[fn(source, s.payload, direction, sc, i, q[a:b], q_flat)] = True
        n = int(np.count_nonzero(out))
        if n == size:
            break
        step = min(step * 8, LOOKUP_CHUNK) if n * q.size >= size * b else LOOKUP_CHUNK
        a = b
    return out.reshape(tgt_shape)


def reexec(sc: StepContext, i: int, backward: bool, q: np.ndarray, q_flat: np.ndarray,
           inputs: Callable[[], Sequence[object]],
           stored: Callable[[tuple[slice, ...]], np.ndarray],
           tiles: TileAccess | None = None) -> tuple[np.ndarray, str]:
    """Re-run the operator keeping the pairs the query touches; returns the result and
    the method it amounts to: ``reexec:<mode>``, or ``map`` / ``all-to-all`` for an
    operator with no lineage to regenerate.

    A tile-parallel operator re-runs on only the tiles the query touches, reading their
    regions through ``tiles`` (``tilerun.py``); any other re-runs whole on its inputs
    (``inputs()`` loads them).  The re-run must reproduce the stored output
    (``stored(region)`` reads a region of it) on the output cells the step uses: each
    re-run tile's core, or for a whole re-run the bounding box of the query's cells
    going backward, of the answer's going forward; otherwise the step stops with an
    error naming the operator as not deterministic."""
    op = sc.op
    mode = capture_mode(op)
    if mode is None:
        if Mode.MAP in op.supported_modes() and op.has_mapping():
            return (sc.map_b(q, i) if backward else sc.map_f(q, i)), "map"
        return np.ones(target_shape(sc, i, backward), bool), "all-to-all"
    r = rerun_tiles(sc, mode, backward, i, q, tiles, stored) if tiles is not None else None
    if r is None:
        r = rerun(sc.name, op, list(inputs()), sc.out_shape, mode, backward, i, q_flat)
    fn = relation.backward if backward else relation.forward
    if mode is Mode.FULL:
        res = fn(MemoryPairs(r.full), False, Direction.BACKWARD, sc, i, q, q_flat) \
            if r.full is not None else np.zeros(0, np.int64)
    elif mode is Mode.PAY:
        res = fn(MemoryPairs(r.pay), True, Direction.BACKWARD, sc, i, q, q_flat) \
            if r.pay is not None else np.zeros(0, np.int64)
    else:
        src = MemoryPairs(r.pay if r.pay is not None else empty_pairs(len(sc.in_shapes), True),
                          covered=r.covered)
        res = relation.composite(src, Direction.BACKWARD, sc, i, backward, q, q_flat)
    if r.output is not None:         # a whole re-run: checked on what the step used
        region = check_region(q if backward else np.asarray(res), sc.out_shape)
        verify_output(sc.name, r.output, sc.out_shape, region, stored)
    return res, f"reexec:{mode.value}"
