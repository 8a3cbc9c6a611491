"""Tile-limited re-execution: re-run a tile-parallel operator on only the parts of
the tiles a query touches.

An operator declared ``elementwise`` or ``stencil(r)`` computes each output
cell from the input cells within ``r`` of it, so its output over a box of
cells is exactly what it computes from the box grown by ``r`` (what a run's tile
does over its core and halo; ``subzero.capture.tiles``).  A trace step through
it needs only:

* backward: the tiles whose core holds a query (output) cell;
* forward: the tiles whose read region holds a query (input) cell (every
  output cell that depends on an input cell lies in such a tile's core), and,
  for composite lineage, the tiles whose core holds a cell the mapping
  function reaches (whether a payload pair covers it decides its lineage).

and of each such tile only the box its query cells span (going forward grown
by ``r``: the output cells they can reach), clipped to the tile's core: a star
of 40 pixels re-runs 40 pixels and their halo, not the 512 x 512 chunk that
holds it.  Boxes stay within the stored output's chunks (the run's tiles), so
each read touches the fewest chunks.

Only those boxes' read regions are read from the array store (checksummed
reads), the operator runs per box with a query buffer and sees what the run's
tile saw (its origin in the array, the array's shape, the whole array's
statistic), the lineage of the box's cells is translated to array
coordinates, and the box's output must equal the stored output there.  A box
that differs proves nothing yet: an operator declared elementwise may still
read positions (a mask of the science region in array coordinates) — wrong on
any tile but the first, and wrong on the Spark engine too.  So it is re-run
whole, with a warning naming the declaration, and the whole re-run's check
decides: a non-deterministic operator still stops the trace with the "not
deterministic" error.

An operator with a whole-array :attr:`~subzero.Operator.statistic` (L.A.Cosmic's
sky median) re-runs per box too, given the statistic the run used
(:attr:`TileAccess.statistic`: the value the run kept, verified against its
signed record, else computed again over the stored input's tiles).  An input of
one cell (a scalar the operator broadcasts) is read whole by every box.

Anything else — global and aggregate operators, inputs of another shape than
the output, an operator that returns another shape for a tile, a statistic
that cannot be had, a forward step from a one-cell input, a query that touches
every tile — re-runs whole (:func:`rerun_tiles` returns None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.capture.runner import NOT_GIVEN
from subzero.capture.tiles import (
    Tile,
    concat_pairs,
    globalize,
    input_slices,
    one_cell,
    tile_at,
    tile_halo,
    tile_shape,
)
from subzero.errors import WholeArray, warn
from subzero.model.cells import pack, unique_ids, unpack
from subzero.model.modes import Mode
from subzero.query.reexec import Rerun, capture_mode, check_deterministic, differs, run_with_buffer
from subzero.query.relation import StepContext
from subzero.query.threads import one_thread_for
from subzero.storage.arrays import as_values

__all__ = ["TileAccess", "fraction", "globalize_covered", "halo", "inside", "local_hits", "merge_boxes",
           "query_boxes", "rerun_tiles", "share", "touched_tiles"]

Region = tuple[slice, ...]


@dataclass
class TileAccess:
    """How a tile-limited re-run reaches the run's stored arrays (plain callables, so
    the executor keeps its own caching): the operator's input arrays, a checksummed
    region read, the stored output's chunk shape (the run's tile) and, for an operator
    with a statistic, the whole array's value the run used (``NOT_GIVEN`` when it
    cannot be had: the operator then re-runs whole).  One per operator and executor:
    ``whole`` remembers that a tile re-run of it differed from the stored output, so
    later queries re-run it whole at once."""

    inputs: Sequence[str]
    read_region: Callable[[str, Region], np.ndarray]
    chunks: Callable[[], tuple[int, ...]]
    statistic: Callable[[], Any] = lambda: NOT_GIVEN
    whole: bool = False
    #: the last re-run's key and result (:meth:`recall`)
    last: tuple[tuple[Any, ...], np.ndarray, Rerun] | None = None

    def recall(self, key: tuple[Any, ...], q: np.ndarray, run: Callable[[], Rerun]) -> Rerun:
        """The re-run for ``key`` and query ``q``, the last one's when both are the same:
        a backward trace reaches an operator of two inputs once per input with the same
        output cells, and a backward re-run keeps the pairs of every input (keyed on the
        output), so the second step reuses the first's checked pairs.  Only a re-run of
        boxes is kept (its pairs are the query's, small); a whole re-run holds the whole
        output, which is not kept alive for later."""
        last = self.last
        if last is not None and last[0] == key and np.array_equal(last[1], q):
            return last[2]
        r = run()
        self.last = (key, q, r) if r.output is None else None
        return r


def halo(sc: StepContext) -> int | None:
    """The halo radius when the step's operator can re-run per tile, else None
    (:func:`~subzero.capture.tiles.tile_halo` of its stored shapes)."""
    return tile_halo(sc.op, sc.in_shapes, sc.out_shape)


def _from_scalar(sc: StepContext, i: int, backward: bool) -> bool:
    """A forward step from a one-cell input: every output cell may depend on it."""
    return not backward and one_cell(sc.in_shapes[i]) and not one_cell(sc.out_shape)


def touched_tiles(shape: tuple[int, ...], ts: tuple[int, ...], h: int, q: np.ndarray,
                  by_core: bool) -> np.ndarray:
    """Sorted distinct grid indices (``(k, ndim)``) of the ``ts`` tiles over ``shape``
    whose core (``by_core``) or read region (core + halo ``h``) holds a cell of ``q``
    (sorted packed ids); the cost follows the query, not the grid."""
    grid = tuple(-(-n // k) for n, k in zip(shape, ts))
    if q.size == 0:
        return np.zeros((0, len(shape)), np.int64)
    c = unpack(q, shape)
    t = np.asarray(ts, np.int64)
    if by_core or h == 0:
        ids = pack(c // t, grid)
    else:
        top = np.asarray(grid, np.int64) - 1
        lo = np.maximum((c - h) // t, 0)
        hi = np.minimum((c + h) // t, top)
        span = (hi - lo).max(axis=0) + 1
        parts = []
        for off in product(*(range(int(k)) for k in span)):
            cand = lo + np.asarray(off, np.int64)
            ok = np.all(cand <= hi, axis=1)
            parts.append(pack(cand[ok], grid))
        ids = np.concatenate(parts)
    return unpack(unique_ids(ids, int(np.prod(grid, dtype=np.int64))), grid)


def _reach(sc: StepContext, q: np.ndarray, i: int, backward: bool, mode: Mode | None
           ) -> np.ndarray | None:
    """Going forward in composite mode, the output cells the mapping function reaches
    from ``q``: whether a payload pair covers them decides their lineage."""
    if backward or mode is not Mode.COMP:
        return None
    return np.unique(np.asarray(sc.map_f(q, i), np.int64))


def _select(sc: StepContext, ts: tuple[int, ...], h: int, q: np.ndarray, i: int,
            backward: bool, reach: np.ndarray | None) -> np.ndarray:
    shape = sc.out_shape
    if backward:
        return touched_tiles(shape, ts, h, q, by_core=True)
    idx = touched_tiles(shape, ts, h, q, by_core=False)
    if reach is not None:
        more = touched_tiles(shape, ts, h, reach, by_core=True)
        grid = tuple(-(-n // k) for n, k in zip(shape, ts))
        ids = np.union1d(pack(idx, grid), pack(more, grid))
        idx = unpack(ids, grid)
    return idx


def inside(c: np.ndarray, region: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Which cells of ``c`` (``(k, ndim)``) lie in ``region`` (``(start, stop)`` per axis)."""
    lo = np.asarray([a for a, _ in region], np.int64)
    hi = np.asarray([b for _, b in region], np.int64)
    return np.all((c >= lo) & (c < hi), axis=1)


def query_boxes(shape: tuple[int, ...], ts: tuple[int, ...], h: int, q: np.ndarray,
                backward: bool, chosen: np.ndarray, reach: np.ndarray | None = None
                ) -> list[Tile]:
    """Per chosen tile (grid indices), the box of its core the query needs, as a tile
    (core: the box; read: the box grown by ``h``, clipped): backward the bounding box
    of the query's cells in its core; forward that of the cells in its read region
    grown by ``h`` (the output cells they can reach), and of the ``reach`` cells in its
    core.  Every output cell whose lineage the query needs lies in one of these cores.
    Neighbouring boxes are merged where that reads no more cells (:func:`merge_boxes`)."""
    c = unpack(q, shape) if q.size else np.zeros((0, len(shape)), np.int64)
    r = unpack(reach, shape) if reach is not None and reach.size else None
    boxes = []
    for idx in chosen:
        t = tile_at(shape, ts, idx, h)
        pts = c[inside(c, t.core if backward else t.read)]
        grow = 0 if backward else h
        lo = [pts.min(axis=0) - grow] if len(pts) else []
        hi = [pts.max(axis=0) + 1 + grow] if len(pts) else []
        if r is not None:
            more = r[inside(r, t.core)]
            if len(more):
                lo.append(more.min(axis=0))
                hi.append(more.max(axis=0) + 1)
        if not lo:
            continue
        core_lo = np.maximum(np.min(lo, axis=0), [a for a, _ in t.core])
        core_hi = np.minimum(np.max(hi, axis=0), [b for _, b in t.core])
        if np.any(core_lo >= core_hi):
            continue
        boxes.append(_box(t.index, tuple((int(a), int(b)) for a, b in zip(core_lo, core_hi)),
                          h, shape))
    return merge_boxes(boxes, h, shape)


def _box(index: tuple[int, ...], core: tuple[tuple[int, int], ...], h: int,
         shape: tuple[int, ...]) -> Tile:
    read = tuple((max(0, a - h), min(int(m), b + h)) for (a, b), m in zip(core, shape))
    return Tile(index, core, read)


def _cells(region: tuple[tuple[int, int], ...]) -> int:
    return int(np.prod([b - a for a, b in region], dtype=np.int64))


def merge_boxes(boxes: list[Tile], h: int, shape: tuple[int, ...]) -> list[Tile]:
    """Neighbouring boxes merged where one box reads no more cells than the two apart
    (the boxes of a strip of cells along one axis, boxes whose halos overlap): each
    read and each run costs a fixed overhead, and the cells re-run stay the same.
    One pass per axis over the boxes in order along it (linear in their number)."""
    for d in range(len(shape)):
        order = sorted(boxes, key=lambda t: tuple(t.core[k][0] for k in
                                                  [d] + [k for k in range(len(shape)) if k != d]))
        out: list[Tile] = []
        for t in order:
            if out:
                last = out[-1]
                core = tuple((min(a, c), max(b, e)) for (a, b), (c, e) in zip(last.core, t.core))
                u = _box(last.index, core, h, shape)
                if _cells(u.read) <= _cells(last.read) + _cells(t.read):
                    out[-1] = u
                    continue
            out.append(t)
        boxes = out
    return boxes


def fraction(sc: StepContext, ts: Sequence[int], q: np.ndarray, i: int, backward: bool,
             mode: Mode | None) -> float:
    """The share of the operator's tiles a re-run for query ``q`` would run (1.0 when it
    would re-run whole): what the query-time planner scales re-execution's cost by."""
    h = halo(sc)
    if h is None or mode is None or _from_scalar(sc, i, backward):
        return 1.0
    t = tile_shape(sc.out_shape, tuple(ts))
    total = int(np.prod([-(-n // k) for n, k in zip(sc.out_shape, t)], dtype=np.int64))
    return len(_select(sc, t, h, q, i, backward, _reach(sc, q, i, backward, mode))) / max(total, 1)


def share(sc: StepContext, access: TileAccess, q: np.ndarray, i: int, backward: bool) -> float:
    """:func:`fraction` for the step's operator, learning the tile only when the
    operator can re-run per tile (reading the stored chunk shape costs an open)."""
    if halo(sc) is None:
        return 1.0
    return fraction(sc, access.chunks(), q, i, backward, capture_mode(sc.op))


def local_hits(tile: Tile, q: np.ndarray, shape: tuple[int, ...],
                region: tuple[tuple[int, int], ...]) -> Callable[[np.ndarray], np.ndarray]:
    """The query's cells inside ``region`` (array coordinates), as a membership test on
    packed ids of the tile's read region: a bitmap the size of the tile."""
    local = tile.read_shape()
    bits = np.zeros(int(np.prod(local, dtype=np.int64)), bool)
    c = unpack(q, shape)
    bits[pack(c[inside(c, region)] - np.asarray(tile.origin), local)] = True
    return lambda ids: bits[ids]


def globalize_covered(covered: np.ndarray | None, tile: Tile,
                       shape: tuple[int, ...]) -> np.ndarray | None:
    if covered is None:
        return None
    c = unpack(covered, tile.read_shape()) + np.asarray(tile.origin)
    return pack(c[inside(c, tile.core)], shape)


def rerun_tiles(sc: StepContext, mode: Mode, backward: bool, i: int, q: np.ndarray,
                access: TileAccess, stored: Callable[[Region], np.ndarray]) -> Rerun | None:
    """Re-run the step's operator on the boxes of the tiles query ``q`` (sorted packed
    cells of the output going backward, of input ``i`` going forward) touches; each
    box's output is checked against the stored output (``stored(region)``).  Returns
    the pairs in array coordinates (``output`` None: already checked), or None when
    the operator must re-run whole."""
    h = halo(sc)
    if h is None or access.whole or _from_scalar(sc, i, backward):
        return None
    name, op, shape = sc.name, sc.op, sc.out_shape
    check_deterministic(name, op)
    ts = tile_shape(shape, tuple(access.chunks()))
    reach = _reach(sc, q, i, backward, mode)
    chosen = _select(sc, ts, h, q, i, backward, reach)
    if len(chosen) == int(np.prod([-(-m // k) for m, k in zip(shape, ts)], dtype=np.int64)):
        return None       # every tile: one whole re-run does the same work with less overhead
    stat = access.statistic() if op.statistic is not None else NOT_GIVEN
    if op.statistic is not None and stat is NOT_GIVEN:
        return None
    n = len(sc.in_shapes)
    fulls: list[Pairs | None] = []
    pays: list[Pairs | None] = []
    covered: list[np.ndarray] = []
    boxes = query_boxes(shape, ts, h, q, backward, chosen, reach)
    biggest = max((int(np.prod(t.read_shape(), dtype=np.int64)) for t in boxes), default=0)
    try:
        with one_thread_for(biggest):     # native pools on one thread for small boxes
            for tile in boxes:
                local = tile.read_shape()
                ins = [access.read_region(a, input_slices(tile, s))
                       for a, s in zip(access.inputs, sc.in_shapes)]
                locals_ = [tuple(int(k) for k in np.shape(x)) or (1,) for x in ins]
                hit = local_hits(tile, q, shape, tile.core if backward else tile.read)
                r = run_with_buffer(name, op, ins, locals_, local, mode, backward, i, hit,
                                    f" on tile {tile.describe()}", origin=tile.origin,
                                    array_shape=shape, statistic=stat)
                if r.output is None:        # run() returned nothing: the whole re-run says so
                    raise WholeArray
                new = as_values(r.output, name)
                if new.shape != local:
                    raise WholeArray
                why = differs(new[tile.core_in_read()], np.asarray(stored(tile.core_slices())),
                              [a for a, _ in tile.core])
                if why:
                    warn(f"operator {name!r} is declared {op.tiling.kind} but its re-run on tile "
                         f"{tile.describe()} differs from the stored output ({why}); re-running it "
                         f"whole (an operator that reads positions, or cells beyond its declared "
                         f"radius, must be declared global)")
                    access.whole = True
                    raise WholeArray
                fulls.append(globalize(r.full, tile, shape, sc.in_shapes, locals_))
                pays.append(globalize(r.pay, tile, shape, sc.in_shapes, locals_))
                cov = globalize_covered(r.covered, tile, shape)
                if cov is not None:
                    covered.append(cov)
    except WholeArray:
        return None
    cov_all = (np.unique(np.concatenate(covered)) if covered else np.zeros(0, np.int64)) \
        if mode is Mode.COMP else None
    return Rerun(concat_pairs(fulls, n), concat_pairs(pays, n), cov_all, None)
