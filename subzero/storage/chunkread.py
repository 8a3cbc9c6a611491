"""A region of a stored array read straight from its chunk files, without zarr.

Every array SubZero writes has one layout: a regular chunk grid with default
``c/i/j`` keys, and the codecs ``bytes`` (little-endian) -> ``zstd`` -> ``crc32c``
(:func:`.chunks.checksum_codecs`).  Reading a few cells of such an array -- the
values a trace prints, a tile a re-execution needs -- is a few ``pread``\\ s, a
checksum and a decompression; importing zarr to do it costs several times a
whole trace.  So :func:`read_region` decodes that layout itself, with the same
checks zarr and :func:`.chunks.check_present` make together: each chunk opened
without following a link or blocking, a regular file, its crc32c trailer the
manifest's (a bound array), its body matching the trailer, its decompressed
size the chunk's.  Anything else -- another codec, a big-endian or string dtype,
an unbound legacy array -- returns None and zarr reads it.  tests/test_chunkread.py
checks the two agree, cell for cell, on random arrays and regions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from subzero.errors import CorruptArray
from subzero.storage.chunks import TRAILER, ArrayNode, misplaced, read_chunk

#: the codec chain this module decodes (names, in order)
_CHAIN = ("bytes", "zstd", "crc32c")


def plain_layout(meta: Mapping[str, Any], node: ArrayNode) -> np.dtype | None:
    """The (little-endian, numeric) dtype of an array node whose metadata ``meta``
    is SubZero's own layout, else None."""
    codecs = meta.get("codecs")
    if not node.checksummed or not isinstance(codecs, list) or len(codecs) != len(_CHAIN):
        return None
    if any(not isinstance(c, dict) or c.get("name") != n for c, n in zip(codecs, _CHAIN)):
        return None
    data_type = meta.get("data_type")
    if not isinstance(data_type, str):
        return None
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind not in "biufc":
        return None
    endian = (codecs[0].get("configuration") or {}).get("endian")
    if dtype.itemsize > 1 and endian != "little":
        return None
    if meta.get("storage_transformers"):
        return None
    return dtype.newbyteorder("<")


def read_region(root: Path, node: ArrayNode, dtype: np.dtype, region: tuple[slice, ...],
                label: str) -> np.ndarray:
    """The cells of ``region`` (unit-step slices, one per axis) of the array node at
    ``root``; :class:`CorruptArray` naming the chunk that is missing, misplaced or
    damaged."""
    import google_crc32c
    import zstandard
    bounds = [s.indices(n)[:2] for s, n in zip(region, node.shape)]
    out = np.empty(tuple(max(b - a, 0) for a, b in bounds), dtype=dtype.newbyteorder("="))
    if out.size == 0:
        return out
    decompress = zstandard.ZstdDecompressor().decompress
    nbytes = int(np.prod(node.chunks)) * dtype.itemsize
    grid = node.grid()
    base = f"{root / node.path}{os.sep}c"
    for idx in node.touched(region):
        path = base + "".join(f"{node.separator}{k}" for k in idx)
        data = read_chunk(path)
        if isinstance(data, str):
            where = node.chunk_file(root, idx)
            raise CorruptArray(f"{label}{': ' if misplaced(data) else ' is damaged: '}chunk file "
                               f"{where} {data}")
        body, trailer = data[:-TRAILER], data[-TRAILER:]
        if node.trailers is not None:
            k = node.chunk_index(idx, grid)
            if trailer != node.trailers[TRAILER * k:TRAILER * (k + 1)]:
                sound = google_crc32c.value(body) == int.from_bytes(trailer, "little")
                raise CorruptArray(
                    f"{label}: chunk file {node.chunk_file(root, idx)} is not the chunk its "
                    f"place names (its checksum is not the one the array's manifest records "
                    f"for it)" if sound else
                    f"{label} is damaged: chunk file {node.chunk_file(root, idx)} fails its checksum")
        if google_crc32c.value(body) != int.from_bytes(trailer, "little"):
            raise CorruptArray(f"{label} is damaged: chunk file {node.chunk_file(root, idx)} "
                               f"fails its checksum")
        try:
            raw = decompress(body, max_output_size=nbytes)
        except zstandard.ZstdError as e:
            raise CorruptArray(f"{label} is damaged: chunk file {node.chunk_file(root, idx)} "
                               f"cannot be decompressed ({e})") from e
        if len(raw) != nbytes:
            raise CorruptArray(f"{label} is damaged: chunk file {node.chunk_file(root, idx)} "
                               f"holds {len(raw)} bytes, not a chunk's {nbytes}")
        chunk = np.frombuffer(raw, dtype=dtype).reshape(node.chunks)
        src, dst = [], []
        for d, i in enumerate(idx):
            c0 = i * node.chunks[d]
            a, b = max(bounds[d][0], c0), min(bounds[d][1], c0 + node.chunks[d])
            src.append(slice(a - c0, b - c0))
            dst.append(slice(a - bounds[d][0], b - bounds[d][0]))
        out[tuple(dst)] = chunk[tuple(src)]
    return out
