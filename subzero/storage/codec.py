"""Compact byte encoding of int64 arrays (cell sets, offsets, pair ids).

Values are delta-encoded (sorted cell sets become runs of small numbers),
narrowed to the smallest signed integer type that holds the deltas, and
several arrays are packed into one zstd-compressed blob per LMDB value.

Encoding many blocks at once is the capture hot path, so
:func:`pack_blocks` does the delta and narrowing work for all blocks with
whole-array numpy operations and leaves only slicing and one compression
call per block.
"""

from __future__ import annotations

import struct
import threading

import numpy as np
import zstandard

_LOCAL = threading.local()
_DTYPES = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64))
_LIMITS = np.array([[np.iinfo(t).min, np.iinfo(t).max] for t in _DTYPES], dtype=np.int64)
_HDR = struct.Struct("<BQ")      # dtype code, length

#: Stored bytes as a decoder takes them: bytes, or a view of them (a value as LMDB
#: or a shard hands it back, or the body of a sealed value)
Blob = bytes | memoryview


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    """This thread's zstd (de)compressor.  Reused because creating one costs ~10 us,
    more than decoding a small key block; per thread because they are not thread-safe.
    Frames are plain zstd (level 1, content size in the header), as numcodecs wrote them
    in stores made before."""
    z = getattr(_LOCAL, "zstd", None)
    if z is None:
        z = _LOCAL.zstd = (zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor())
    return z


def _compress(data: bytes) -> bytes:
    return _zstd()[0].compress(data)


def _decompress(blob: Blob) -> bytes:
    return _zstd()[1].decompress(blob)


def _code(lo: int, hi: int) -> int:
    for c, (a, b) in enumerate(_LIMITS.tolist()):
        if a <= lo and hi <= b:
            return c
    return 3


def _codes(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Vectorized dtype code per segment from its min and max."""
    code = np.full(len(lo), 3, np.int8)
    for c in (2, 1, 0):
        ok = (lo >= _LIMITS[c, 0]) & (hi <= _LIMITS[c, 1])
        code[ok] = c
    return code


def _blob(parts: list[tuple[int, np.ndarray]]) -> bytes:
    head = [struct.pack("<H", len(parts))]
    body = []
    for code, d in parts:
        head.append(_HDR.pack(code, d.size))
        body.append(d.astype(_DTYPES[code], copy=False).tobytes())
    return _compress(b"".join(head) + b"".join(body))


def pack_arrays(*arrays: np.ndarray, delta: bool = True) -> bytes:
    """Serialise int arrays into one compressed blob."""
    parts = []
    for a in arrays:
        a = np.asarray(a, dtype=np.int64)
        d = a.copy()
        if delta and a.size > 1:
            d[1:] -= a[:-1]
        parts.append((_code(int(d.min()), int(d.max())) if d.size else 0, d))
    return _blob(parts)


def delta_segments(a: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Deltas of ``a`` restarting at each segment start, and each segment's dtype code.

    Segment k is ``a[starts[k]:starts[k+1]]`` (the last runs to the end).
    """
    a = np.asarray(a, dtype=np.int64)
    d = a.copy()
    if a.size > 1:
        d[1:] -= a[:-1]
    s = starts[starts < a.size]
    d[s] = a[s]
    ends = np.append(starts[1:], a.size)
    codes = np.zeros(len(starts), np.int8)
    nonempty = ends > starts
    if nonempty.any() and d.size:
        idx = starts[nonempty]
        lo = np.minimum.reduceat(d, idx)
        hi = np.maximum.reduceat(d, idx)
        # reduceat over a trailing segment of an index equal to the next start is fine:
        # empty segments were removed above
        codes[nonempty] = _codes(lo, hi)
    return d, codes


def pack_blocks(columns: list[tuple[np.ndarray, np.ndarray]], n_blocks: int) -> list[bytes]:
    """Encode ``n_blocks`` blobs at once.

    ``columns`` is a list of (array, segment starts with n_blocks+1 entries):
    block b holds ``array[starts[b]:starts[b+1]]`` of every column, each
    delta-encoded from the block's start — the same bytes :func:`pack_arrays`
    would produce for those slices.
    """
    prepared = []
    for arr, bounds in columns:
        d, codes = delta_segments(arr, bounds[:-1])
        prepared.append((d, codes, bounds.tolist()))
    out = []
    for b in range(n_blocks):
        out.append(_blob([(int(codes[b]), d[bounds[b]:bounds[b + 1]])
                          for d, codes, bounds in prepared]))
    return out


class PackedArrays:
    """The arrays of one blob, each decoded on first access: a lookup often needs
    one field of a record block, and widening the others would be wasted work."""

    def __init__(self, blob: Blob, delta: bool = True):
        self.raw = memoryview(_decompress(blob))
        self.delta = delta
        (k,) = struct.unpack_from("<H", self.raw, 0)
        pos = 2 + k * _HDR.size
        self.specs = []
        for j in range(k):
            code, n = _HDR.unpack_from(self.raw, 2 + j * _HDR.size)
            self.specs.append((code, n, pos))
            pos += n * _DTYPES[code].itemsize
        self._done: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, j: int) -> np.ndarray:
        a = self._done.get(j)
        if a is None:
            code, n, pos = self.specs[j]
            a = np.frombuffer(self.raw, dtype=_DTYPES[code], count=n, offset=pos)
            # widen while summing (one pass) rather than astype then cumsum (two)
            a = self._done[j] = (np.add.accumulate(a, dtype=np.int64) if self.delta and n
                                 else a.astype(np.int64))
        return a


def unpack_concat(blobs: list[Blob], delta: bool = True) -> tuple[list[np.ndarray], np.ndarray]:
    """The arrays of many blobs that each hold the same number of them, laid end to end:
    (one int64 array per position over all the blobs in order, the length of each
    blob's part as an array of shape (arrays, blobs)).  The values are those
    :func:`unpack_arrays` gives blob by blob, at a few microseconds a blob where that
    takes tens: a cold read decodes thousands of small blocks, and their per-call numpy
    work was most of it (genomics' extract at 1,000x: 2,000 blocks, 80 ms of 140)."""
    nb = len(blobs)
    if nb == 0:
        return [], np.zeros((0, 0), np.int64)
    raws = [_decompress(b) for b in blobs]
    (k,) = struct.unpack_from("<H", raws[0], 0)
    lens = np.zeros((k, nb), np.int64)
    codes = np.zeros((k, nb), np.int64)
    pieces: list[list[list[memoryview]]] = [[[], [], [], []] for _ in range(k)]
    size = [d.itemsize for d in _DTYPES]
    hdr = _HDR.unpack_from
    for b, raw in enumerate(raws):
        if struct.unpack_from("<H", raw, 0)[0] != k:
            raise ValueError(f"block {b} of {nb} holds another number of arrays than the first")
        pos = 2 + k * _HDR.size
        view = memoryview(raw)                # slices without copies; one join copies
        for j in range(k):
            code, n = hdr(raw, 2 + j * _HDR.size)
            end = pos + n * size[code]
            if end > len(raw):
                raise ValueError(f"block {b} of {nb} is shorter than its header says")
            pieces[j][code].append(view[pos:end])
            lens[j, b], codes[j, b] = n, code
            pos = end
    out = []
    for j in range(k):
        used = [c for c in range(4) if pieces[j][c]]
        if len(used) == 1:
            a = np.frombuffer(b"".join(pieces[j][used[0]]), _DTYPES[used[0]]).astype(np.int64)
        else:                          # blocks narrowed to different types: each its own place
            a = np.empty(int(lens[j].sum()), np.int64)
            for c in used:
                a[np.repeat(codes[j] == c, lens[j])] = np.frombuffer(b"".join(pieces[j][c]), _DTYPES[c])
        out.append(_segment_sums(a, lens[j]) if delta else a)
    return out, lens


def _segment_sums(d: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Running sums of ``d`` restarted at each segment (``lens`` long each): the delta
    decoding of blocks laid end to end.  int64 wraps in a running sum over all of them,
    and wraps back exactly in the subtraction."""
    if d.size == 0:
        return d
    with np.errstate(over="ignore"):
        run = np.cumsum(d)
        full = lens > 0
        starts = (np.cumsum(lens) - lens)[full]
        return run - np.repeat(run[starts] - d[starts], lens[full])


def unpack_arrays(blob: Blob, delta: bool = True) -> list[np.ndarray]:
    p = PackedArrays(blob, delta)
    return [p[j] for j in range(len(p))]


def pack_bytes(items: list[bytes]) -> bytes:
    """Serialise a list of byte strings (payload tables)."""
    lens = np.fromiter((len(x) for x in items), np.int64, count=len(items))
    head = pack_arrays(lens, delta=False)
    data = b"".join(items)
    # zstd cannot round-trip an empty frame: empty payload tables store nothing
    return struct.pack("<I", len(head)) + head + (_compress(data) if data else b"")


def unpack_bytes(blob: Blob) -> list[bytes]:
    (h,) = struct.unpack_from("<I", blob, 0)
    (lens,) = unpack_arrays(blob[4:4 + h], delta=False)
    rest = blob[4 + h:]
    data = _decompress(rest) if rest else b""
    out, pos = [], 0
    for n in lens.tolist():
        out.append(data[pos:pos + n])
        pos += n
    return out
