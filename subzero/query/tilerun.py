"""Tile-limited re-execution: re-run a tile-parallel operator on only the tiles a
query touches.

An operator declared ``elementwise`` or ``stencil(r)`` computes each output
cell from the input cells within ``r`` of it, so its output over a tile's
*core* follows from its inputs over the tile's *read* region (core + halo
``r``, clipped at the edges) — exactly how the Spark engine runs it
(``subzero.capture.tiles``).  A trace step through it needs only:

* backward: the tiles whose core holds a query (output) cell;
* forward: the tiles whose read region holds a query (input) cell (every
  output cell that depends on an input cell lies in such a tile's core), and,
  for composite lineage, the tiles whose core holds a cell the mapping
  function reaches (whether a payload pair covers it decides its lineage).

Only those tiles' read regions are read from the array store (checksummed
reads), the operator runs per tile with a query buffer, the lineage of core
cells is translated to array coordinates, and each tile's output core must
equal the stored output there.  A tile that differs proves nothing yet: an
operator declared elementwise may still read positions (a mask of the
science region in array coordinates) — wrong on any tile but the first, and
wrong on the Spark engine too.  So it is re-run whole, with a warning naming
the declaration, and the whole re-run's check decides: a non-deterministic
operator still stops the trace with the "not deterministic" error.  Tiles follow the stored output's
chunks (the run's tile), so each read touches the fewest chunks.

Anything else — global and aggregate operators, operators with a whole-array
statistic, inputs of another shape than
the output, an operator that returns another shape for a tile, a query that
touches every tile — re-runs whole (:func:`rerun_tiles` returns None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.capture.tiles import Tile, concat_pairs, globalize, tile_at, tile_plan, tile_shape
from subzero.errors import WholeArray, warn
from subzero.model.cells import pack, unique_ids, unpack
from subzero.model.modes import Mode
from subzero.query.reexec import Rerun, capture_mode, check_deterministic, differs, run_with_buffer
from subzero.query.relation import StepContext
from subzero.storage.arrays import as_dataarray

__all__ = ["TileAccess", "fraction", "halo", "rerun_tiles", "share", "touched_tiles"]

Region = tuple[slice, ...]


@dataclass
class TileAccess:
    """How a tile-limited re-run reaches the run's stored arrays (plain callables, so
    the executor keeps its own caching): the operator's input arrays, a checksummed
    region read, and the stored output's chunk shape (the run's tile).  One per
    operator and executor: ``whole`` remembers that a tile re-run of it differed from
    the stored output, so later queries re-run it whole at once."""

    inputs: Sequence[str]
    read_region: Callable[[str, Region], np.ndarray]
    chunks: Callable[[], tuple[int, ...]]
    whole: bool = False


def halo(sc: StepContext) -> int | None:
    """The halo radius when the step's operator can re-run per tile, else None: declared
    elementwise or stencil, every input of the output's (stored) shape, and no
    whole-array statistic (a tile alone cannot compute it)."""
    if not sc.in_shapes or any(tuple(s) != sc.out_shape for s in sc.in_shapes):
        return None
    if sc.op.statistic is not None:
        return None
    return tile_plan(sc.op, sc.in_shapes)


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


def _select(sc: StepContext, ts: tuple[int, ...], h: int, q: np.ndarray, i: int,
            backward: bool, mode: Mode | None) -> np.ndarray:
    shape = sc.out_shape
    if backward:
        return touched_tiles(shape, ts, h, q, by_core=True)
    idx = touched_tiles(shape, ts, h, q, by_core=False)
    if mode is Mode.COMP:     # the mapped cells' coverage decides their lineage
        reach = np.unique(sc.map_f(q, i))
        more = touched_tiles(shape, ts, h, reach, by_core=True)
        grid = tuple(-(-n // k) for n, k in zip(shape, ts))
        ids = np.union1d(pack(idx, grid), pack(more, grid))
        idx = unpack(ids, grid)
    return idx


def fraction(sc: StepContext, ts: Sequence[int], q: np.ndarray, i: int, backward: bool,
             mode: Mode | None) -> float:
    """The share of the operator's tiles a re-run for query ``q`` would run (1.0 when it
    would re-run whole): what the query-time planner scales re-execution's cost by."""
    h = halo(sc)
    if h is None or mode is None:
        return 1.0
    t = tile_shape(sc.out_shape, tuple(ts))
    total = int(np.prod([-(-n // k) for n, k in zip(sc.out_shape, t)], dtype=np.int64))
    return len(_select(sc, t, h, q, i, backward, mode)) / max(total, 1)


def share(sc: StepContext, access: TileAccess, q: np.ndarray, i: int, backward: bool) -> float:
    """:func:`fraction` for the step's operator, learning the tile only when the
    operator can re-run per tile (reading the stored chunk shape costs an open)."""
    if halo(sc) is None:
        return 1.0
    return fraction(sc, access.chunks(), q, i, backward, capture_mode(sc.op))


def _local_hits(tile: Tile, q: np.ndarray, shape: tuple[int, ...],
                region: tuple[tuple[int, int], ...]) -> Callable[[np.ndarray], np.ndarray]:
    """The query's cells inside ``region`` (array coordinates), as a membership test on
    packed ids of the tile's read region: a bitmap the size of the tile."""
    local = tile.read_shape()
    bits = np.zeros(int(np.prod(local, dtype=np.int64)), bool)
    c = unpack(q, shape)
    lo = np.asarray([a for a, _ in region])
    hi = np.asarray([b for _, b in region])
    inside = np.all((c >= lo) & (c < hi), axis=1)
    bits[pack(c[inside] - np.asarray(tile.origin), local)] = True
    return lambda ids: bits[ids]


def _globalize_covered(covered: np.ndarray | None, tile: Tile,
                       shape: tuple[int, ...]) -> np.ndarray | None:
    if covered is None:
        return None
    c = unpack(covered, tile.read_shape()) + np.asarray(tile.origin)
    lo = np.asarray([a for a, _ in tile.core])
    hi = np.asarray([b for _, b in tile.core])
    return pack(c[np.all((c >= lo) & (c < hi), axis=1)], shape)


def rerun_tiles(sc: StepContext, mode: Mode, backward: bool, i: int, q: np.ndarray,
                access: TileAccess, stored: Callable[[Region], np.ndarray]) -> Rerun | None:
    """Re-run the step's operator on the tiles query ``q`` (sorted packed cells of the
    output going backward, of input ``i`` going forward) touches; each tile's output
    core is checked against the stored output (``stored(region)``).  Returns the pairs
    in array coordinates (``output`` None: already checked), or None when the operator
    must re-run whole."""
    h = halo(sc)
    if h is None or access.whole:
        return None
    name, op, shape = sc.name, sc.op, sc.out_shape
    check_deterministic(name, op)
    ts = tile_shape(shape, tuple(access.chunks()))
    n = len(sc.in_shapes)
    fulls: list[Pairs | None] = []
    pays: list[Pairs | None] = []
    covered: list[np.ndarray] = []
    chosen = _select(sc, ts, h, q, i, backward, mode)
    if len(chosen) == int(np.prod([-(-m // k) for m, k in zip(shape, ts)], dtype=np.int64)):
        return None       # every tile: one whole re-run does the same work with less overhead
    try:
        for idx in chosen:
            tile = tile_at(shape, ts, idx, h)
            local = tile.read_shape()
            ins = [access.read_region(a, tile.read_slices()) for a in access.inputs]
            hit = _local_hits(tile, q, shape, tile.core if backward else tile.read)
            r = run_with_buffer(name, op, ins, [local] * n, local, mode, backward, i, hit,
                                f" on tile {tile.describe()}")
            if r.output is None:        # run() returned nothing: the whole re-run says so
                raise WholeArray
            new = np.asarray(as_dataarray(r.output, name).values)
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
            fulls.append(globalize(r.full, tile, shape, sc.in_shapes, [local] * n))
            pays.append(globalize(r.pay, tile, shape, sc.in_shapes, [local] * n))
            cov = _globalize_covered(r.covered, tile, shape)
            if cov is not None:
                covered.append(cov)
    except WholeArray:
        return None
    cov_all = (np.unique(np.concatenate(covered)) if covered else np.zeros(0, np.int64)) \
        if mode is Mode.COMP else None
    return Rerun(concat_pairs(fulls, n), concat_pairs(pays, n), cov_all, None)
