"""Writing an array in slabs of whole chunks: one zarr call for many chunks.

Zarr encodes and writes the chunks of one call together; a call per chunk costs
~2.5 ms whatever the chunk's size, and a 512-cell chunk of a 1-D array is 4 KB
(genomics at 10,000x: 1,875 chunks per array, 30,000 calls, 40% of a plain run).
:func:`slabs` cuts an in-memory array; :class:`SlabWriter` gathers a step's tiles,
made one after another, into such slabs.  Either writes the chunk files a call per
chunk writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def slabs(shape: Sequence[int], chunks: Sequence[int], itemsize: int, most: int
          ) -> list[tuple[slice, ...]]:
    """Regions of whole chunks that cover ``shape`` once, in order: cut across the axis
    with the most chunks, each slab as many chunks thick as fit in ``most`` bytes
    (at least one), whole along every other axis."""
    shape = tuple(int(n) for n in shape)
    if not shape or 0 in shape:
        return [tuple(slice(0, n) for n in shape)]
    counts = [-(-n // max(int(c), 1)) for n, c in zip(shape, chunks)]
    axis = int(np.argmax(counts))
    across = int(np.prod(shape)) // shape[axis] * itemsize       # bytes of one cell-thick cut
    step = max(1, most // max(across * int(chunks[axis]), 1)) * int(chunks[axis])
    return [tuple(slice(a, min(a + step, n)) if k == axis else slice(0, n)
                  for k, n in enumerate(shape)) for a in range(0, shape[axis], step)]


class SlabWriter:
    """Tiles of one array written in slabs: ``add`` each tile's core (its region and
    values) in the order the tiles are made, then ``close``.

    Tiles are held until those held fill ``most`` bytes and the next tile begins a new
    band (a new start on the first axis); the held tiles are then written as one
    region when they cover their bounding box exactly, else one by one.  So the
    chunks written are the tiles' own, whatever the order they come in."""

    def __init__(self, write: Callable[[tuple[slice, ...], np.ndarray], None], most: int):
        self._write = write
        self._most = most
        self._held: list[tuple[tuple[slice, ...], np.ndarray]] = []
        self._bytes = 0

    def add(self, region: tuple[slice, ...], values: np.ndarray) -> None:
        values = np.asarray(values)
        if self._held and self._bytes >= self._most and region and \
                region[0].start >= max(r[0].stop for r, _ in self._held):
            self.flush()
        self._held.append((region, values))
        self._bytes += values.nbytes

    def flush(self) -> None:
        held, self._held, self._bytes = self._held, [], 0
        if not held:
            return
        if len(held) == 1 or not held[0][0]:
            for region, values in held:
                self._write(region, values)
            return
        lo = [min(r[k].start for r, _ in held) for k in range(len(held[0][0]))]
        hi = [max(r[k].stop for r, _ in held) for k in range(len(held[0][0]))]
        if sum(v.size for _, v in held) != int(np.prod([b - a for a, b in zip(lo, hi)])):
            for region, values in held:          # not one rectangle: tile by tile
                self._write(region, values)
            return
        box = np.empty([b - a for a, b in zip(lo, hi)], held[0][1].dtype)
        for region, values in held:
            box[tuple(slice(r.start - a, r.stop - a) for r, a in zip(region, lo))] = values
        self._write(tuple(slice(a, b) for a, b in zip(lo, hi)), box)

    def close(self) -> None:
        self.flush()
