"""Masking and merging: choose, cell by cell, between arrays.

The lineage is the coordinate relation: output cell c depends on cell c of
every input (the mask included), whichever branch the data picked.  That is
a superset of the data-dependent truth, and it is the same for Map and Full
lineage, so the two never disagree.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .elementwise import Elementwise


class Where(Elementwise):
    """``where(mask, a, b)``: a where the mask is true, else b.

    ``broadcast="numpy"`` lets a, b or the mask broadcast (e.g. a one-cell b).
    """

    arity = 3

    def __init__(self, broadcast: str = "none"):
        if broadcast == "scalar":
            raise ValueError("Where: use broadcast='numpy' to broadcast a one-cell input")
        self._set_broadcast(broadcast)

    def compute(self, mask, a, b):
        self.check_shapes(mask.shape, a.shape, b.shape)
        return np.where(mask.astype(bool, copy=False), a, b)


class Mask(Elementwise):
    """``a`` where ``mask`` is true, ``fill`` elsewhere (``invert``: where it is false)."""

    arity = 2

    def __init__(self, fill: Any = np.nan, invert: bool = False):
        self.fill, self.invert = fill, invert

    def compute(self, a, mask):
        self.check_shapes(a.shape, mask.shape)
        m = mask.astype(bool, copy=False)
        return np.where(~m if self.invert else m, a, self.fill)


class Merge(Elementwise):
    """``a`` where it has a value, else ``b`` (SciDB ``merge``): missing means NaN
    (or ``missing`` when given)."""

    arity = 2

    def __init__(self, missing: Any = None):
        self.missing = missing

    def compute(self, a, b):
        self.check_shapes(a.shape, b.shape)
        if self.missing is None:
            hole = np.isnan(a) if np.issubdtype(a.dtype, np.inexact) else np.zeros(a.shape, bool)
        else:
            hole = a == self.missing
        return np.where(hole, b, a)
