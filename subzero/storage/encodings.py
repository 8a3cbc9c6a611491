"""Lineage encodings: FullOne, FullMany, PayOne, PayMany.

A stored strategy is split into *spaces*, one per key side: backward-
optimized lineage has one space keyed by output cells (``"b"``); forward-
optimized lineage has one space per input, keyed by that input's cells
(``"f0"``, ``"f1"``...).  A space holds its pairs (dense ids 0..P-1) as

* **record blocks** — ``REC_PAIRS`` consecutive pairs per LMDB value: the
  value side of each pair (cells per input, output cells, or a payload) and,
  where the lookup or ``map_p`` needs them, the key cells;
* a **key index** that finds the pairs a query touches:
  - *One* encodings (FullOne, PayOne): every key cell is addressable.  Key
    cells are grouped in blocks of ``2**KEY_BITS`` consecutive packed
    indices; a block maps each of its cells to the ids of the pairs (shared
    entries) it belongs to.  A cell written by two pairs points at both — the
    values are merged on write (decode, union, re-encode).
  - *Many* encodings (FullMany, PayMany): an R-tree over the bounding box of
    each pair's key cells (built by the store); candidates are then checked
    against the exact key cells kept in the records.

Everything here is plain numpy + bytes; the store does the I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.model.cells import (
    csr_rows,
    csr_take,
    lengths_to_offsets,
    pack,
    run_starts,
    stable_order,
    unpack,
)
from subzero.model.strategy import Direction, Encoding, Strategy
from subzero.storage.codec import (
    Blob,
    PackedArrays,
    pack_arrays,
    pack_blocks,
    pack_bytes,
    unpack_arrays,
    unpack_bytes,
    unpack_concat,
)
from subzero.tuning import DECODE_BLOCKS, KEY_BITS

#: Key-index block size of stores written before each space recorded its own
#: (new writes use ``subzero.tuning.KEY_BITS``).
LEGACY_KEY_BITS = 14
#: Pairs per record block (2**REC_BITS): fixed by the format.
REC_BITS = 10
REC_PAIRS = 1 << REC_BITS

#: ``map_p_pairs(out_cells, offsets, payloads, pay_ids, i) -> (incells, owner)``: an
#: operator's :meth:`~subzero.model.operator.Operator.map_p_pairs` bound to its context
MapPPairs = Callable[[np.ndarray, np.ndarray, Sequence[bytes], np.ndarray, int],
                     tuple[np.ndarray, np.ndarray]]
#: Fields of some pairs, by name: ``"key"``, ``"v<i>"``, ``"v"`` -> (cells, offsets per
#: pair); ``"pay"`` -> (payload id per pair, payload table: ``list[bytes]``)
Records = dict[str, tuple[np.ndarray, Any]]


@dataclass
class Space:
    """The pairs of one key side, ready to encode.

    ``key``/``key_off``: packed key cells per pair (in ``key_shape``);
    ``values``: name -> (packed cells, offsets) of the value side;
    ``pay_ids``/``payloads``: payload per pair (payload spaces only).
    """

    name: str
    key_shape: tuple[int, ...]
    key: np.ndarray
    key_off: np.ndarray
    values: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    value_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    pay_ids: np.ndarray | None = None
    payloads: list[bytes] | None = None

    @property
    def n(self) -> int:
        return len(self.key_off) - 1


def _select_rows(cells: np.ndarray, off: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lens = (off[rows + 1] - off[rows])
    return csr_take(cells, off, rows), lengths_to_offsets(lens)


def merge_payload_tables(parts: Sequence[tuple[np.ndarray, Sequence[bytes]]],
                         rows: np.ndarray | None = None) -> tuple[np.ndarray, list[bytes]]:
    """Payloads of pairs gathered from several parts (record blocks, or chunks of one
    read), each part a (payload id per pair, payload table): the ids laid end to end
    (``rows`` of them, when given) as ids into one table that holds each payload the
    kept pairs use, once."""
    tbase = lengths_to_offsets(np.array([len(table) for _, table in parts], np.int64))
    glob = np.concatenate([np.asarray(ids, np.int64) + tbase[j] for j, (ids, _) in enumerate(parts)]) \
        if parts else np.zeros(0, np.int64)
    if rows is not None:
        glob = glob[rows]
    flat = [p for _, table in parts for p in table]
    used, inv = np.unique(glob, return_inverse=True)
    index: dict[bytes, int] = {}
    remap = np.array([index.setdefault(flat[u], len(index)) for u in used.tolist()], np.int64)
    return remap[inv].reshape(-1), list(index)          # dict order is id order


def concat_records(parts: Sequence[Records], fields: list[str]) -> Records:
    """The records of consecutive runs of pairs as one: cells and offsets laid end to
    end, and the payload tables merged into one (ids renumbered into it, as a
    multi-block read of a stored strategy does)."""
    out: Records = {}
    for f in fields:
        if f == "pay":
            out["pay"] = merge_payload_tables([p["pay"] for p in parts])
        else:
            cells = np.concatenate([p[f][0] for p in parts])
            lens = np.concatenate([np.diff(p[f][1]) for p in parts])
            out[f] = (cells, lengths_to_offsets(lens))
    return out


def spaces_for(strategy: Strategy, pairs: Pairs, out_shape: Sequence[int],
               in_shapes: Sequence[Sequence[int]], map_p_pairs: MapPPairs | None = None) -> list[Space]:
    """Split captured pairs into the spaces a strategy stores.

    ``map_p_pairs(out_cells, offsets, payloads, pay_ids, i) -> (incells, owner)``
    is needed only for forward-optimized payload strategies, whose key cells
    (input cells) must be computed from the payloads at capture time.
    """
    out_shape = tuple(out_shape)
    if strategy.direction is Direction.BACKWARD:
        # a pair without output cells can never be reached backward (nor forward): drop it
        rows = np.flatnonzero(np.diff(pairs.out_off) > 0)
        key, key_off = _select_rows(pairs.out, pairs.out_off, rows)
        if strategy.payload:
            assert pairs.pay_ids is not None, "payload strategies store payload pairs"
            return [Space("b", out_shape, key, key_off,
                          pay_ids=pairs.pay_ids[rows], payloads=pairs.payloads)]
        return [Space("b", out_shape, key, key_off,
                      values={f"v{i}": _select_rows(pairs.ins[i], pairs.in_offs[i], rows)
                              for i in range(len(in_shapes))},
                      value_shapes={f"v{i}": tuple(s) for i, s in enumerate(in_shapes)})]
    spaces = []
    for i, shp in enumerate(in_shapes):
        if strategy.payload:
            if map_p_pairs is None or pairs.pay_ids is None or pairs.payloads is None:
                raise TypeError(f"strategy {strategy} keys payload pairs by input cells: it needs "
                                f"payload pairs and the operator's map_p_pairs")
            cells, owner = map_p_pairs(unpack(pairs.out, out_shape), pairs.out_off,
                                       pairs.payloads, pairs.pay_ids, i)
            order = stable_order(owner, pairs.n)
            key_all = pack(cells, tuple(shp))[order]     # packed, then one number a cell moved
            key_off_all = lengths_to_offsets(np.bincount(owner, minlength=pairs.n))
        else:
            key_all, key_off_all = pairs.ins[i], pairs.in_offs[i]
        rows = np.flatnonzero((np.diff(key_off_all) > 0) & (np.diff(pairs.out_off) > 0))
        key, key_off = _select_rows(key_all, key_off_all, rows)
        v, v_off = _select_rows(pairs.out, pairs.out_off, rows)
        spaces.append(Space(f"f{i}", tuple(shp), key, key_off, values={"v": (v, v_off)},
                            value_shapes={"v": out_shape}))
    return spaces


def sort_within_pairs(cells: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Cells sorted inside each pair (better deltas); ``cells`` itself when they are
    already (operators often write them in order: one pass finds out), else sorted as
    (pair, cell) rows (:func:`_sorted_rows`).  Genomics' ``model`` at 1,000x, 7.7M cells
    in sorted runs: 74 against 332 ms for a lexsort, which was 39 s of a 10,000x budget
    run."""
    if cells.size == 0:
        return cells
    rows = csr_rows(off)
    step = np.diff(cells)
    if not ((step < 0) & (rows[1:] == rows[:-1])).any():
        return cells
    return _sorted_rows(rows, cells, major_in_order=True)[1]


def _sorted_rows(major: np.ndarray, minor: np.ndarray, major_in_order: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(major, minor) rows sorted by major, then minor: one stable sort of the two packed
    in one int64 where they fit (it merges the runs already in order, as operators'
    cells mostly are: as fast as a lexsort on such runs, 2x faster on scattered cells,
    4x on a pair's cells), else a lexsort.  ``major_in_order``: ``major`` is sorted
    already (a pair's rows), so it is what it was and the minor is unpacked by one
    subtraction, not a division."""
    lo_a, lo_b = int(major.min()), int(minor.min())
    span = int(minor.max()) - lo_b + 1
    if int(major.max()) - lo_a < (2**63 - 1) // span:
        # one array made, the rest in place: at genomics 10,000x a forward index of 77
        # million cells made six such temporaries, and the kernel's zeroing of their
        # fresh pages cost more than the sort
        packed = np.subtract(major, lo_a, dtype=np.int64)
        packed *= span
        packed += minor
        if lo_b:
            packed -= lo_b
        packed.sort(kind="stable")
        a = None if major_in_order else np.floor_divide(packed, span)
        np.remainder(packed, span, out=packed)     # the minor, less lo_b
        packed += lo_b
        if a is None:             # sorted within each major already: only the minor moved
            return major, packed
        a += lo_a
        return a, packed
    order = np.lexsort((minor, major))
    return major[order], minor[order]


# --- key index blocks (One encodings) -------------------------------------------

def key_blocks(key: np.ndarray, key_off: np.ndarray, first_pair: int,
               key_bits: int = KEY_BITS) -> dict[int, bytes]:
    """Encode the per-cell index: block id -> bytes (cells, pairs per cell, pair ids)."""
    if key.size == 0:
        return {}
    rows = csr_rows(key_off)
    if first_pair:
        rows += first_pair
    k, p = _sorted_rows(key, rows)
    del rows
    same = k[1:] == k[:-1]             # a cell twice in one pair: once (copied only then)
    same &= p[1:] == p[:-1]
    if same.any():
        keep = np.ones(len(k), bool)
        keep[1:] = ~same
        k, p = k[keep], p[keep]
    return _encode_sorted_index(k, p, key_bits)


def _encode_sorted_index(k: np.ndarray, p: np.ndarray, key_bits: int) -> dict[int, bytes]:
    """(cell, pair) rows sorted by cell -> one blob per key block, all blocks at once."""
    run = np.flatnonzero(run_starts(k))
    cells = k[run]
    ends = np.append(run, len(k))
    counts = np.diff(ends)
    blk = cells >> key_bits
    cstarts = np.flatnonzero(run_starts(blk))
    cbounds = np.append(cstarts, len(cells))
    pbounds = ends[cbounds]
    del ends, run
    blobs = pack_blocks([(cells, cbounds), (counts, cbounds), (p, pbounds)], len(cstarts))
    return dict(zip(blk[cstarts].tolist(), blobs))


def encode_key_block(k: np.ndarray, p: np.ndarray) -> bytes:
    """``k`` sorted (cell, pair) rows of one block."""
    cells, counts = np.unique(k, return_counts=True)
    return pack_arrays(cells, counts, p)


def decode_key_block(blob: Blob) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (cells, offsets into pair ids, pair ids)."""
    cells, counts, pids = unpack_arrays(blob)
    return cells, lengths_to_offsets(counts), pids


def decode_key_blocks(blobs: list[Blob]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Many key blocks: (cells, counts, pair ids) of each, as views of arrays decoded
    together (``unpack_concat``), at most DECODE_BLOCKS at a time (the temporary arrays
    stay bounded by the batch); a lone block is decoded alone, with less to set up.
    Each block's counts must add up to its pair ids: laid end to end, one that did not
    would shift every block after it."""
    if len(blobs) == 1:
        cells, counts, pids = unpack_arrays(blobs[0])
        if len(counts) != len(cells) or int(counts.sum()) != len(pids):
            raise ValueError("a key block's counts do not add up to its pair ids")
        return [(cells, counts, pids)]
    return [d for a in range(0, len(blobs), DECODE_BLOCKS)
            for d in _key_batch(blobs[a:a + DECODE_BLOCKS])]


def _key_batch(blobs: list[Blob]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    if not blobs:
        return []
    (cells, counts, pids), lens = unpack_concat(blobs)
    if lens.shape[0] != 3 or not np.array_equal(lens[0], lens[1]):
        raise ValueError("a key block's cells and counts differ in length")
    ce, pe = np.cumsum(lens[0]), np.cumsum(lens[2])
    cs, ps = ce - lens[0], pe - lens[2]
    run = np.concatenate(([0], np.cumsum(counts)))
    if (counts < 0).any() or not np.array_equal(run[ce] - run[cs], lens[2]):
        raise ValueError("a key block's counts do not add up to its pair ids")
    return [(cells[a:b], counts[a:b], pids[c:d])
            for a, b, c, d in zip(cs.tolist(), ce.tolist(), ps.tolist(), pe.tolist())]


def merge_key_blocks(old: Blob, new: bytes) -> bytes:
    c1, o1, p1 = decode_key_block(old)
    c2, o2, p2 = decode_key_block(new)
    k = np.concatenate((np.repeat(c1, np.diff(o1)), np.repeat(c2, np.diff(o2))))
    p = np.concatenate((p1, p2))
    order = np.lexsort((p, k))
    k, p = k[order], p[order]
    keep = np.ones(len(k), bool)
    keep[1:] = (k[1:] != k[:-1]) | (p[1:] != p[:-1])
    return encode_key_block(k[keep], p[keep])


# --- record blocks ----------------------------------------------------------------

def record_fields(space: Space, enc: Encoding) -> list[str]:
    """Which fields a record block holds, in order."""
    f = []
    if not enc.one or enc.payload:
        f.append("key")          # exact key cells: Many checks them, map_p needs them
    if space.pay_ids is not None:
        f.append("pay")
    f += sorted(space.values)
    return f


def record_blocks(space: Space, enc: Encoding, first_pair: int) -> dict[int, bytes]:
    """Encode records, ``REC_PAIRS`` pairs per block; block id -> bytes.

    ``first_pair`` must be a multiple of ``REC_PAIRS`` (appends start a new block).
    """
    assert first_pair % REC_PAIRS == 0
    fields = record_fields(space, enc)
    n = space.n
    if n == 0:
        return {}
    pb = np.append(np.arange(0, n, REC_PAIRS), n)
    columns = []
    for name in fields:
        if name == "pay":
            continue
        c, o = (space.key, space.key_off) if name == "key" else space.values[name]
        columns.append((np.diff(o), pb))
        columns.append((sort_within_pairs(c, o), o[pb]))
    blobs = pack_blocks(columns, len(pb) - 1)
    if "pay" in fields:
        assert space.pay_ids is not None and space.payloads is not None
        for j, a in enumerate(pb[:-1].tolist()):
            ids = space.pay_ids[a:a + REC_PAIRS]
            uniq, local = np.unique(ids, return_inverse=True)
            table = pack_bytes([space.payloads[u] for u in uniq.tolist()])
            blobs[j] = _join(blobs[j], pack_arrays(local, delta=False), table)
    first_blk = first_pair >> REC_BITS
    return {first_blk + j: b for j, b in enumerate(blobs)}


def _join(*parts: bytes) -> bytes:
    head = struct.pack("<B", len(parts)) + b"".join(struct.pack("<I", len(p)) for p in parts)
    return head + b"".join(parts)


def _split(blob: Blob) -> list[Blob]:
    (k,) = struct.unpack_from("<B", blob, 0)
    lens = struct.unpack_from(f"<{k}I", blob, 1)
    pos = 1 + 4 * k
    out = []
    for n in lens:
        out.append(blob[pos:pos + n])
        pos += n
    return out


class RecordBlock:
    """Decoded records of one block: ``field(name)`` -> (cells, offsets); payloads per pair.

    Fields are widened and the payload part (per-pair payload ids and the payload
    table) decoded on first use: a forward lookup reads only the value cells."""

    def __init__(self, arrays: PackedArrays | list[np.ndarray], names: list[str],
                 pay_blob: tuple[Blob, Blob] | None = None):
        self._arrays = arrays
        self._index = {f: 2 * k for k, f in enumerate(names)}    # lengths, then cells
        self._fields: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._pay_blob = pay_blob
        self._pay: tuple[np.ndarray, list[bytes]] | tuple[None, None] | None = None   # decoded lazily

    def lengths(self, name: str) -> np.ndarray:
        """Cells per pair of a field (what ``field`` gives as offsets)."""
        return self._arrays[self._index[name]]

    def cells(self, name: str) -> np.ndarray:
        """A field's cells, pair after pair (``field`` without the offsets)."""
        return self._arrays[self._index[name] + 1]

    def field(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        got = self._fields.get(name)
        if got is None:
            j = self._index[name]
            got = self._fields[name] = (self._arrays[j + 1], lengths_to_offsets(self._arrays[j]))
        return got

    def _payloads(self) -> tuple[np.ndarray, list[bytes]] | tuple[None, None]:
        if self._pay is None:
            if self._pay_blob is None:
                self._pay = (None, None)
            else:
                local, table = self._pay_blob
                (pay_local,) = unpack_arrays(local, delta=False)
                self._pay = (pay_local, unpack_bytes(table))
        return self._pay

    @property
    def pay_local(self) -> np.ndarray | None:
        return self._payloads()[0]

    @property
    def table(self) -> list[bytes] | None:
        return self._payloads()[1]

    @property
    def n(self) -> int:
        for name in self._index:
            return len(self.lengths(name))
        return 0 if self.pay_local is None else len(self.pay_local)


def decode_record_blocks(blobs: list[Blob], fields: Sequence[str]) -> list[RecordBlock]:
    """Many record blocks (``unpack_concat`` over their cell arrays, at most
    DECODE_BLOCKS at a time; payloads stay per block, decoded when asked for); a lone
    block is decoded alone, each field when first asked for.  Every field of a block
    decoded together must hold as many pairs as the others."""
    if len(blobs) == 1:
        return [decode_record_block(blobs[0], fields)]
    return [rb for a in range(0, len(blobs), DECODE_BLOCKS)
            for rb in _record_batch(blobs[a:a + DECODE_BLOCKS], fields)]


def _record_batch(blobs: list[Blob], fields: Sequence[str]) -> list[RecordBlock]:
    if not blobs:
        return []
    names = [f for f in fields if f != "pay"]
    pays: list[tuple[Blob, Blob] | None]
    if "pay" in fields:
        split = [_split(b) for b in blobs]
        mains, pays = [m for m, _, _ in split], [(lo, t) for _, lo, t in split]
    else:
        mains, pays = list(blobs), [None] * len(blobs)
    arrays, lens = unpack_concat(mains)
    if lens.shape[0] != 2 * len(names):
        raise ValueError("a record block holds other fields than its space says")
    ends = np.cumsum(lens, axis=1)
    starts = ends - lens
    for k in range(len(names)):            # lengths of field k, then its cells
        n = lens[2 * k]
        run = np.concatenate(([0], np.cumsum(arrays[2 * k])))
        if k and not np.array_equal(n, lens[0]):
            raise ValueError("a record block's fields hold different numbers of pairs")
        if (arrays[2 * k] < 0).any() or not np.array_equal(
                run[ends[2 * k]] - run[starts[2 * k]], lens[2 * k + 1]):
            raise ValueError("a record block's lengths do not add up to its cells")
    s, e = starts.T.tolist(), ends.T.tolist()
    return [RecordBlock([arrays[j][s[b][j]:e[b][j]] for j in range(len(arrays))], names, pays[b])
            for b in range(len(mains))]


def decode_record_block(blob: Blob, fields: Sequence[str]) -> RecordBlock:
    if "pay" in fields:
        main, local, table = _split(blob)
        pay = (local, table)
    else:
        main, pay = blob, None
    return RecordBlock(PackedArrays(main), [f for f in fields if f != "pay"], pay)
