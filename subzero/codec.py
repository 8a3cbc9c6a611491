"""Compact byte encoding of int64 arrays (cell sets, offsets, pair ids).

Values are delta-encoded (sorted cell sets become runs of small numbers),
narrowed to the smallest signed integer type that holds the deltas, and
several arrays are packed into one zstd-compressed blob per LMDB value.
"""

from __future__ import annotations

import struct

import numpy as np
from numcodecs import Zstd

_ZSTD = Zstd(level=1)
_DTYPES = (np.int8, np.int16, np.int32, np.int64)
_HDR = struct.Struct("<BQ")      # dtype code, length


def _narrow(d: np.ndarray) -> tuple[int, np.ndarray]:
    if d.size == 0:
        return 0, d.astype(np.int8)
    lo, hi = int(d.min()), int(d.max())
    for code, t in enumerate(_DTYPES):
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return code, d.astype(t)
    return 3, d


def pack_arrays(*arrays: np.ndarray, delta: bool = True) -> bytes:
    """Serialise int arrays into one compressed blob."""
    head = [struct.pack("<H", len(arrays))]
    body = []
    for a in arrays:
        a = np.asarray(a, dtype=np.int64)
        d = np.diff(a, prepend=np.int64(0)) if delta and a.size else a
        code, n = _narrow(d)
        head.append(_HDR.pack(code, a.size))
        body.append(n.tobytes())
    raw = b"".join(head) + b"".join(body)
    return bytes(_ZSTD.encode(raw))


def unpack_arrays(blob: bytes, delta: bool = True) -> list[np.ndarray]:
    raw = memoryview(bytes(_ZSTD.decode(blob)))
    (k,) = struct.unpack_from("<H", raw, 0)
    pos = 2
    specs = []
    for _ in range(k):
        code, n = _HDR.unpack_from(raw, pos)
        pos += _HDR.size
        specs.append((code, n))
    out = []
    for code, n in specs:
        t = np.dtype(_DTYPES[code])
        a = np.frombuffer(raw, dtype=t, count=n, offset=pos).astype(np.int64)
        pos += n * t.itemsize
        out.append(np.cumsum(a) if delta and n else a)
    return out


def pack_bytes(items: list[bytes]) -> bytes:
    """Serialise a list of byte strings (payload tables)."""
    lens = np.fromiter((len(x) for x in items), np.int64, count=len(items))
    head = pack_arrays(lens, delta=False)
    return struct.pack("<I", len(head)) + head + bytes(_ZSTD.encode(b"".join(items)))


def unpack_bytes(blob: bytes) -> list[bytes]:
    (h,) = struct.unpack_from("<I", blob, 0)
    (lens,) = unpack_arrays(blob[4:4 + h], delta=False)
    data = bytes(_ZSTD.decode(blob[4 + h:]))
    out, pos = [], 0
    for n in lens.tolist():
        out.append(data[pos:pos + n])
        pos += n
    return out
