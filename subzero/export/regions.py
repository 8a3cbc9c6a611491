"""A region (a set of cells of one array) described compactly, for every export format.

A region is written as its count, its bounding box and its cells as runs of
consecutive cells in C order (``[first cell id, length]`` pairs, the id being
the cell's position in the flattened array): a box of an image is one run per
row, a star a handful.  A region with too many runs for a metadata record
(:data:`subzero.tuning.MAX_RUNS`) keeps its count and bounding box and says how
many runs it has (``truncated``); the mask formats carry every cell.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from subzero.model.cells import unpack
from subzero.model.cellset import CellSet
from subzero.tuning import MAX_RUNS


def runs(cs: CellSet) -> np.ndarray:
    """``(R, 2)`` int64: ``[first id, length]`` of each run of consecutive cell ids."""
    if not len(cs):
        return np.zeros((0, 2), np.int64)
    if cs.is_entire:
        return np.array([[0, cs.size]], np.int64)
    ids = cs.ids()
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [ids.size]))
    return np.stack([ids[starts], ends - starts], axis=1).astype(np.int64)


def is_box(cs: CellSet) -> bool:
    """Whether the region fills its bounding box."""
    box = cs.bounds()
    return box is not None and len(cs) == math.prod(b - a for a, b in zip(*box))


def box_text(box: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    """A box in the ``--cells`` syntax (half-open, like Python slices): ``10:20,30:40``."""
    return ",".join(f"{a}:{b}" for a, b in zip(*box))


def spec(cs: CellSet, limit: int = 16) -> str:
    """The region in the ``--cells`` syntax when that is short (one cell, a few cells,
    a box), else ``N cells in box a:b,c:d``: a person can read it and re-ask it."""
    box = cs.bounds()
    if box is None:
        return "no cells"
    if len(cs) == 1 or (len(cs) <= limit and not is_box(cs)):
        return ";".join(",".join(str(int(x)) for x in c) for c in cs.cells())
    if is_box(cs):
        return box_text(box)
    return f"{len(cs)} cells in box {box_text(box)}"


def summary(cs: CellSet, array: str, max_runs: int = MAX_RUNS) -> dict[str, Any]:
    """The region as plain JSON data (see the module docstring)."""
    box = cs.bounds()
    r = runs(cs)
    out: dict[str, Any] = {
        "array": array, "shape": list(cs.shape), "count": int(len(cs)), "cells": spec(cs),
        "bbox": None if box is None else {"lo": list(box[0]), "hi": list(box[1])},
        "encoding": "c-order-runs", "runCount": int(len(r)), "truncated": bool(len(r) > max_runs)}
    if len(r) <= max_runs:
        out["runs"] = r.tolist()
    return out


def from_runs(shape: tuple[int, ...], pairs) -> np.ndarray:
    """The ``(N, ndim)`` cells of a summary's runs (for readers and tests)."""
    p = np.asarray(pairs, np.int64).reshape(-1, 2)
    if not len(p):
        return np.zeros((0, len(shape)), np.int64)
    ids = np.concatenate([np.arange(a, a + n) for a, n in p])
    return unpack(ids, shape)
