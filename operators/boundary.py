"""Edge modes and the neighbourhood relation shared by stencils and padding.

A stencil output cell ``o`` reads the *virtual* input cells ``o + k`` for
every offset ``k`` of its footprint; an edge mode folds a virtual coordinate
that falls outside the array back onto a real cell (or onto nothing, for
``constant``).  Padding is the same relation with a single offset.  Getting
the fold right is what makes lineage exact at the edges: with ``wrap`` the
left column of the output really does depend on the right column of the
input, and with ``reflect`` an edge cell may be read twice.

Modes follow scipy.ndimage (numpy.pad names are translated by
:func:`mode_from_numpy`):

=========  ===========================  =====================
reflect    d c b a | a b c d | d c b a   numpy ``symmetric``
mirror     d c b | a b c d | c b a       numpy ``reflect``
nearest    a a a | a b c d | d d d       numpy ``edge``
wrap       a b c d | a b c d | a b c d   numpy ``wrap``
constant   k k k | a b c d | k k k       numpy ``constant``
=========  ===========================  =====================
"""

from __future__ import annotations

import numpy as np

from subzero.model.cells import lengths_to_offsets

from .base import rows

MODES = ("reflect", "mirror", "nearest", "wrap", "constant")
_ALIASES = {"grid-mirror": "reflect", "grid-constant": "constant", "grid-wrap": "wrap"}
_NUMPY = {"constant": "constant", "edge": "nearest", "symmetric": "reflect",
          "reflect": "mirror", "wrap": "wrap"}


def check_mode(mode: str) -> str:
    """The canonical scipy.ndimage mode name, or a ValueError naming the choices."""
    m = _ALIASES.get(mode, mode)
    if m not in MODES:
        raise ValueError(f"unknown edge mode {mode!r}; use one of {', '.join(MODES)}")
    return m


def mode_from_numpy(mode: str) -> str:
    """numpy.pad mode -> the equivalent scipy.ndimage edge mode."""
    try:
        return _NUMPY[mode]
    except KeyError as err:
        raise ValueError(f"unsupported pad mode {mode!r}; use one of {', '.join(_NUMPY)}") from err


def fold(v: np.ndarray, n: int, mode: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Real index read by virtual index ``v`` on an axis of length ``n``.

    Returns (index, valid); valid is None when every index is valid (only
    ``constant`` reads nothing outside the array).  Works for any distance
    from the array, by periodicity, as scipy and numpy do.
    """
    v = np.asarray(v, np.int64)
    if mode == "constant":
        ok = (v >= 0) & (v < n)
        return np.where(ok, v, 0), ok
    if mode == "nearest":
        return np.clip(v, 0, n - 1), None
    if mode == "wrap":
        return np.mod(v, n), None
    if mode == "reflect":
        m = np.mod(v, 2 * n)
        return np.where(m < n, m, 2 * n - 1 - m), None
    if mode == "mirror":
        if n == 1:
            return np.zeros_like(v), None
        m = np.mod(v, 2 * n - 2)
        return np.where(m < n, m, 2 * n - 2 - m), None
    raise ValueError(f"unknown edge mode {mode!r}")


def preimages(n: int, lo: int, hi: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """For each real index j < n, the virtual indices in [lo, hi] that read it (CSR)."""
    v = np.arange(lo, hi + 1, dtype=np.int64)
    idx, ok = fold(v, n, mode)
    if ok is not None:
        v, idx = v[ok], idx[ok]
    order = np.argsort(idx, kind="stable")
    return lengths_to_offsets(np.bincount(idx, minlength=n)), v[order]


class Neighbourhood:
    """Output cell ``o`` depends on input cells ``fold(o + k)`` for every offset k.

    Plain data (offsets and a mode), so it pickles with its operator.
    """

    def __init__(self, offsets: np.ndarray, mode: str):
        self.offsets = np.asarray(offsets, np.int64).reshape(-1, np.shape(offsets)[-1])
        self.mode = check_mode(mode)

    @property
    def radius(self) -> int:
        return int(np.abs(self.offsets).max()) if self.offsets.size else 0

    def backward(self, cells: np.ndarray, in_shape) -> tuple[np.ndarray, np.ndarray]:
        """Input cells of each output cell, with owner rows."""
        n, nd = cells.shape
        k = len(self.offsets)
        v = cells[:, None, :] + self.offsets[None, :, :]
        v = v.reshape(n * k, nd)
        ok = None
        for d in range(nd):
            col = v[:, d]
            out = (col < 0) | (col >= in_shape[d])      # only edge reads need folding
            if not out.any():
                continue
            if self.mode == "constant":
                ok = ~out if ok is None else ok & ~out
            else:
                col[out] = fold(col[out], in_shape[d], self.mode)[0]
        if ok is None:
            return v, rows(n, k)
        return v[ok], rows(n, k)[ok]

    def forward(self, cells: np.ndarray, in_shape, out_shape) -> np.ndarray:
        """Output cells reading any of the input ``cells``: every virtual cell
        that folds onto an input cell, minus every offset, kept if in bounds.

        The virtual cells of one input cell are the product of per-axis
        preimage lists (ragged: one for interior cells, a few at the edges),
        enumerated with mixed-radix arithmetic instead of a loop.
        """
        n, nd = cells.shape
        if not len(self.offsets):                     # an all-zero kernel reads nothing
            return np.zeros((0, nd), np.int64)
        out_shape = np.asarray(out_shape, np.int64)
        lo = self.offsets.min(axis=0)
        hi = out_shape - 1 + self.offsets.max(axis=0)
        tables = [preimages(int(in_shape[d]), int(lo[d]), int(hi[d]), self.mode) for d in range(nd)]
        counts = np.stack([np.diff(off)[cells[:, d]] for d, (off, _) in enumerate(tables)], axis=1) \
            if n else np.zeros((0, nd), np.int64)
        per = counts.prod(axis=1)
        total = int(per.sum())
        row = np.repeat(np.arange(n, dtype=np.int64), per)
        local = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
        virt = np.empty((total, nd), np.int64)
        for d in reversed(range(nd)):
            off, vals = tables[d]
            c = counts[row, d]
            digit = local % c
            local //= c
            virt[:, d] = vals[off[cells[row, d]] + digit]
        out = (virt[:, None, :] - self.offsets[None, :, :]).reshape(-1, nd)
        return out[np.all((out >= 0) & (out < out_shape), axis=1)]
