"""A region (a set of cells of one array) described compactly, for every export format.

A region is written as its count, its bounding box and its cells as runs of
consecutive cells in C order (``[first cell id, length]`` pairs, the id being
the cell's position in the flattened array): a box of an image is one run per
row, a star a handful.  A region with too many runs for a metadata record
(:data:`subzero.tuning.MAX_RUNS`) keeps its count and bounding box and says how
many runs it has (``truncated``); the mask formats carry every cell.  The
``cells`` text is the region in the ``--cells`` syntax
(:func:`subzero.model.cellset.spec`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from subzero.model.cells import unpack
from subzero.model.cellset import CellSet, box_text, is_box, spec
from subzero.tuning import MAX_RUNS

__all__ = ["MAX_RUNS", "box_text", "from_runs", "is_box", "runs", "spec", "summary"]


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
