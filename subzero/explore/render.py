"""What the explorer draws: an array's region as a grey PNG, and a trace's answer as
an overlay mask PNG of the same region and pixel size.

Every array is drawn as a 2-D *view*: a 2-D array as it is, a 1-D array as a strip
of one row, and an array with more dimensions as a projection over its leading
axes (the maximum for the image, "any cell" for the overlay), so a view cell
``(row, col)`` stands for the cells ``[..., row, col]``.  A region of the view is
drawn at most at one pixel per cell (and at most :data:`subzero.tuning.MAX_PIXELS`
per axis); a larger region is pooled (maximum) into the requested pixel size, so
sparse features -- a star, a cosmic ray, one highlighted cell -- stay visible at
any zoom.

The overlay's cost follows the answer: a sparse answer draws its cells that fall
in the region, never a bitmap of the array; only a dense answer (one that already
is a bitmap) or the whole array touches the region's size.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from subzero.errors import QueryError
from subzero.model.cells import unpack
from subzero.model.cellset import CellSet
from subzero.tuning import MAX_PIXELS, PNG_LEVEL

#: percentiles of the grey stretch (robust to hot pixels and cosmic rays)
STRETCH = (1.0, 99.5)
#: the overlay's colour (RGB); its opacity is the page's
OVERLAY_RGB = (255, 32, 96)


@dataclass(frozen=True)
class View:
    """How an array of ``shape`` is drawn in two dimensions."""

    shape: tuple[int, ...]

    @property
    def size(self) -> tuple[int, int]:
        """(rows, cols) of the view."""
        if len(self.shape) == 0:
            return 1, 1
        if len(self.shape) == 1:
            return 1, self.shape[0]
        return self.shape[-2], self.shape[-1]

    @property
    def projection(self) -> str | None:
        """How the view folds the array's leading axes, or None when it shows them all."""
        if len(self.shape) <= 2:
            return None
        axes = ", ".join(str(a) for a in range(len(self.shape) - 2))
        return f"maximum over axes {axes} (the overlay: any cell along them)"

    def array_region(self, rows: tuple[int, int], cols: tuple[int, int]) -> tuple[slice, ...]:
        """The array region a view region stands for."""
        nd = len(self.shape)
        if nd == 0:
            return ()
        if nd == 1:
            return (slice(*cols),)
        return tuple(slice(None) for _ in range(nd - 2)) + (slice(*rows), slice(*cols))

    def cells_of_box(self, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        """Every array cell under a view box (half-open), as an ``(N, ndim)`` array."""
        region = self.array_region(rows, cols)
        ranges = [np.arange(*s.indices(n)) for s, n in zip(region, self.shape)]
        if not ranges:
            return np.zeros((1, 0), np.int64)
        grids = np.meshgrid(*ranges, indexing="ij")
        return np.stack([g.reshape(-1) for g in grids], axis=1).astype(np.int64)

    def to_view(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cols) of array cells in the view."""
        nd = len(self.shape)
        if nd == 0:
            z = np.zeros(len(cells), np.int64)
            return z, z
        if nd == 1:
            return np.zeros(len(cells), np.int64), cells[:, 0]
        return cells[:, -2], cells[:, -1]


@dataclass(frozen=True)
class Window:
    """A half-open view region and the pixel size it is drawn at."""

    rows: tuple[int, int]
    cols: tuple[int, int]
    height: int
    width: int

    def as_json(self) -> dict:
        return {"rows": list(self.rows), "cols": list(self.cols),
                "height": self.height, "width": self.width}

    def starts(self) -> tuple[np.ndarray, np.ndarray]:
        """The first view row / column of each pixel."""
        return (_starts(self.rows, self.height), _starts(self.cols, self.width))


def _starts(span: tuple[int, int], pixels: int) -> np.ndarray:
    n = span[1] - span[0]
    return (np.arange(pixels, dtype=np.int64) * n) // pixels


def window(view: View, region: Sequence[int] | None, size: Sequence[int] | None,
           name: str) -> Window:
    """The window drawn for a request: ``region`` = (row0, row1, col0, col1) of the view
    (clipped to it; None: all of it), ``size`` = the (height, width) in screen pixels
    (None: one pixel per cell), never more pixels than cells."""
    vr, vc = view.size
    if region is None:
        r0, r1, c0, c1 = 0, vr, 0, vc
    else:
        if len(region) != 4:
            raise QueryError(f"bad region for {name!r}: give row0,row1,col0,col1")
        r0, r1, c0, c1 = (int(v) for v in region)
        r0, r1 = max(0, min(r0, vr)), max(0, min(r1, vr))
        c0, c1 = max(0, min(c0, vc)), max(0, min(c1, vc))
        if r1 <= r0 or c1 <= c0:
            raise QueryError(f"region rows {r0}:{r1}, cols {c0}:{c1} of {name!r} is empty "
                             f"(its view is {vr} x {vc})")
    h, w = r1 - r0, c1 - c0
    if size is not None:
        if len(size) != 2 or min(int(size[0]), int(size[1])) < 1:
            raise QueryError(f"bad size for {name!r}: give height,width in pixels")
        h, w = min(h, int(size[0])), min(w, int(size[1]))
    h, w = min(h, MAX_PIXELS), min(w, MAX_PIXELS)
    return Window((r0, r1), (c0, c1), h, w)


def _pool(a: np.ndarray, win: Window) -> np.ndarray:
    """Maximum of each pixel's block of cells (NaN-free input)."""
    rs, cs = win.starts()
    if a.shape[0] != win.height:
        a = np.maximum.reduceat(a, rs, axis=0)
    if a.shape[1] != win.width:
        a = np.maximum.reduceat(a, cs, axis=1)
    return a


def image_png(read: Callable[[tuple[slice, ...]], np.ndarray], view: View,
              win: Window) -> tuple[bytes, dict]:
    """The view's window as a grey PNG (percentile stretch of the pooled values) and
    what was drawn: the stretch limits and the pooling factor."""
    region = view.array_region(win.rows, win.cols)
    a = np.asarray(read(region))
    if a.ndim == 0:
        a = a.reshape(1, 1)
    elif a.ndim == 1:
        a = a.reshape(1, -1)
    elif a.ndim > 2:
        a = a.reshape(-1, *a.shape[-2:]).max(axis=0)
    if a.dtype == bool:
        a = a.astype(np.uint8)
    a = a.astype(np.float64, copy=False)
    finite = np.isfinite(a)
    lo_fill = float(a[finite].min()) if finite.any() else 0.0
    a = np.where(finite, a, lo_fill)
    pooled = _pool(a, win)
    lo, hi = (float(v) for v in np.percentile(pooled, STRETCH)) if pooled.size else (0.0, 1.0)
    if hi <= lo:
        lo, hi = float(pooled.min()), float(pooled.max())
    if hi <= lo:
        grey = np.full(pooled.shape, 128 if hi != 0 else 0, np.uint8)
    else:
        grey = (np.clip((pooled - lo) / (hi - lo), 0, 1) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(grey, "L").save(buf, "PNG", compress_level=PNG_LEVEL)
    pool = [math.ceil((win.rows[1] - win.rows[0]) / win.height),
            math.ceil((win.cols[1] - win.cols[0]) / win.width)]
    return buf.getvalue(), {"stretch": [lo, hi], "pool": pool}


def overlay_mask(cs: CellSet, view: View, win: Window) -> np.ndarray:
    """A boolean (height, width) mask: the pixels of the window holding a cell of ``cs``."""
    mask = np.zeros((win.height, win.width), bool)
    if not len(cs):
        return mask
    if cs.is_entire:
        mask[:] = True
        return mask
    dense = cs.dense_bitmap()
    if dense is not None:          # already a bitmap: its window, any along projected axes
        bm = dense.reshape(cs.shape) if len(cs.shape) else dense.reshape(1, 1)
        if bm.ndim == 1:
            bm = bm.reshape(1, -1)
        sub = np.asarray(bm[(...,) + (slice(*win.rows), slice(*win.cols))])
        if sub.ndim > 2:
            sub = np.asarray(sub.reshape(-1, *sub.shape[-2:]).any(axis=0))
        return _pool(sub.astype(np.uint8), win).astype(bool)
    rows, cols = view.to_view(unpack(cs.ids(), cs.shape))
    inside = ((rows >= win.rows[0]) & (rows < win.rows[1])
              & (cols >= win.cols[0]) & (cols < win.cols[1]))
    rows, cols = rows[inside] - win.rows[0], cols[inside] - win.cols[0]
    rs, cs_ = win.starts()
    mask[np.searchsorted(rs, rows, side="right") - 1,
         np.searchsorted(cs_, cols, side="right") - 1] = True
    return mask


def overlay_png(mask: np.ndarray) -> bytes:
    """A two-colour palette PNG: transparent, and the overlay colour where ``mask``."""
    img = Image.fromarray(mask.astype(np.uint8), "P")
    img.putpalette([0, 0, 0, *OVERLAY_RGB] + [0, 0, 0] * 254)
    buf = io.BytesIO()
    img.save(buf, "PNG", transparency=0, optimize=False, compress_level=PNG_LEVEL)
    return buf.getvalue()
