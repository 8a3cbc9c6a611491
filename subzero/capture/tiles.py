"""Tiles: how an array is split for tile-parallel execution, and how a tile's
lineage, written in tile-local coordinates, becomes the array's lineage.

A tile's *core* is the part of the output it is responsible for (a Zarr
chunk); it *reads* the core plus a halo of the operator's stencil radius
(clipped at the array's edges).  The operator runs on the read region; the
runtime keeps the core of the output and the lineage of core output cells,
shifted by the read region's origin.  Plain data and numpy only: this code
runs inside Spark tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.model.cells import csr_rows, lengths_to_offsets, pack, unpack
from subzero.model.operator import Operator, TilingKind
from subzero.tuning import HALO_TILE_RATIO

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Tile:
    index: tuple[int, ...]
    core: tuple[tuple[int, int], ...]      # [start, stop) per axis, in array coordinates
    read: tuple[tuple[int, int], ...]

    @property
    def origin(self) -> tuple[int, ...]:
        return tuple(a for a, _ in self.read)

    def core_slices(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in self.core)

    def read_slices(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in self.read)

    def core_in_read(self) -> tuple[slice, ...]:
        return tuple(slice(c0 - r0, c1 - r0) for (c0, c1), (r0, _) in zip(self.core, self.read))

    def read_shape(self) -> Shape:
        return tuple(b - a for a, b in self.read)

    def describe(self) -> str:
        return "[" + ", ".join(f"{a}:{b}" for a, b in self.core) + "]"


def tile_shape(shape: Shape, tile: int | Sequence[int]) -> Shape:
    """Per-axis tile size: ``tile`` (an int applies to every axis), capped by the shape."""
    sizes = np.atleast_1d(np.asarray(tile, dtype=np.int64))
    t = tuple(int(k) for k in (np.repeat(sizes, len(shape)) if np.ndim(tile) == 0 else sizes))
    if len(t) != len(shape):
        raise ValueError(f"tile shape {tuple(t)} does not match an array of {len(shape)} dimensions")
    return tuple(max(1, min(int(n), int(k))) for n, k in zip(shape, t))


def tiles_for(shape: Shape, tile: int | Sequence[int], halo: int = 0) -> list[Tile]:
    ts = tile_shape(shape, tile)
    grids = [range(-(-n // k)) for n, k in zip(shape, ts)]
    return [tile_at(shape, ts, idx, halo) for idx in product(*grids)]


def tile_at(shape: Shape, ts: Shape, idx: Sequence[int], halo: int = 0) -> Tile:
    """Tile ``idx`` of the grid of ``ts``-sized tiles (``tile_shape``) over ``shape``:
    its core and its read region (core + ``halo``), both clipped at the array's edges."""
    core = tuple((int(i) * k, min(n, (int(i) + 1) * k)) for i, k, n in zip(idx, ts, shape))
    read = tuple((max(0, a - halo), min(n, b + halo)) for (a, b), n in zip(core, shape))
    return Tile(tuple(int(i) for i in idx), core, read)


def task_tile(tile: int, halo: int) -> int:
    """The cells per axis of one task of a stencil with ``halo``: a multiple of the
    store's ``tile`` (tasks write whole chunks) whose core is at least
    ``HALO_TILE_RATIO`` times the halo, up to 4 tiles."""
    return tile * min(4, max(1, -(-halo * HALO_TILE_RATIO // tile)))


def tile_plan(op: Operator, in_shapes: Sequence[Shape]) -> int | None:
    """The halo radius when the operator can run per tile, else None (global): declared
    elementwise or stencil, inputs all of one shape, output (when declared) of that shape."""
    kind = op.tiling.kind
    if not kind.tile_local or not in_shapes:
        return None
    if any(tuple(s) != tuple(in_shapes[0]) and not one_cell(s) for s in in_shapes[1:]):
        return None
    try:
        declared = op.output_shape(*in_shapes)
    except Exception:
        declared = None
    if declared is not None and tuple(declared) != tuple(in_shapes[0]):
        return None
    return int(op.tiling.radius) if kind is TilingKind.STENCIL else 0


def tile_halo(op: Operator, in_shapes: Sequence[Shape], out_shape: Shape) -> int | None:
    """The halo radius when ``op`` can re-run per tile on inputs of ``in_shapes`` making
    ``out_shape``, else None: declared elementwise or stencil, its first input of the
    output's shape and every other one of that shape or of one cell (read whole by
    every tile)."""
    if not in_shapes or tuple(in_shapes[0]) != tuple(out_shape):
        return None
    if any(tuple(s) != tuple(out_shape) and not one_cell(s) for s in in_shapes):
        return None
    return tile_plan(op, in_shapes)


def one_cell(shape: Shape) -> bool:
    """A one-cell input (a scalar an operator broadcasts): every tile reads it whole."""
    return int(np.prod(shape)) == 1


def input_slices(tile: Tile, shape: Shape, read: tuple[tuple[int, int], ...] | None = None
                 ) -> tuple[slice, ...]:
    """What a tile reads of an input of ``shape``: its read region (``read``, default
    the tile's), or the whole input when it is one cell (for an array of one cell
    the two are the same)."""
    if one_cell(shape):
        return tuple(slice(0, int(n)) for n in shape)
    return tuple(slice(a, b) for a, b in (read if read is not None else tile.read))


def globalize(pairs: Pairs | None, tile: Tile, out_shape: Shape, in_shapes: Sequence[Shape],
              local_in_shapes: Sequence[Shape]) -> Pairs | None:
    """Translate a tile's pairs to array coordinates and keep only core output cells.

    A pair whose output cells straddle the core keeps its core cells (every
    one of them still depends on all of the pair's input cells); a pair with
    no core output cell is dropped.  Input cells of tiled inputs are shifted
    by the tile's origin; an input read whole (``local_in_shapes[i] ==
    in_shapes[i]`` and not tiled) keeps its coordinates.
    """
    if pairs is None:
        return None
    origin = np.asarray(tile.origin, np.int64)
    local_out = tile.read_shape()
    oc = unpack(pairs.out, local_out) + origin
    lo = np.asarray([a for a, _ in tile.core])
    hi = np.asarray([b for _, b in tile.core])
    keep = np.all((oc >= lo) & (oc < hi), axis=1)
    rows = csr_rows(pairs.out_off)
    n_keep = np.bincount(rows[keep], minlength=pairs.n)
    live = n_keep > 0
    out = pack(oc, tuple(out_shape))[keep]    # packed, then masked: 4x quicker than rows
    out_off = lengths_to_offsets(n_keep[live])
    if pairs.pay_ids is not None:
        return Pairs(out, out_off, pay_ids=pairs.pay_ids[live], payloads=pairs.payloads)
    ins, offs = [], []
    for i, (c, o) in enumerate(zip(pairs.ins, pairs.in_offs)):
        tiled = tuple(local_in_shapes[i]) == local_out and tuple(in_shapes[i]) == tuple(out_shape)
        cells = unpack(c, tuple(local_in_shapes[i]))
        if tiled:
            cells = cells + origin
        r = csr_rows(o)
        sel = live[r]
        ins.append(pack(cells, tuple(in_shapes[i]))[sel])
        offs.append(lengths_to_offsets(np.diff(o)[live]))
    return Pairs(out, out_off, ins, offs)


def concat_pairs(parts: list[Pairs | None], n_inputs: int) -> Pairs | None:
    """One Pairs from many (tiles), merging payload tables."""
    live = [p for p in parts if p is not None and p.n]
    if not live:
        return None
    out = np.concatenate([p.out for p in live])
    out_off = lengths_to_offsets(np.concatenate([np.diff(p.out_off) for p in live]))
    if live[0].is_payload:
        table: dict[bytes, int] = {}
        ids = []
        for p in live:
            assert p.pay_ids is not None and p.payloads is not None
            remap = np.array([table.setdefault(b, len(table)) for b in p.payloads], np.int64)
            ids.append(remap[p.pay_ids] if len(remap) else p.pay_ids)
        return Pairs(out, out_off, pay_ids=np.concatenate(ids), payloads=list(table))
    ins = [np.concatenate([p.ins[i] for p in live]) for i in range(n_inputs)]
    offs = [lengths_to_offsets(np.concatenate([np.diff(p.in_offs[i]) for p in live]))
            for i in range(n_inputs)]
    return Pairs(out, out_off, ins, offs)
