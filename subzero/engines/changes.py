"""Where an array of a re-run differs from its parent run's: per chunk of the
store's grid, the bounding box of the cells that differ.

A re-run (:mod:`subzero.engines.incremental`) pushes changes forward operator
by operator: the changed boxes of an operator's inputs say which of its tiles
must run again (a tile whose read region meets none comes out as the parent's),
and the tiles that ran say, by comparing their output with the parent's chunk
by chunk, where the operator's output changed.  A box per chunk keeps the
change as small as the edit (a 64x64 patch stays 64x64, not a 512x512 chunk),
so halos grow it no more than they must, and the record costs what the change
costs, never the array's size.

Values are compared bit for bit (as unsigned integers of the dtype's width): a
NaN equals the same NaN, -0.0 differs from 0.0, as a byte-wise comparison of
two runs' arrays would say.  Plain data and numpy only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import product

import numpy as np

Box = tuple[tuple[int, int], ...]
Shape = tuple[int, ...]


def chunk_range(lo: int, hi: int, tile: int) -> range:
    """The chunk indices along one axis that cells ``[lo, hi)`` touch."""
    return range(lo // tile, (hi - 1) // tile + 1) if hi > lo else range(0)


def chunks_of(region: Box, tile: int) -> Iterator[tuple[int, ...]]:
    """The chunks of the store's grid that ``region`` touches."""
    return product(*(chunk_range(a, b, tile) for a, b in region))


def chunk_box(idx: Sequence[int], shape: Shape, tile: int) -> Box:
    """Chunk ``idx``'s cells, clipped at the array's edges."""
    return tuple((int(i) * tile, min(int(n), (int(i) + 1) * tile)) for i, n in zip(idx, shape))


def _meets(a: Box, b: Box) -> bool:
    return all(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in zip(a, b))


def bits(values: np.ndarray) -> np.ndarray:
    """The values as unsigned integers of their width: compared bit for bit."""
    v = np.ascontiguousarray(values)
    if v.dtype.kind in "biu" or v.dtype.itemsize not in (1, 2, 4, 8):
        return v
    return v.view(f"u{v.dtype.itemsize}")


def differing_box(old: np.ndarray, new: np.ndarray) -> Box | None:
    """The bounding box (relative to the blocks) of the cells where two blocks of the
    same shape differ bit for bit; None when they are identical."""
    d = bits(old) != bits(new)
    if d.ndim == 0:
        return ((0, 1),) if bool(d) else None
    if not d.any():
        return None
    box = []
    for ax in range(d.ndim):
        hit = np.flatnonzero(d.any(axis=tuple(k for k in range(d.ndim) if k != ax)))
        box.append((int(hit[0]), int(hit[-1]) + 1))
    return tuple(box)


@dataclass
class Changes:
    """The cells of one array that differ from the parent run's, as one box per chunk
    of the store's grid (``tile`` cells per axis) that holds any.

    ``everywhere``: every cell is taken as changed (an operator re-run whole whose
    output was not compared, or an array whose parent is unknown)."""

    shape: Shape
    tile: int
    boxes: dict[tuple[int, ...], Box] = field(default_factory=dict)
    everywhere: bool = False

    @classmethod
    def none(cls, shape: Sequence[int], tile: int) -> Changes:
        return cls(tuple(int(n) for n in shape), int(tile))

    @classmethod
    def all(cls, shape: Sequence[int], tile: int) -> Changes:
        return cls(tuple(int(n) for n in shape), int(tile), everywhere=True)

    def __bool__(self) -> bool:
        return self.everywhere or bool(self.boxes)

    @property
    def chunks(self) -> int:
        """How many chunks hold a change."""
        if self.everywhere:
            return int(np.prod([-(-n // self.tile) for n in self.shape]))
        return len(self.boxes)

    @property
    def cells(self) -> int:
        """Cells inside the changed boxes (an upper bound on the cells that changed)."""
        if self.everywhere:
            return int(np.prod(self.shape))
        return int(sum(np.prod([b - a for a, b in box]) for box in self.boxes.values()))

    def add(self, box: Box) -> None:
        """Mark the cells of ``box`` (array coordinates) changed."""
        for idx in chunks_of(box, self.tile):
            cb = chunk_box(idx, self.shape, self.tile)
            part = tuple((max(a, c0), min(b, c1)) for (a, b), (c0, c1) in zip(box, cb))
            old = self.boxes.get(idx)
            self.boxes[idx] = part if old is None else \
                tuple((min(a, c), max(b, d)) for (a, b), (c, d) in zip(old, part))

    def meets(self, region: Box) -> bool:
        """Whether any changed cell may lie in ``region``."""
        if self.everywhere:
            return True
        if len(region) != len(self.shape):
            return bool(self.boxes)
        for idx in chunks_of(region, self.tile):
            box = self.boxes.get(idx)
            if box is not None and _meets(box, region):
                return True
        return False

    def compare(self, region: Box, old: np.ndarray, new: np.ndarray) -> bool:
        """Compare the parent's values of ``region`` with the re-run's, chunk by chunk,
        marking the cells that differ; whether any did."""
        changed = False
        for idx in chunks_of(region, self.tile):
            cb = chunk_box(idx, self.shape, self.tile)
            part = tuple((max(a, c0), min(b, c1)) for (a, b), (c0, c1) in zip(region, cb))
            local = tuple(slice(a - r0, b - r0) for (a, b), (r0, _) in zip(part, region))
            box = differing_box(old[local], new[local])
            if box is not None:
                self.add(tuple((p0 + a, p0 + b) for (a, b), (p0, _) in zip(box, part)))
                changed = True
        return changed

    def as_dict(self) -> dict:
        """Plain data for a run's record: the changed boxes' count, cells and bounds."""
        if self.everywhere:
            return {"everywhere": True, "chunks": self.chunks, "cells": self.cells}
        bounds = None
        if self.boxes:
            lo = np.min([[a for a, _ in b] for b in self.boxes.values()], axis=0)
            hi = np.max([[b for _, b in bx] for bx in self.boxes.values()], axis=0)
            bounds = [[int(a), int(b)] for a, b in zip(lo, hi)]
        return {"everywhere": False, "chunks": self.chunks, "cells": self.cells, "bounds": bounds}
