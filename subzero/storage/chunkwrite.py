"""Whole chunks of a stored array written straight to their files, without zarr.

The write-side twin of :mod:`.chunkread`.  Every array SubZero makes with
``ArrayStore.create`` has one layout: a regular chunk grid with default ``c/i/j``
keys and the codecs ``bytes`` (little-endian) -> ``zstd`` -> ``crc32c``.  Writing a
slab of whole chunks through zarr goes through its event loop and codec pipeline
(genomics 1,000x: a 43 MB array of 188 chunks, 0.175 s; 0.076 s encoded here).  So
:func:`writer` encodes that layout itself, with the codecs' own configuration from
the array's metadata and numcodecs' zstd, as zarr does: a chunk file written here is
byte for byte the one zarr writes (``tests/test_chunkwrite.py`` compares them on
random arrays, dtypes and ragged edges).  Each file is written as zarr's local store
writes it, to a temporary file renamed over its place, and never through a link.
Anything else -- another codec chain or configuration, a fill value that is not a
number, a region that is not whole chunks -- is left to zarr.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from subzero.storage.chunkread import plain_layout
from subzero.storage.chunks import ArrayNode

#: (chunk index, the chunk's values: the array's cells in that chunk, unpadded)
ChunkWrite = Callable[[tuple[int, ...], np.ndarray], None]


def writer(meta: Mapping[str, Any], node: ArrayNode, root: Path) -> ChunkWrite | None:
    """A function writing one whole chunk of the array node at ``root`` (its values,
    cut to the array's edge as a region holds them), or None when the node's metadata
    ``meta`` is not the layout this module encodes."""
    dtype = plain_layout(meta, node)
    if dtype is None or tuple(meta.get("shape") or ()) != node.shape or node.separator != "/":
        return None
    grid = meta.get("chunk_grid") or {}
    keys = meta.get("chunk_key_encoding") or {}
    if grid.get("name") != "regular" or keys.get("name") != "default":
        return None
    zstd = meta["codecs"][1].get("configuration") or {}
    level, checksum = zstd.get("level", 0), zstd.get("checksum", False)
    fill = _fill_value(meta.get("fill_value"), dtype)
    if not isinstance(level, int) or not isinstance(checksum, bool) or fill is None:
        return None
    import google_crc32c
    from numcodecs import Zstd
    encode = Zstd(level=level, checksum=checksum).encode
    chunks = node.chunks

    def write(idx: tuple[int, ...], values: np.ndarray) -> None:
        if values.shape != chunks:            # an edge chunk: zarr pads it with the fill value
            whole = np.full(chunks, fill, dtype)
            whole[tuple(slice(0, k) for k in values.shape)] = values
            values = whole
        body = bytes(encode(np.ascontiguousarray(values, dtype=dtype).tobytes()))
        data = body + google_crc32c.value(body).to_bytes(4, "little")
        _put(node.chunk_file(root, idx), data)
    return write


#: the fill values zarr's JSON spells as strings (its hex spelling is left to zarr)
_SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _fill_value(fill: Any, dtype: np.dtype) -> Any:
    """The value zarr pads an edge chunk with, as numpy takes it, or None when it is
    not one this module spells the way zarr does."""
    if dtype.kind == "b":
        return fill if isinstance(fill, bool) else None
    if isinstance(fill, bool):
        return None
    if dtype.kind in "iu":
        return fill if isinstance(fill, int) else None
    if dtype.kind == "f":
        if isinstance(fill, str):
            return _SPECIAL.get(fill)
        return fill if isinstance(fill, (int, float)) else None
    if dtype.kind == "c" and isinstance(fill, list) and len(fill) == 2:
        parts = [_fill_value(f, np.dtype(np.float64)) for f in fill]
        return None if any(p is None for p in parts) else complex(*parts)
    return None


def _put(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file beside it, renamed over it (a
    reader never sees half a chunk; a link at ``path`` is replaced, not followed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:                     # a full disk, say: no partial file left
        tmp.unlink(missing_ok=True)
        raise
