"""Composite lineage: identity by default, a window where the operator says so.

Many scientific UDFs change a few cells and pass the rest through: a
cosmic-ray detector flags hits, a hot-pixel filter repairs outliers, an event
finder marks voxels.  An unflagged output cell depends on the same cell of
every input (the identity mapping, free to store), a flagged one on the
window around it.  That is SubZero's Comp mode: the identity mapping
functions plus one small payload pair per exception.

A payload names the input window of its pair in one of two forms:

* :func:`radius_payload` (1 byte): the box of that radius around each output
  cell of the pair, clipped to the input;
* :func:`box_payload` (``2 * ndim`` little-endian int32: ``lo``, then ``hi``):
  one fixed half-open box of the input, for pairs that cover a whole tile.

Both distribute over cells (a pair's window is the union of its cells'
windows, or the same box for any non-empty part of the pair), so the
executor may batch ``map_p`` over pairs that share a payload.

:class:`WindowComposite` is the base class: a subclass implements
``compute_flagged(*arrays) -> (output, flagged)`` and sets ``radius``; the
base writes the lineage the context asks for (Comp, Pay, Full) with a few
batched ``lwrite`` calls, and answers traces with vectorized mapping
functions.  A subclass whose lineage is not "flagged cells" (tiles, say)
overrides ``run`` and writes its own pairs with the same payloads.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from subzero import LineageError, Mode, Operator
from subzero.model.cells import window

#: Bytes of a radius payload; a box payload is ``BOX_INT_BYTES * 2 * ndim``.
RADIUS_BYTES = 1
BOX_INT_BYTES = 4


def radius_payload(radius: int) -> bytes:
    """The payload "the window of this radius around each cell" (0 <= radius <= 255)."""
    if not 0 <= int(radius) <= 255:
        raise LineageError(f"a window radius payload holds 0..255, not {radius}")
    return bytes([int(radius)])


def box_payload(lo: Sequence[int], hi: Sequence[int]) -> bytes:
    """The payload "the input cells of the half-open box [lo, hi)"."""
    return box_payloads(np.asarray(lo)[None], np.asarray(hi)[None])[0]


def box_payloads(lo: np.ndarray, hi: np.ndarray) -> list[bytes]:
    """:func:`box_payload` of each row of ``lo`` and ``hi`` (``(N, ndim)`` each)."""
    rows = np.ascontiguousarray(np.column_stack([lo, hi]).astype("<i4"))
    if rows.shape[1] == 0:
        return [b""] * len(rows)
    # one void item per row: its tolist() is the row's bytes, trailing zeros kept, without
    # a Python call per row (0.3 against 1.2 us a box)
    return rows.view(f"V{rows.shape[1] * 4}").ravel().tolist()


def window_offsets(radius: int, ndim: int) -> np.ndarray:
    """Offsets of a ``(2r+1)^ndim`` window, ``(K, ndim)``, C order."""
    return np.argwhere(np.ones((2 * radius + 1,) * ndim, bool)) - radius


def box_cells(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every cell of each box ``[lo[k], hi[k])`` and the box it belongs to.

    Vectorized over boxes: one ``unravel_index`` over the concatenated box
    sizes, no loop per box.
    """
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    ext = np.maximum(hi - lo, 0)
    n = ext.prod(axis=1)
    owner = np.repeat(np.arange(len(lo)), n)
    k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)    # index inside its box
    e = ext[owner]
    cells = np.empty((len(k), lo.shape[1]), np.int64)
    for d in range(lo.shape[1] - 1, -1, -1):                         # C order, per axis
        cells[:, d] = lo[owner, d] + k % e[:, d]
        k = k // np.maximum(e[:, d], 1)
    return cells, owner


class WindowComposite(Operator):
    """Base class of operators whose output cell depends on the same input
    cell, except flagged cells, which depend on the window of ``radius``
    around them (in every input, all of the output's shape).

    Subclasses implement ``compute_flagged(*arrays)`` returning the output and
    a boolean mask of flagged output cells; ``lineage_modes`` lists the modes
    offered (add ``Mode.PAY`` for an all-payload form, ``Mode.MAP`` when the
    identity alone is an acceptable approximation).  A subclass whose pairs are
    the radius payloads :meth:`write_lineage` writes should declare
    ``payload_reach = radius``, so that forward traces read only the pairs near
    their cells (box payloads reach as far as their boxes: declare what they reach,
    or nothing).
    """

    radius: int = 1
    lineage_modes: frozenset[Mode] = frozenset({Mode.FULL, Mode.COMP, Mode.BLACKBOX})
    map_p_batched = True

    # -- running ----------------------------------------------------------------
    # (*arrays: Any, **kwargs: Any): subclasses take their own fixed inputs
    def compute_flagged(self, *arrays: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
        raise NotImplementedError(f"{type(self).__name__} must implement compute_flagged(*arrays)")

    def run(self, ctx, *inputs):
        out, flagged = self.compute_flagged(*inputs)
        self.write_lineage(ctx, np.asarray(flagged, bool), self.radius)
        return out

    def n_inputs(self) -> int | None:
        """The inputs ``compute_flagged`` takes (``run`` takes any number)."""
        if type(self).run is not WindowComposite.run:
            return super().n_inputs()
        params = list(inspect.signature(self.compute_flagged).parameters.values())
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return None
        return sum(1 for p in params if p.default is p.empty
                   and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))

    def supported_modes(self) -> set[Mode]:
        return set(self.lineage_modes)

    @staticmethod
    def write_lineage(ctx, flagged: np.ndarray, radius: int) -> None:
        """The lineage ``ctx.modes`` asks for, in a few batched calls.

        Comp: one radius payload per flagged cell (the rest is the identity).
        Pay: the same, plus a radius-0 payload per other cell.  Full: each
        flagged cell's window in every input, and each other cell itself.
        """
        hits = np.argwhere(flagged)
        if Mode.COMP in ctx.modes or Mode.PAY in ctx.modes:
            ctx.lwrite(hits, payload=radius_payload(radius), each=True)
        rest = np.argwhere(~flagged) if ctx.modes & {Mode.PAY, Mode.FULL} else None
        if Mode.PAY in ctx.modes:
            ctx.lwrite(rest, payload=radius_payload(0), each=True)
        if Mode.FULL in ctx.modes:
            offs = window_offsets(radius, flagged.ndim)
            win = hits[:, None, :] + offs[None, :, :]
            inside = np.all((win >= 0) & (win < np.asarray(flagged.shape)), axis=2)
            group = np.repeat(np.arange(len(hits)), inside.sum(axis=1))
            ins = (win[inside], group)
            ctx.lwrite_groups(hits, np.arange(len(hits)), *[ins] * ctx.n_inputs)
            ctx.lwrite(rest, *[rest] * ctx.n_inputs, each=True)

    # -- the relation ----------------------------------------------------------------
    def map_b(self, cells, i, ctx):
        """The default relation: the same cell."""
        return cells

    def map_f(self, cells, i, ctx):
        return cells

    def map_p(self, cells, payload, i, ctx):
        shape = ctx.input_shape(i)
        radius, box = self._decode(payload, len(shape), ctx)
        if box is None:
            return window(cells, radius, shape)
        if not len(cells):
            return np.zeros((0, len(shape)), np.int64)
        return box_cells(box[None, :len(shape)], box[None, len(shape):])[0]

    def map_p_pairs(self, cells, offsets, payloads, pay_ids, i, ctx):
        """Vectorized ``map_p`` over many pairs: one batch for all boxes, one per radius."""
        shape = ctx.input_shape(i)
        ndim = len(shape)
        offsets, pay_ids = np.asarray(offsets, np.int64), np.asarray(pay_ids, np.int64)
        lens = np.diff(offsets)
        size = np.fromiter(map(len, payloads), np.int64, len(payloads))
        box_size = BOX_INT_BYTES * 2 * ndim
        bad = np.flatnonzero((size != RADIUS_BYTES) & (size != box_size))
        if bad.size:
            self._decode(payloads[int(bad[0])], ndim, ctx)            # raises the clear error
        is_box = size == box_size
        outs, owners = [], []
        if is_box.any():
            boxes = np.zeros((len(payloads), 2 * ndim), np.int64)
            boxed = payloads if is_box.all() else [payloads[k] for k in np.flatnonzero(is_box).tolist()]
            boxes[is_box] = np.frombuffer(b"".join(boxed), "<i4").reshape(-1, 2 * ndim)
            rows = np.flatnonzero(is_box[pay_ids] & (lens > 0))    # an empty pair maps to nothing
            b = boxes[pay_ids[rows]]
            got, own = box_cells(b[:, :ndim], b[:, ndim:])
            outs.append(got)
            owners.append(rows[own])
        radii = np.full(len(payloads), -1, np.int64)
        radii[~is_box] = [payloads[k][0] for k in np.flatnonzero(~is_box).tolist()]
        for r in np.unique(radii[~is_box]).tolist():
            rows = np.flatnonzero(radii[pay_ids] == r)
            reps = lens[rows]          # every cell of every pair (pairs may hold several)
            within = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
            idx = np.repeat(offsets[rows], reps) + within
            offs = window_offsets(r, ndim)
            win = (cells[idx][:, None, :] + offs[None, :, :]).reshape(-1, ndim)
            ok = np.all((win >= 0) & (win < np.asarray(shape)), axis=1)
            outs.append(win[ok])
            owners.append(np.repeat(np.repeat(rows, reps), len(offs))[ok])
        if not outs:
            return np.zeros((0, ndim), np.int64), np.zeros(0, np.int64)
        return np.concatenate(outs), np.concatenate(owners)

    @staticmethod
    def _decode(payload: bytes, ndim: int, ctx) -> tuple[int, np.ndarray | None]:
        """(radius, None) for a radius payload, (0, [lo..., hi...]) for a box payload."""
        if len(payload) == RADIUS_BYTES:
            return payload[0], None
        if len(payload) == BOX_INT_BYTES * 2 * ndim:
            return 0, np.frombuffer(payload, "<i4").astype(np.int64)
        raise LineageError(
            f"operator {ctx.name!r}: a window payload is {RADIUS_BYTES} byte (a radius) or "
            f"{BOX_INT_BYTES * 2 * ndim} bytes (a box of {ndim} dimensions), not {len(payload)}")
