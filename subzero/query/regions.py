"""The array regions a trace's executor has read for re-execution, kept up to a budget.

A re-run reads each box's input regions and the stored output over the box, to
check it.  Along a chain of elementwise operators the box of one step is the box
of the next, so the output one step checks is the input the next reads; and a
zarr read decodes whole chunks, so a narrow strip (the prescan columns of a
16-megapixel image) costs as much as the chunks it crosses.  Keeping the regions
read, exactly as read (checksummed by the array store), makes each one cost one
read per trace.  Oldest first out once the budget is spent; a region bigger than
a quarter of the budget is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np

__all__ = ["RegionCache"]

Region = tuple[slice, ...]


class RegionCache:
    """``read(name, region)`` through ``reader``, remembering up to ``budget`` bytes.
    Callers must not write into what it returns (copy first)."""

    def __init__(self, reader: Callable[[str, Region], np.ndarray], budget: int):
        self.reader, self.budget = reader, int(budget)
        self._kept: OrderedDict[tuple[str, tuple[tuple[int, int], ...]], np.ndarray] = OrderedDict()
        self._bytes = 0

    def read(self, name: str, region: Region) -> np.ndarray:
        if any(s.stop is None or s.step not in (None, 1) for s in region):
            return np.asarray(self.reader(name, region))
        key = (name, tuple((int(s.start or 0), int(s.stop)) for s in region))
        hit = self._kept.get(key)
        if hit is not None:
            self._kept.move_to_end(key)
            return hit
        got = np.asarray(self.reader(name, region))
        if got.nbytes * 4 <= self.budget:
            got.flags.writeable = False
            self._kept[key] = got
            self._bytes += got.nbytes
            while self._bytes > self.budget:
                _, old = self._kept.popitem(last=False)
                self._bytes -= old.nbytes
        return got

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0
