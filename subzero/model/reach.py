"""An operator's payload reach: how far an input cell of a payload pair can be from
the pair's output cells.

A payload pair (O, p) stores output cells and a payload; ``map_p`` turns them into
input cells later.  Indexed by output cells, such lineage answers a backward step by
a key lookup, but a forward step (input cells -> output cells) has nothing to look
up: it must decode every pair and keep those whose ``map_p`` meets the query, so its
cost follows the operator's whole lineage, that is the image.

An operator whose inputs share the output's coordinates can say more:
``payload_reach = r`` declares that every input cell ``map_p`` gives a pair lies
within ``r`` cells, along every axis, of one of the pair's output cells (a cell
repaired from its 5x5 window: ``r = 2``; a star whose pixels depend on the same
pixels: ``r = 0``).  A pair that reaches a query cell then has an output cell within
``r`` of it, so a forward step needs only the pairs whose output cells lie in the
query grown by ``r`` (:func:`grown`) -- a key lookup, whatever the image's size.

The declaration is checked at capture time (:func:`check`), on every pair the run
stores, and the reach is recorded with the lineage only when the check passed: a
trace uses the recorded reach, never the operator's current declaration, so an
operator that declares too little stops its run with a clear error, and lineage
written without a check is scanned as before -- never a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from subzero.errors import LineageError
from subzero.model.cells import fmt_cell, in_sorted, pack, unpack
from subzero.model.operator import Operator

#: ``map_p_pairs(out_cells, offsets, payloads, pay_ids, i) -> (incells, owner)``
MapPPairs = Callable[[np.ndarray, np.ndarray, Sequence[bytes], np.ndarray, int],
                     tuple[np.ndarray, np.ndarray]]
#: Pairs per piece of the check, and cells of neighbourhood per piece of its exact
#: part: they bound its memory (tens of MB) whatever the operator's lineage.
CHECK_PAIRS = 1 << 18
CHECK_CELLS = 1 << 22


def declared(op: Operator, n_inputs: int, name: str | None = None) -> tuple[int | None, ...] | None:
    """The operator's declared reach per input (None where it declares none), or None
    when it declares none at all; a malformed declaration is a clear error naming the
    operator (``name``: its name in the workflow)."""
    r = getattr(op, "payload_reach", None)
    if r is None:
        return None
    if isinstance(r, (int, np.integer)):
        per = [r] * n_inputs
    elif isinstance(r, (list, tuple)):
        per = list(r)
    else:
        per = []
    if len(per) != n_inputs or any(x is not None and (isinstance(x, bool) or not isinstance(
            x, (int, np.integer)) or x < 0) for x in per):
        who = repr(name) if name else type(op).__name__
        raise LineageError(f"operator {who}: payload_reach must be a whole number >= 0, or one "
                           f"per input ({n_inputs}), each a whole number >= 0 or None; not {r!r}")
    out = tuple(None if x is None else int(x) for x in per)
    return out if any(x is not None for x in out) else None


def check(name: str, reach: Sequence[int | None], out_cells: np.ndarray, out_off: np.ndarray,
          payloads: Sequence[bytes], pay_ids: np.ndarray, map_p_pairs: MapPPairs,
          out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]) -> None:
    """Raise :class:`LineageError` unless every input cell ``map_p_pairs`` gives each
    pair (``out_cells`` unpacked, ``out_off`` offsets per pair) lies within the declared
    reach of one of that pair's output cells, for each input with a reach.

    Vectorized: the distance to the pair's bounding box rules most cells in or out at
    once (exact for a pair of one cell); a cell of a larger pair that is not itself an
    output cell of its pair is looked for in the pair's cells around it.  Pairs go in
    pieces of :data:`CHECK_PAIRS`, so the memory follows the piece."""
    out_cells = np.asarray(out_cells, np.int64).reshape(-1, len(out_shape))
    out_off = np.asarray(out_off, np.int64)
    pay_ids = np.asarray(pay_ids, np.int64)
    for a in range(0, len(out_off) - 1, CHECK_PAIRS):
        b = min(len(out_off) - 1, a + CHECK_PAIRS)
        off = out_off[a:b + 1]
        _check_pairs(name, reach, out_cells[off[0]:off[-1]], off - off[0], payloads,
                     pay_ids[a:b], map_p_pairs, out_shape, in_shapes)


def _check_pairs(name: str, reach: Sequence[int | None], out_cells: np.ndarray,
                 out_off: np.ndarray, payloads: Sequence[bytes], pay_ids: np.ndarray,
                 map_p_pairs: MapPPairs, out_shape: Sequence[int],
                 in_shapes: Sequence[Sequence[int]]) -> None:
    """:func:`check` of one piece of pairs."""
    lens = np.diff(out_off)
    keep = np.flatnonzero(lens > 0)          # a pair without output cells is never stored
    if keep.size == 0:
        return
    starts = out_off[:-1][keep]
    lo = np.minimum.reduceat(out_cells, starts, axis=0)
    hi = np.maximum.reduceat(out_cells, starts, axis=0)
    slot = np.full(len(lens), -1, np.int64)
    slot[keep] = np.arange(keep.size)
    for i, r in enumerate(reach):
        if r is None:
            continue
        if len(in_shapes[i]) != len(out_shape):
            raise LineageError(f"operator {name!r} declares a payload reach for input {i}, but "
                               f"the input has {len(in_shapes[i])} dimensions and the output "
                               f"{len(out_shape)}: a reach compares coordinates, declare None "
                               f"for that input")
        cells, owner = map_p_pairs(out_cells, out_off, payloads, pay_ids, i)
        cells = np.asarray(cells, np.int64).reshape(-1, len(out_shape))
        owner = np.asarray(owner, np.int64)
        s = slot[owner]
        cells, owner, s = cells[s >= 0], owner[s >= 0], s[s >= 0]
        gap = np.maximum(np.maximum(lo[s] - cells, cells - hi[s]), 0).max(axis=1, initial=0)
        far = gap > r
        if far.any():
            _too_far(name, i, r, cells, owner, out_cells, out_off, np.flatnonzero(far)[0])
        multi = np.flatnonzero(lens[owner] > 1)
        if multi.size:
            _check_near(name, i, r, cells[multi], owner[multi], out_cells, out_off, out_shape)


def _check_near(name: str, i: int, r: int, cells: np.ndarray, owner: np.ndarray,
                out_cells: np.ndarray, out_off: np.ndarray, out_shape: Sequence[int]) -> None:
    """The exact check for cells of pairs of several output cells: each must have an
    output cell of its own pair within ``r`` (looked up as (pair, cell) keys)."""
    shape = np.asarray(out_shape, np.int64)
    size = int(np.prod(shape))
    pair_of = np.repeat(np.arange(len(out_off) - 1), np.diff(out_off))
    keys = np.unique(pair_of * size + pack(out_cells, tuple(out_shape)))
    inside = np.all((cells >= 0) & (cells < shape), axis=1)
    k = owner * size + pack(np.where(inside[:, None], cells, 0), tuple(out_shape))
    found = inside & in_sorted(keys, k)
    rest = np.flatnonzero(~found)
    if rest.size == 0 or r == 0:
        if rest.size:
            _too_far(name, i, r, cells, owner, out_cells, out_off, rest[0])
        return
    offs = np.argwhere(np.ones((2 * r + 1,) * len(out_shape), bool)) - r
    step = max(1, CHECK_CELLS // len(offs))
    for a in range(0, rest.size, step):
        idx = rest[a:a + step]
        nb = cells[idx][:, None, :] + offs[None, :, :]
        ok = np.all((nb >= 0) & (nb < shape), axis=2)
        nk = owner[idx][:, None] * size + pack(np.where(ok[..., None], nb, 0).reshape(-1, len(shape)),
                                               tuple(out_shape)).reshape(ok.shape)
        hit = (ok & in_sorted(keys, nk.reshape(-1)).reshape(ok.shape)).any(axis=1)
        if not hit.all():
            _too_far(name, i, r, cells, owner, out_cells, out_off, idx[np.flatnonzero(~hit)[0]])


def _too_far(name: str, i: int, r: int, cells: np.ndarray, owner: np.ndarray, out_cells: np.ndarray,
             out_off: np.ndarray, row: int) -> None:
    first = out_cells[out_off[owner[row]]]
    n = int(out_off[owner[row] + 1] - out_off[owner[row]])
    raise LineageError(
        f"operator {name!r} declares payload_reach {r} for input {i}, but its payload pair at "
        f"output cell {fmt_cell(first)}{f' (and {n - 1} more)' if n > 1 else ''} maps to input "
        f"cell {fmt_cell(cells[row])}, farther than {r} cells from every output cell of the "
        f"pair: declare a larger payload_reach, or None")


def grown(ids: np.ndarray, in_shape: Sequence[int], r: int, out_shape: Sequence[int],
          limit: int) -> np.ndarray | None:
    """The output cells (packed, sorted, unique) within ``r`` cells of the input cells
    ``ids`` (packed in ``in_shape``, sorted), or None when they would be more than
    ``limit`` cells (a scan of every pair is then no dearer).

    A compact query (a box, a blob: most traces) is grown as a bitmap of its bounding
    box, dilated one axis at a time; a scattered one, whose box would be mostly empty,
    as intervals: each run of consecutive cells along the last axis widened by ``r``
    and repeated on the ``(2r+1)^(ndim-1)`` neighbouring rows.  Either way the work
    follows the query, never the array."""
    if ids.size == 0:
        return np.zeros(0, np.int64)
    if ids.size > limit:
        return None
    if r == 0 and tuple(in_shape) == tuple(out_shape):     # a pair's own cells: the query itself
        return ids
    cells = unpack(ids, tuple(in_shape))
    lo = cells.min(axis=0) - r
    ext = cells.max(axis=0) + r + 1 - lo
    volume = int(np.prod(ext))
    if volume <= 8 * ids.size * (2 * r + 1) ** len(in_shape) and volume <= 4 * limit:
        return _grown_box(cells, lo, ext, r, out_shape, limit)
    return _grown_runs(ids, cells, in_shape, r, out_shape, limit)


def _grown_box(cells: np.ndarray, lo: np.ndarray, ext: np.ndarray, r: int,
               out_shape: Sequence[int], limit: int) -> np.ndarray | None:
    """:func:`grown` through a bitmap of the query's box grown by ``r``."""
    bm = np.zeros(tuple(int(e) for e in ext), bool)
    bm[tuple((cells - lo).T)] = True
    for ax in range(bm.ndim):                    # the box window is separable
        src = bm
        bm = src.copy()
        n = src.shape[ax]
        for s in range(1, min(r, n - 1) + 1):
            head = [slice(None)] * src.ndim
            tail = [slice(None)] * src.ndim
            head[ax], tail[ax] = slice(s, None), slice(None, n - s)
            bm[tuple(head)] |= src[tuple(tail)]
            bm[tuple(tail)] |= src[tuple(head)]
    shape = np.asarray(out_shape, np.int64)
    a = np.maximum(lo, 0)                        # the part inside the output array
    b = np.minimum(lo + ext, shape)
    if np.any(b <= a):
        return np.zeros(0, np.int64)
    part = bm[tuple(slice(int(x - o), int(y - o)) for x, y, o in zip(a, b, lo))]
    found = np.argwhere(part)
    if len(found) > limit:
        return None
    return pack(found + a, tuple(out_shape))     # argwhere is in C order: sorted ids


def _grown_runs(ids: np.ndarray, cells: np.ndarray, in_shape: Sequence[int], r: int,
                out_shape: Sequence[int], limit: int) -> np.ndarray | None:
    """:func:`grown` through the query's runs along the last axis."""
    ndim = len(in_shape)
    last = int(in_shape[-1])
    brk = np.flatnonzero((np.diff(ids) != 1) | ((ids[1:] % last) == 0)) + 1
    first = cells[np.concatenate(([0], brk))]
    end = cells[np.concatenate((brk, [ids.size])) - 1]
    lo = np.maximum(first[:, -1] - r, 0)
    hi = np.minimum(end[:, -1] + r, int(out_shape[-1]) - 1)
    offs = np.argwhere(np.ones((2 * r + 1,) * (ndim - 1), bool)) - r        # (K, ndim-1)
    estimate = len(first) * len(offs) * int((hi - lo + 1).clip(0).mean())
    if estimate > limit:
        return None
    lead = first[:, None, :-1] + offs[None, :, :]                            # (runs, K, ndim-1)
    ok = np.all((lead >= 0) & (lead < np.asarray(out_shape[:-1], np.int64)), axis=2) \
        & (hi >= lo)[:, None]
    run, k = np.nonzero(ok)
    lead = lead[run, k]
    n = (hi - lo + 1)[run]
    within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    out = np.column_stack([np.repeat(lead, n, axis=0), np.repeat(lo[run], n) + within])
    return np.unique(pack(out, tuple(out_shape)))
