"""CellSet: a set of cells of one array whose cost follows the cells it holds.

The set a trace carries from step to step used to be a boolean bitmap of the
whole array: a star of a few hundred pixels cost a 16 MB allocation, a scan
and a count per step on a 16-megapixel image, so trace time grew with the
image, not with the answer.  A CellSet has three forms and picks one by
density:

* **sparse** — the sorted unique packed cell ids (C-order flat indexes);
  every operation costs O(n log n) in the n cells held, nothing of the
  array's size is allocated or scanned;
* **dense** — a flat boolean bitmap, kept only once the set holds at least
  ``1/DENSE_SET_RATIO`` of the array (then the bitmap costs at most that
  ratio times the ids it replaces and membership tests are one gather);
* **entire** — "every cell of the array", a symbol that is never
  materialised (the all-to-all short-cut produces it, and it answers
  ``contains`` and ``len`` without memory).

Sets are immutable values; operations return new sets.  Only the answers
that really are large (or callers asking for :meth:`bitmap`) pay the array's
size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from subzero.model.cells import in_sorted, merge_unique, unique_ids, unpack
from subzero.tuning import CONTAINS_BITMAP_MIN, DENSE_SET_RATIO, SPAN_CELLS_PER_MEMBER

Shape = tuple[int, ...]

_EMPTY = np.zeros(0, np.int64)


def _size(shape: Sequence[int]) -> int:
    return math.prod(int(x) for x in shape)


class CellSet:
    """An immutable set of cells of an array of ``shape`` (see the module docstring)."""

    __slots__ = ("shape", "size", "_ids", "_bits", "_n", "_entire", "_span")

    def __init__(self, shape: Sequence[int], ids: np.ndarray | None = None,
                 bits: np.ndarray | None = None, n: int | None = None, entire: bool = False):
        """Use the constructors (:meth:`empty`, :meth:`entire`, :meth:`of_ids`,
        :meth:`of_sorted`, :meth:`of_bitmap`); this one trusts its arguments."""
        self.shape: Shape = tuple(int(x) for x in shape)
        self.size = _size(self.shape)
        self._ids = ids
        self._bits = bits
        self._entire = entire
        self._n = self.size if entire else (int(ids.size) if ids is not None else n)
        #: a sparse set's bitmap of its span, (least id, bitmap), once ``contains`` made it
        self._span: tuple[int, np.ndarray] | None = None

    # -- constructors -------------------------------------------------------------
    @classmethod
    def empty(cls, shape: Sequence[int]) -> CellSet:
        return cls(shape, ids=_EMPTY)

    @classmethod
    def everything(cls, shape: Sequence[int]) -> CellSet:
        """Every cell of the array, without materialising any of them."""
        return cls(shape, entire=True)

    @classmethod
    def of_sorted(cls, ids: np.ndarray, shape: Sequence[int]) -> CellSet:
        """From packed ids already sorted and unique (not checked: the caller knows)."""
        s = cls(shape, ids=np.asarray(ids, np.int64))
        return s._settled()

    @classmethod
    def of_ids(cls, ids: np.ndarray, shape: Sequence[int]) -> CellSet:
        """From packed ids in any order, duplicates allowed (all inside the array)."""
        ids = np.asarray(ids, np.int64).ravel()
        size = _size(shape)
        if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            if ids.size * DENSE_SET_RATIO >= size:     # may be dense: dedupe with a bitmap
                bits = np.zeros(size, bool)
                bits[ids] = True
                return cls(shape, bits=bits, n=int(np.count_nonzero(bits)))._settled()
            ids = unique_ids(ids, size)
        return cls(shape, ids=ids)._settled()

    @classmethod
    def of_bitmap(cls, bitmap: np.ndarray, shape: Sequence[int] | None = None) -> CellSet:
        """From a boolean bitmap of the array (any shape with the array's size)."""
        bm = np.asarray(bitmap, dtype=bool)
        shape = bm.shape if shape is None else tuple(shape)
        flat = np.ascontiguousarray(bm).reshape(-1)
        n = int(np.count_nonzero(flat))
        if n == flat.size and n > 0:
            return cls(shape, entire=True)
        return cls(shape, bits=flat, n=n)._settled()

    def _settled(self) -> CellSet:
        """The same set in the form its density asks for."""
        n = len(self)
        if self._entire:
            return self
        if n == self.size and n > 0:
            return CellSet(self.shape, entire=True)
        dense = n * DENSE_SET_RATIO >= self.size and n > 0
        if dense and self._bits is None:
            bits = np.zeros(self.size, bool)
            bits[self._ids] = True
            return CellSet(self.shape, bits=bits, n=n)
        if not dense and self._ids is None:
            assert self._bits is not None
            return CellSet(self.shape, ids=np.flatnonzero(self._bits).astype(np.int64, copy=False))
        return self

    # -- what it is ---------------------------------------------------------------
    def __len__(self) -> int:
        assert self._n is not None
        return self._n

    def __bool__(self) -> bool:
        return len(self) > 0

    @property
    def is_entire(self) -> bool:
        """Every cell of the array (the symbol, or a set that filled up)."""
        return self._entire

    @property
    def form(self) -> str:
        """``"sparse"``, ``"dense"`` or ``"entire"`` (statistics and tests)."""
        return "entire" if self._entire else ("dense" if self._bits is not None else "sparse")

    def ids(self) -> np.ndarray:
        """Sorted unique packed cell ids (O(n) to hand out; an entire set lists every
        cell, which costs the array's size: callers check :attr:`is_entire` first)."""
        if self._ids is None:
            if self._entire:
                self._ids = np.arange(self.size, dtype=np.int64)
            else:
                assert self._bits is not None
                self._ids = np.flatnonzero(self._bits).astype(np.int64, copy=False)
        return self._ids

    def cells(self) -> np.ndarray:
        """``(N, ndim)`` coordinates, sorted in C order."""
        return unpack(self.ids(), self.shape)

    def bitmap(self) -> np.ndarray:
        """A boolean bitmap of the array's shape: costs the array's size (for callers
        that want a mask; the executor never asks for one of a sparse set)."""
        if self._entire:
            return np.ones(self.shape, bool)
        if self._bits is not None:
            return self._bits.reshape(self.shape)
        bm = np.zeros(self.size, bool)
        bm[self._ids] = True
        return bm.reshape(self.shape)

    def dense_bitmap(self) -> np.ndarray | None:
        """The flat bitmap when the set already is one (dense or entire), else None: a
        whole-bitmap fast path is worth taking only then."""
        if self._entire:
            return np.ones(self.size, bool)
        return self._bits

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Membership of each packed id (a boolean array like ``ids``): a gather for a
        dense set; for a sparse one, a gather in a bitmap of the set's span (from its
        least to its greatest id, made once and kept with the set) when that span is no
        more than 4x the ids asked or ``SPAN_CELLS_PER_MEMBER`` cells a member (a byte
        a cell: at most 8x the set's own ids), else a binary search (O(m log n)).  A scan
        asks this of every cell it decodes, a piece at a time (77 million at genomics
        10,000x): the binary search was a third of a forward trace, and most ids fall
        outside a small query's span, which a bitmap sees in one pass (30 million ids:
        0.26 against 0.02 s for one cell, 1.6 against 0.4 s for 1,000 spread over the
        array)."""
        ids = np.asarray(ids, np.int64)
        if self._entire:
            return np.ones(ids.shape, bool)
        if self._bits is not None:
            return self._bits[ids]
        assert self._ids is not None
        if self._ids.size == 0 or ids.size == 0:
            return np.zeros(ids.shape, bool)
        return self._sparse_contains(ids)

    def _sparse_contains(self, ids: np.ndarray) -> np.ndarray:
        """:meth:`contains` of a sparse set with members, ``ids`` not empty."""
        s = self._ids
        assert s is not None
        lo, hi = int(s[0]), int(s[-1])
        if lo == hi:
            return ids == lo
        span = hi - lo + 1
        if self._span is None:
            if span > max(CONTAINS_BITMAP_MIN, 4 * ids.size, SPAN_CELLS_PER_MEMBER * s.size):
                return in_sorted(s, ids)          # a bitmap costs more
            bits = np.zeros(span, bool)
            bits[s - lo] = True
            self._span = (lo, bits)
        bits = self._span[1]
        at = (ids - lo).reshape(-1)                 # a new array: changed in place below
        inside = (at >= 0) & (at < span)
        hits = np.flatnonzero(inside)
        if hits.size * 8 < at.size:                 # few in the span: only those looked up
            out = np.zeros(at.size, bool)
            out[hits] = bits[at[hits]]
            return out.reshape(ids.shape)
        np.clip(at, 0, span - 1, out=at)
        inside &= bits[at]
        return inside.reshape(ids.shape)

    def bounds(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The bounding box (inclusive low, exclusive high corner), or None when empty;
        O(n) for a sparse set."""
        if not len(self):
            return None
        if self._entire:
            return (0,) * len(self.shape), self.shape
        if self._ids is not None:
            c = unpack(self._ids, self.shape)
            return (tuple(int(x) for x in c.min(axis=0)),
                    tuple(int(x) + 1 for x in c.max(axis=0)))
        bm = self.bitmap()
        lo, hi = [], []
        for d in range(len(self.shape)):
            hit = np.flatnonzero(bm.any(axis=tuple(k for k in range(len(self.shape)) if k != d)))
            lo.append(int(hit[0]))
            hi.append(int(hit[-1]) + 1)
        return tuple(lo), tuple(hi)

    # -- algebra --------------------------------------------------------------------
    def union(self, other: CellSet) -> CellSet:
        if other.shape != self.shape:
            raise ValueError(f"cell sets of shapes {self.shape} and {other.shape}")
        if self._entire or not len(other):
            return self
        if other._entire or not len(self):
            return other
        if self._bits is not None or other._bits is not None:
            a = self._bits if self._bits is not None else None
            b = other._bits if other._bits is not None else None
            if a is not None and b is not None:
                bits = a | b
            else:
                dense, sparse = (self, other) if a is not None else (other, self)
                assert dense._bits is not None
                bits = dense._bits.copy()
                bits[sparse.ids()] = True
            return CellSet(self.shape, bits=bits, n=int(np.count_nonzero(bits)))._settled()
        # both sorted and distinct: merged, not sorted afresh (565,000 ids: 10 ms, not 60)
        return CellSet(self.shape, ids=merge_unique([self.ids(), other.ids()]))._settled()

    def __or__(self, other: CellSet) -> CellSet:
        return self.union(other)

    def difference(self, other: CellSet) -> CellSet:
        """The cells of this set that are not in ``other`` (costs this set's cells)."""
        if other.shape != self.shape:
            raise ValueError(f"cell sets of shapes {self.shape} and {other.shape}")
        if not len(other) or not len(self):
            return self
        if other._entire:
            return CellSet.empty(self.shape)
        if self._entire or self._bits is not None:
            if self._entire:
                bits = np.ones(self.size, bool)
            else:
                assert self._bits is not None
                bits = self._bits.copy()
            if other._bits is not None:
                bits &= ~other._bits
            else:
                bits[other.ids()] = False
            return CellSet(self.shape, bits=bits, n=int(np.count_nonzero(bits)))._settled()
        ids = self.ids()
        return CellSet(self.shape, ids=ids[~other.contains(ids)])._settled()

    def __sub__(self, other: CellSet) -> CellSet:
        return self.difference(other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CellSet):
            return NotImplemented
        if other.shape != self.shape or len(other) != len(self):
            return False
        if self._entire or other._entire:
            return True        # same count over the same array: both entire
        return bool(np.array_equal(self.ids(), other.ids()))

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict:
        """The set, without the bitmap of its span ``contains`` may have kept (made again
        where it is needed: a pickle crosses to a Spark task)."""
        return {k: getattr(self, k) for k in self.__slots__ if k != "_span"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._span = None

    def __repr__(self) -> str:
        return f"CellSet({len(self)} of {self.size} cells, {self.form}, shape {self.shape})"


# -- a set in the ``--cells`` syntax (what :func:`~subzero.model.cells.parse_spec` reads) ------
def is_box(cs: CellSet) -> bool:
    """Whether the set fills its bounding box."""
    box = cs.bounds()
    return box is not None and len(cs) == math.prod(b - a for a, b in zip(*box))


def box_text(box: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    """A box in the ``--cells`` syntax (half-open, like Python slices): ``10:20,30:40``."""
    return ",".join(f"{a}:{b}" for a, b in zip(*box))


def spec(cs: CellSet, limit: int = 16) -> str:
    """The set in the ``--cells`` syntax when that is short (one cell, a few cells,
    a box), else ``N cells in box a:b,c:d``: a person can read it and re-ask it."""
    box = cs.bounds()
    if box is None:
        return "no cells"
    if len(cs) == 1 or (len(cs) <= limit and not is_box(cs)):
        return ";".join(",".join(str(int(x)) for x in c) for c in cs.cells())
    if is_box(cs):
        return box_text(box)
    return f"{len(cs)} cells in box {box_text(box)}"
