"""Connected components over tiles: the label-merge pattern.

One labelling, reached two ways.  On the whole array, :func:`label` is
``scipy.ndimage.label`` (regions numbered in the order of their first cell,
row-major), then regions smaller than ``min_size`` dropped and the rest
renumbered in the same order.  Tile by tile, which is how the Spark engine
runs an operator declared ``components`` (see
:class:`subzero.operators.components.ConnectedComponents`):

1. each tile labels its core alone and reports a small summary
   (:func:`tile_components`): per region its size, first cell and bounding
   box, and the labelled cells on the core's faces;
2. the driver unites regions whose face cells touch across a tile border,
   drops the small ones and numbers the rest by their first cell
   (:func:`merge_tiles`) -- the numbering ``label`` gives;
3. each tile maps its local labels to the array's (:class:`TileLabels`), and
   the tile that holds a region's first cell gathers a region that spans tiles
   from its bounding box (:func:`region_cells`), so its lineage is one pair.

Plain numpy and scipy: this code runs inside Spark tasks.  Why first-cell
order: it is the order ndimage's raster scan gives, and it is a property of
the region, not of the tiling, so every tile size gives the same labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

Box = tuple[tuple[int, int], ...]


def structure(ndim: int, connectivity: str) -> np.ndarray:
    """``"full"``: cells touching by a face, an edge or a corner are connected (8 in
    2-D); ``"faces"``: by a face only (4 in 2-D)."""
    from scipy import ndimage
    if connectivity not in ("full", "faces"):
        raise ValueError(f"connectivity must be 'full' or 'faces', not {connectivity!r}")
    return ndimage.generate_binary_structure(ndim, ndim if connectivity == "full" else 1)


def label(mask: np.ndarray, connectivity: str = "full", min_size: int = 1) -> tuple[np.ndarray, int]:
    """Whole-array labels (int32; 0 = background) and their number."""
    from scipy import ndimage
    mask = np.asarray(mask, bool)
    labels, n = ndimage.label(mask, structure=structure(mask.ndim, connectivity))
    if n and min_size > 1:
        sizes = np.bincount(labels.ravel(), minlength=n + 1)
        keep = sizes >= min_size
        keep[0] = False
        relabel = np.zeros(n + 1, np.int32)
        relabel[keep] = np.arange(1, int(keep.sum()) + 1)
        labels, n = relabel[labels], int(keep.sum())
    return labels.astype(np.int32, copy=False), int(n)


@dataclass
class TileComponents:
    """What one tile tells the driver about the regions of its core (array coordinates)."""

    index: tuple[int, ...]
    n: int                          # regions of the core alone, labelled 1..n
    size: np.ndarray                # (n,) cells
    first: np.ndarray               # (n,) flat index in the array of each region's first cell
    lo: np.ndarray                  # (n, ndim) bounding box, inclusive
    hi: np.ndarray
    face: np.ndarray                # flat indices of labelled cells on the core's faces
    face_label: np.ndarray          # their local labels


def tile_components(mask: np.ndarray, core: Box, shape: Sequence[int], connectivity: str,
                    index: tuple[int, ...] = ()) -> tuple[np.ndarray, TileComponents]:
    """Label one tile's core (``mask`` is the core's foreground) on its own; return
    the local labels and the tile's summary."""
    from scipy import ndimage
    mask = np.asarray(mask, bool)
    labels, n = ndimage.label(mask, structure=structure(mask.ndim, connectivity))
    origin = np.array([a for a, _ in core], np.int64)
    shape = tuple(int(s) for s in shape)
    flat = labels.ravel()
    at = np.flatnonzero(flat)
    lab = flat[at]
    size = np.bincount(lab, minlength=n + 1)[1:].astype(np.int64)
    # row-major order in the tile is row-major order in the array, so the first
    # occurrence of a label is the region's first cell in the array too
    _, first_at = np.unique(lab, return_index=True)
    first_cells = np.stack(np.unravel_index(at[first_at], mask.shape), axis=1) + origin \
        if n else np.zeros((0, mask.ndim), np.int64)
    first = np.ravel_multi_index(tuple(first_cells.T), shape) if n else np.zeros(0, np.int64)
    objs = ndimage.find_objects(labels)
    lo = np.array([[s.start for s in o] for o in objs], np.int64).reshape(n, mask.ndim) + origin
    hi = np.array([[s.stop - 1 for s in o] for o in objs], np.int64).reshape(n, mask.ndim) + origin
    faces = np.zeros(mask.shape, bool)
    for ax in range(mask.ndim):
        idx: list = [slice(None)] * mask.ndim
        idx[ax] = 0
        faces[tuple(idx)] = True
        idx[ax] = -1
        faces[tuple(idx)] = True
    on_face = np.flatnonzero((labels > 0) & faces)
    face_cells = np.stack(np.unravel_index(on_face, mask.shape), axis=1) + origin
    face = np.ravel_multi_index(tuple(face_cells.T), shape) if len(on_face) else np.zeros(0, np.int64)
    return labels, TileComponents(tuple(index), int(n), size, np.asarray(first, np.int64), lo, hi,
                                  np.asarray(face, np.int64), flat[on_face].astype(np.int64))


@dataclass
class Region:
    """A region that spans tiles, gathered by the tile holding its first cell."""

    label: int
    first: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]


@dataclass
class TileLabels:
    """The driver's answer to one tile: array labels by local label (``relabel[0]``
    is 0), the labels of regions that span tiles (their cells in this tile are
    written by their owner) and the spanning regions this tile owns."""

    relabel: np.ndarray
    spanning: np.ndarray
    owned: list[Region] = field(default_factory=list)


def merge_tiles(tiles: Sequence[TileComponents], shape: Sequence[int], connectivity: str,
                min_size: int = 1) -> tuple[list[TileLabels], int]:
    """Unite regions that touch across tile borders, drop those under ``min_size``
    cells and number the rest by their first cell; one :class:`TileLabels` per
    tile (in the order given) and the number of regions."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    shape = tuple(int(s) for s in shape)
    ndim = len(shape)
    counts = np.array([t.n for t in tiles], np.int64)
    base = np.concatenate([[0], np.cumsum(counts)])
    total = int(base[-1])
    owner_tile = np.repeat(np.arange(len(tiles)), counts)
    size = np.concatenate([t.size for t in tiles]) if total else np.zeros(0, np.int64)
    first = np.concatenate([t.first for t in tiles]) if total else np.zeros(0, np.int64)
    lo = np.concatenate([t.lo for t in tiles]).reshape(total, ndim)
    hi = np.concatenate([t.hi for t in tiles]).reshape(total, ndim)
    face = np.concatenate([t.face for t in tiles] + [np.zeros(0, np.int64)])
    gid = np.concatenate([t.face_label - 1 + base[k] for k, t in enumerate(tiles)]
                         + [np.zeros(0, np.int64)])
    order = np.argsort(face, kind="stable")
    face, gid = face[order], gid[order]
    cells = np.stack(np.unravel_index(face, shape), axis=1) if len(face) else np.zeros((0, ndim), np.int64)
    a_edges, b_edges = [], []
    offsets = np.argwhere(structure(ndim, connectivity)) - 1
    for d in offsets[np.any(offsets != 0, axis=1)]:
        nb = cells + d
        ok = np.all((nb >= 0) & (nb < np.array(shape)), axis=1)
        q = np.ravel_multi_index(tuple(nb[ok].T), shape) if ok.any() else np.zeros(0, np.int64)
        pos = np.searchsorted(face, q)
        pos = np.minimum(pos, max(len(face) - 1, 0))
        hit = (face[pos] == q) if len(face) else np.zeros(0, bool)
        a_edges.append(gid[ok][hit])
        b_edges.append(gid[pos[hit]])
    a = np.concatenate(a_edges + [np.zeros(0, np.int64)])
    b = np.concatenate(b_edges + [np.zeros(0, np.int64)])
    graph = coo_matrix((np.ones(len(a), np.int8), (a, b)), shape=(total, total))
    _, root = connected_components(graph, directed=False) if total else (0, np.zeros(0, np.int64))
    m = int(root.max()) + 1 if total else 0
    r_size = np.bincount(root, weights=size, minlength=m).astype(np.int64)
    r_first = np.full(m, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(r_first, root, first)
    r_lo = np.full((m, ndim), np.iinfo(np.int64).max, np.int64)
    r_hi = np.full((m, ndim), -1, np.int64)
    np.minimum.at(r_lo, root, lo)
    np.maximum.at(r_hi, root, hi)
    r_parts = np.bincount(root, minlength=m)
    keep = r_size >= max(int(min_size), 1)
    kept = np.flatnonzero(keep)
    kept = kept[np.argsort(r_first[kept], kind="stable")]
    final = np.zeros(m, np.int32)
    final[kept] = np.arange(1, len(kept) + 1, dtype=np.int32)
    # the tile of each region's first cell owns it (its comp with that first cell)
    holder = np.flatnonzero(first == r_first[root]) if total else np.zeros(0, np.int64)
    owners = {int(root[c]): int(owner_tile[c]) for c in holder}
    out = []
    for k in range(len(tiles)):
        mine = root[base[k]:base[k + 1]]
        relabel = np.concatenate([[0], final[mine]]).astype(np.int32)
        span = mine[(r_parts[mine] > 1) & keep[mine]]
        out.append(TileLabels(relabel, np.unique(final[span]).astype(np.int32)))
    for r in kept[r_parts[kept] > 1]:
        out[owners[int(r)]].owned.append(Region(int(final[r]), int(r_first[r]),
                                                tuple(int(x) for x in r_lo[r]),
                                                tuple(int(x) for x in r_hi[r])))
    return out, len(kept)


def region_cells(mask: np.ndarray, lo: Sequence[int], first: int, shape: Sequence[int],
                 connectivity: str) -> np.ndarray:
    """The cells (array coordinates) of the region whose first cell is ``first``,
    from ``mask``, the foreground over the region's bounding box starting at ``lo``.

    Why the box is enough: every path inside the box between foreground cells is a
    path of the region, and every cell of the region lies in the box."""
    from scipy import ndimage
    labels, _ = ndimage.label(np.asarray(mask, bool), structure=structure(mask.ndim, connectivity))
    at = np.array(np.unravel_index(int(first), tuple(int(s) for s in shape))) - np.asarray(lo)
    mine = labels[tuple(at)]
    return np.argwhere(labels == mine) + np.asarray(lo, np.int64)
