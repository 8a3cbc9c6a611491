"""Running one method for one trace step.

Each function maps the query cells of one step through one operator and
takes the step's cells as a :class:`~subzero.model.cellset.CellSet` and
returns the reached cells of the step's target array, either as packed cell
ids (possibly with duplicates) or as a CellSet; :func:`settle` turns either
into the set the next step starts from.  Choosing the method, falling back when one
fails, and the planner's deadline are the executor's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from subzero.errors import QueryError
from subzero.model.cellset import CellSet
from subzero.model.modes import Mode
from subzero.model.operator import own_code
from subzero.model.strategy import Strategy
from subzero.query import relation
from subzero.query.relation import StepContext
from subzero.query.sources import PairSource
from subzero.tuning import FIRST_CHUNK, LOOKUP_CHUNK

if TYPE_CHECKING:
    from subzero.query.reexec import Rerun
    from subzero.query.tilerun import TileAccess


def target_shape(sc: StepContext, i: int, backward: bool) -> tuple[int, ...]:
    return sc.in_shapes[i] if backward else sc.out_shape


def settle(res: np.ndarray | CellSet, shape: tuple[int, ...]) -> CellSet:
    """A step's result as the set the next step starts from."""
    if isinstance(res, CellSet):
        return res
    return CellSet.of_ids(res, shape)


def mapping(sc: StepContext, q: CellSet, i: int, backward: bool) -> np.ndarray | CellSet:
    """Mapping functions.  The operator's whole-bitmap fast path is taken only for a
    set that already is a bitmap (dense or entire); a sparse set goes through the
    cell-wise functions, whose cost follows its cells."""
    op = sc.op
    bits = q.dense_bitmap()
    if bits is not None:
        src_shape = sc.out_shape if backward else sc.in_shapes[i]
        with own_code(sc.name, op, "map_b_bitmap" if backward else "map_f_bitmap"):
            fast = (op.map_b_bitmap if backward else op.map_f_bitmap)(
                bits.reshape(src_shape), i, sc.mapctx)
        if fast is not NotImplemented:
            tgt = target_shape(sc, i, backward)
            fast = np.asarray(fast, dtype=bool)
            if fast.shape != tuple(tgt):
                raise QueryError(f"operator {sc.name!r}: its bitmap mapping returned shape "
                                 f"{fast.shape}, expected {tuple(tgt)}")
            return CellSet.of_bitmap(fast)
    ids = q.ids()
    return sc.map_b(ids, i) if backward else sc.map_f(ids, i)


def stored(source: PairSource, s: Strategy, sc: StepContext, i: int, backward: bool,
           q: CellSet) -> np.ndarray | CellSet:
    """Stored pairs of strategy ``s``.  A lookup through the matching index goes in
    chunks so that a step whose target fills up stops early: a high fan-out step (a
    model cell feeds thousands of predictions) often fills it from its first few
    cells.  Chunks grow 8x while the cells so far could still fill the target at
    their fan-out; otherwise the rest goes in LOOKUP_CHUNK pieces.  Only the speed
    depends on this: the answer is the union over chunks either way."""
    direction = s.direction
    assert direction is not None, f"{s} stores no lineage"
    if s.mode is Mode.COMP:
        return relation.composite(source, direction, sc, i, backward, q)
    fn = relation.backward if backward else relation.forward
    ids = q.ids()
    if s.backward != backward or ids.size <= FIRST_CHUNK:
        return fn(source, s.payload, direction, sc, i, q)
    tgt_shape = target_shape(sc, i, backward)
    out = CellSet.empty(tgt_shape)
    a, step = 0, FIRST_CHUNK
    while a < ids.size:
        b = min(ids.size, a + step)
        out = out | CellSet.of_ids(fn(source, s.payload, direction, sc, i,
                                      CellSet.of_sorted(ids[a:b], q.shape)), tgt_shape)
        if out.is_entire:
            break
        step = min(step * 8, LOOKUP_CHUNK) if len(out) * ids.size >= out.size * b \
            else LOOKUP_CHUNK
        a = b
    return out


def reexec(sc: StepContext, i: int, backward: bool, q: CellSet,
           inputs: Callable[[], Sequence[object]],
           stored: Callable[[tuple[slice, ...]], np.ndarray],
           tiles: TileAccess | None = None) -> tuple[np.ndarray | CellSet, str]:
    """Re-run the operator keeping the pairs the query touches; returns the result and
    the method it amounts to: ``reexec:<mode>``, or ``map`` / ``all-to-all`` for an
    operator with no lineage to regenerate.

    A tile-parallel operator re-runs on only the boxes of the tiles the query touches,
    reading their regions through ``tiles`` (``tilerun.py``), a connected-components
    operator on a box enclosing the query's regions (``regionrun.py``), a structural
    one going backward on the query's box and the input box it reads (``gatherrun.py``); any other
    re-runs whole on its inputs (``inputs()`` loads them).  The re-run must reproduce
    the stored output (``stored(region)`` reads a region of it) on the output cells the
    step uses: each re-run box, or for a whole re-run the bounding box of the query's cells
    going backward, of the answer's going forward; otherwise the step stops with an
    error naming the operator as not deterministic.  Unless the operator declares its
    lineage deterministic, it is re-run twice and both answers must be the same cells
    (``reexec.same_lineage``)."""
    # the re-execution machinery (capture, re-runs on boxes of tiles, components or
    # gathers) is imported by the first step that re-executes, not by every trace:
    # most steps read stored lineage or map (issue 33: a CLI that starts fast)
    from subzero.capture.buffer import empty_pairs
    from subzero.model.operator import reruns
    from subzero.model.strategy import Direction
    from subzero.query.gatherrun import rerun_gather
    from subzero.query.reexec import capture_mode, check_region, rerun, same_lineage, verify_output
    from subzero.query.regionrun import rerun_components
    from subzero.query.sources import MemoryPairs
    from subzero.query.tilerun import rerun_tiles
    op = sc.op
    mode = capture_mode(op)
    ids = q.ids()
    if mode is None:
        if Mode.MAP in op.supported_modes() and op.has_mapping():
            return (sc.map_b(ids, i) if backward else sc.map_f(ids, i)), "map"
        return CellSet.everything(target_shape(sc, i, backward)), "all-to-all"

    def fresh() -> Rerun:
        r = None if tiles is None else (rerun_tiles(sc, mode, backward, i, ids, tiles, stored)
                                        or rerun_components(sc, mode, backward, i, ids, tiles, stored)
                                        or rerun_gather(sc, mode, backward, i, ids, tiles, stored,
                                                        q.contains))
        return r if r is not None else \
            rerun(sc.name, op, list(inputs()), sc.out_shape, mode, backward, i, q)

    def once(first: bool) -> np.ndarray:
        # the first re-run of a step may be the last step's (same operator, same output
        # cells, backward); a second one, proving the lineage deterministic, never is
        r = tiles.recall((mode, backward, None if backward else i), ids, fresh) \
            if first and tiles is not None else fresh()
        fn = relation.backward if backward else relation.forward
        if mode is Mode.FULL:
            res = fn(MemoryPairs(r.full), False, Direction.BACKWARD, sc, i, q) \
                if r.full is not None else np.zeros(0, np.int64)
        elif mode is Mode.PAY:
            res = fn(MemoryPairs(r.pay), True, Direction.BACKWARD, sc, i, q) \
                if r.pay is not None else np.zeros(0, np.int64)
        else:
            src = MemoryPairs(r.pay if r.pay is not None else empty_pairs(len(sc.in_shapes), True),
                              covered=r.covered)
            res = relation.composite(src, Direction.BACKWARD, sc, i, backward, q)
        if r.output is not None:         # a whole re-run: checked on what the step used
            region = check_region(ids if backward else np.asarray(res), sc.out_shape)
            verify_output(sc.name, r.output, sc.out_shape, region, stored)
        return np.asarray(res)
    res = once(True)
    if reruns(op) > 1:         # lineage not declared deterministic: it must prove itself too
        same_lineage(sc.name, res, once(False), target_shape(sc, i, backward))
    return res, f"reexec:{mode.value}"
