"""StrategyReader: reads one stored (operator, strategy) for the query executor.

Key lookups (the per-cell key index of One encodings, the R-tree of Many
encodings), record fetches and full scans, over the typed metadata of
:mod:`subzero.storage.metadata`.  Decoded blocks are cached per reader.

In a checksummed store (format 3) every value is verified before it is
decoded, a key-index block the metadata lists but LMDB does not return is
damage (not "no such cells"), and each R-tree file is checked against its
recorded size and CRC-32 before libspatialindex opens it — once per reader, so
a warm reader pays nothing.  Older stores are read unchecked.  A reader reads
for one run (its source's ``run_uid``): in a run with a uid only lineage bound
to it (format 5, its checksums seeded with the uid), in a run without one only
unbound lineage; anything else is damage that names the other run.

A reader reads from anything shaped like a :class:`LineageSource`: a run's
:class:`~subzero.storage.lineage.LineageStore`, or one shard file
(:class:`~subzero.storage.shards.ShardStore`).  It names that interface, not
the store, so the store can build its readers without a circle of imports.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import lmdb
import numpy as np

from subzero.errors import ChecksumMismatch, CorruptLineage
from subzero.model.cells import (
    csr_take,
    lengths_to_offsets,
    rows_hitting,
    run_starts,
    sorted_positions,
    sorted_unique,
    stable_order,
    unique,
    unique_ids,
    unpack,
)
from subzero.model.cellset import CellSet
from subzero.model.strategy import Strategy
from subzero.storage.codec import Blob, unpack_arrays
from subzero.storage.encodings import (
    REC_BITS,
    REC_PAIRS,
    RecordBlock,
    Records,
    decode_key_blocks,
    decode_record_blocks,
    merge_payload_tables,
)
from subzero.storage.integrity import seed, seed_in, unseal
from subzero.storage.metadata import (
    META,
    RTREE_FILES,
    SpaceMeta,
    StrategyMeta,
    covered_key,
    db_name,
    decode_block_set,
    key_index_key,
    record_key,
    rtree_seed,
    seed_name,
    stored_encoding,
)

#: A decoded key-index block: (cells, pair ids per cell, pair ids)
KeyBlock = tuple[np.ndarray, np.ndarray, np.ndarray]

__all__ = ["RTREE_FILES", "LineageSource", "ReadCursor", "ReadEnv", "ReadTxn", "StrategyReader",
           "row_runs"]

# rtree (libspatialindex, which it finds through importlib.metadata: some 30 ms) is
# imported by the first R-tree a query opens, not by every trace's start-up
if TYPE_CHECKING:
    from rtree import index as rindex



# -- what a reader reads from -----------------------------------------------------------
class ReadCursor(Protocol):
    """A cursor over a sub-database's keys in order (LMDB's, or a shard's)."""

    def __enter__(self) -> ReadCursor: ...

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> bool | None: ...

    def set_range(self, key: bytes) -> bool:
        """Move to the first key at or after ``key``; False past the end."""
        ...

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]: ...


class ReadTxn(Protocol):
    """A read transaction on one sub-database: values by key, and a cursor."""

    def __enter__(self) -> ReadTxn: ...

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> bool | None: ...

    def get(self, key: bytes) -> bytes | None: ...

    def cursor(self) -> ReadCursor: ...


class ReadEnv(Protocol):
    """An environment read transactions are begun on (``lmdb.Environment``'s shape)."""

    def begin(self, db: Any = None, buffers: bool = False) -> ReadTxn:
        """A read transaction on sub-database ``db`` (a handle from
        :meth:`LineageSource.database`)."""
        ...


class LineageSource(Protocol):
    """What a :class:`StrategyReader` reads stored lineage from: a run's LMDB
    environment (:class:`~subzero.storage.lineage.LineageStore`) or one shard
    (:class:`~subzero.storage.shards.ShardStore`)."""

    @property
    def file(self) -> Path:
        """The file the values live in (named in errors)."""
        ...

    @property
    def path(self) -> Path:
        """The folder the store's files are in (a sharded record names shards in it)."""
        ...

    @property
    def env(self) -> ReadEnv:
        """Where read transactions are begun."""
        ...

    @property
    def run_uid(self) -> str | None:
        """The uid of the run read for (None: a run made before runs had uids)."""
        ...

    def database(self, name: bytes, create: bool = False) -> Any:
        """The handle of sub-database ``name`` for :meth:`ReadEnv.begin` (None when
        absent); a read-only source never creates one."""
        ...

    def rtree_path(self, op: str, strategy: Strategy, space: str) -> Path:
        """The base path of a space's R-tree files (named in errors)."""
        ...

    def rtree_file(self, op: str, strategy: Strategy, space: str, ext: str, size: int,
                   digest: int, start: int = 0) -> bytes:
        """One R-tree file's bytes, checked against its recorded size and CRC-32 seeded
        with ``start`` (:class:`~subzero.storage.integrity.ChecksumMismatch` when they
        differ)."""
        ...


class StrategyReader:
    """Reads one (operator, strategy): key lookups, record fetches, full scans.

    Any storage or decoding failure raises :class:`CorruptLineage`, which the
    executor answers by re-executing the operator.
    """

    def __init__(self, store: LineageSource, op: str, strategy: Strategy):
        self.store, self.op, self.strategy = store, op, strategy
        self.enc = stored_encoding(strategy)
        self._blocks: dict[bytes, RecordBlock] = {}
        self._key_index: dict[bytes, KeyBlock | None] = {}
        self._rtrees: dict[str, rindex.Index] = {}
        self._covered: np.ndarray | None = None
        self._key_sets: dict[str, np.ndarray] = {}
        #: The LMDB file the values live in (named in errors).
        self.file = store.file
        self._name = db_name(op, strategy)
        where = f"stored lineage of {op!r} ({strategy}) in {self.file}"
        try:
            self.db = store.database(self._name)
            if self.db is None:
                raise CorruptLineage(f"no stored lineage for operator {op!r} strategy {strategy}")
            with store.env.begin(db=self.db) as txn:
                raw = txn.get(META)
        except lmdb.Error as e:
            raise CorruptLineage(f"{where} is unreadable: {e}") from e
        if raw is None:
            raise CorruptLineage(f"{where} has no metadata (damaged)")
        #: What this sub-database holds (a frozen :class:`StrategyMeta`; any known format).
        self.meta: StrategyMeta = StrategyMeta.from_bytes(raw, where, self._name)
        if self.meta.strategy != strategy:
            raise CorruptLineage(f"{where} holds lineage of another strategy ({self.meta.strategy})")
        self.meta.check_bound(store.run_uid, f"stored lineage of operator {op!r} ({strategy}) "
                                             f"in {self.file}")
        # the seed of every value's checksum: bound to the run in format 5
        self._seed = seed(seed_name(self._name, self.meta.run), b"")
        self._spaces = {sp.name: sp for sp in self.meta.spaces}
        self._checked = self.meta.checksummed

    def clear_cache(self) -> None:
        """Forget decoded blocks (benchmarks use it to measure cold lookups)."""
        self._blocks.clear()
        self._key_index.clear()
        self._covered = None

    def _fail(self, e: Exception) -> CorruptLineage:
        return self._damaged(f"{type(e).__name__}: {e}")

    def _damaged(self, what: str, file: Path | None = None) -> CorruptLineage:
        """The error for damage found in this strategy's lineage (``file``: where, when
        not the LMDB file)."""
        return CorruptLineage(f"stored lineage of operator {self.op!r} ({self.strategy}) is "
                              f"damaged: {what} ({file or self.file})")

    def _get(self, txn: ReadTxn, key: bytes, what: str) -> Blob | None:
        """The body of the value at ``key`` (None if absent), checked in a checksummed store."""
        raw = txn.get(key)
        if raw is None or not self._checked:
            return raw
        try:
            return unseal(raw, seed_in(self._seed, key))
        except ChecksumMismatch as e:
            raise self._damaged(f"{what} fails its checksum ({e})") from e

    def has_space(self, space: str) -> bool:
        return space in self._spaces

    def reach(self, i: int) -> int | None:
        """The payload reach of input ``i`` the pairs were checked against when they
        were written (:mod:`subzero.model.reach`), or None (not checked)."""
        r = self.meta.reach
        return r[i] if r is not None and i < len(r) else None

    def spaces(self) -> list[str]:
        return list(self._spaces)

    def _space(self, space: str) -> SpaceMeta:
        info = self._spaces.get(space)
        if info is None:
            raise CorruptLineage(f"stored lineage of {self.op!r} ({self.strategy}) has no space {space!r}")
        return info

    def _record(self, txn: ReadTxn, space: str, blk: int) -> RecordBlock:
        return self._record_blocks(txn, space, [blk])[0]

    def _record_blocks(self, txn: ReadTxn, space: str, blocks: list[int]) -> list[RecordBlock]:
        """Record blocks ``blocks`` of ``space``; those not decoded before are decoded
        together (``decode_record_blocks``)."""
        keys = [record_key(space, b) for b in blocks]
        new = [(b, k) for b, k in zip(blocks, keys) if k not in self._blocks]
        if new:
            raws = []
            for b, k in new:
                raw = self._get(txn, k, f"record block {b} of space {space!r}")
                if raw is None:
                    raise self._damaged(f"record block {b} of space {space!r} is missing")
                raws.append(raw)
            for (_, k), rb in zip(new, decode_record_blocks(raws, self._space(space).fields)):
                self._blocks[k] = rb
        return [self._blocks[k] for k in keys]

    # -- lookups ---------------------------------------------------------------------
    def lookup(self, space: str, q: CellSet) -> np.ndarray:
        """Ids of the pairs whose key cells intersect the query cells ``q``."""
        info = self._spaces.get(space)
        if info is None or info.pairs == 0 or not q:   # nothing stored: no R-tree either
            return np.zeros(0, np.int64)
        ids = q.ids()
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                if self.enc.one:
                    return self._lookup_one(txn, space, ids)
                return self._lookup_many(txn, space, ids, q)
        except CorruptLineage:
            raise
        except Exception as e:  # lmdb, zstd, struct, rtree errors: damaged store
            raise self._fail(e) from e

    def _key_set(self, space: str) -> np.ndarray:
        """Which key-index blocks were written (checksummed stores), decoded once."""
        got = self._key_sets.get(space)
        if got is None:
            info = self._space(space)
            try:
                got = decode_block_set(info.key_index, info.n_key_blocks)
            except Exception as e:  # zlib, base64: the record passed its checksum, so rare
                raise self._damaged(f"the key-index block list of space {space!r} is "
                                    f"unreadable ({type(e).__name__})") from e
            self._key_sets[space] = got
        return got

    def _key_blocks(self, txn: ReadTxn, space: str, blocks: list[int]) -> list[KeyBlock]:
        """The key-index blocks ``blocks`` of ``space`` that exist, in order; those not
        decoded before are decoded together (``decode_key_blocks``)."""
        keys = [key_index_key(space, b) for b in blocks]
        raws, fresh = [], []
        for b, k in zip(blocks, keys):
            if k in self._key_index:          # read before (None: no such block)
                continue
            raw = self._get(txn, k, f"key-index block {b} of space {space!r}")
            if raw is None:
                if self._checked:
                    raise self._damaged(f"key-index block {b} of space {space!r} is missing")
                self._key_index[k] = None
            else:
                raws.append(raw)
                fresh.append(k)
        for k, dec in zip(fresh, decode_key_blocks(raws)):
            self._key_index[k] = dec
        return [d for d in (self._key_index[k] for k in keys) if d is not None]

    def _lookup_one(self, txn: ReadTxn, space: str, q: np.ndarray) -> np.ndarray:
        """Decode every touched key block, then one vectorized search over all of them
        (blocks are in key order, so their cells concatenate sorted)."""
        info = self._space(space)
        bits, n_pairs = info.key_bits, info.pairs
        blocks = sorted_unique(q >> bits)      # q is sorted
        if self._checked:      # blocks never written hold no cells: not even a read
            blocks = blocks[self._key_set(space)[blocks]]
        decs = self._key_blocks(txn, space, blocks.tolist())
        if not decs:
            return np.zeros(0, np.int64)
        if len(decs) == 1:       # one block: search it as decoded (work ~ the query, not the block)
            c, counts, p = decs[0]
            pos = np.minimum(np.searchsorted(c, q), len(c) - 1)
            return unique_ids(csr_take(p, lengths_to_offsets(counts), pos[c[pos] == q]), n_pairs)
        cells = np.concatenate([d[0] for d in decs])
        off = lengths_to_offsets(np.concatenate([d[1] for d in decs]))
        pos = np.searchsorted(cells, q)
        pos_c = np.minimum(pos, len(cells) - 1)
        hit = pos_c[cells[pos_c] == q]
        return unique_ids(csr_take(np.concatenate([d[2] for d in decs]), off, hit), n_pairs)

    def _rtree(self, space: str) -> rindex.Index:
        t = self._rtrees.get(space)
        if t is None:
            from rtree import index as rindex
            path = self.store.rtree_path(self.op, self.strategy, space)
            props = rindex.Property()
            props.dimension = max(2, len(self._space(space).key_shape))
            if self._checked:
                t = _open_private(self._verified_rtree(space, path), props)
            elif not Path(str(path) + ".idx").exists():
                raise self._damaged("its R-tree index is missing", Path(str(path) + ".idx"))
            else:
                t = rindex.Index(str(path), properties=props)
            self._rtrees[space] = t
        return t

    def _verified_rtree(self, space: str, path: Path) -> dict[str, bytes]:
        """The R-tree files' bytes, checked against their recorded sizes and checksums
        before the native library sees them: a damaged R-tree can crash it or drop pairs."""
        files = dict((ext, (size, c)) for ext, size, c in self._space(space).files)
        out = {}
        for ext in RTREE_FILES:
            f = Path(f"{path}.{ext}")
            if ext not in files:
                raise self._damaged(f"its metadata records no checksum of R-tree file {f.name}", f)
            try:
                out[ext] = self.store.rtree_file(self.op, self.strategy, space, ext, *files[ext],
                                                 rtree_seed(self._name, self.meta.run, space, ext))
            except ChecksumMismatch as e:
                raise self._damaged(f"R-tree file {f.name}: {e}", f) from e
        return out

    def _lookup_many(self, txn: ReadTxn, space: str, q: np.ndarray, cells: CellSet) -> np.ndarray:
        shape = self._space(space).key_shape
        mins, maxs = _runs_to_boxes(q, shape)
        ids, _counts = self._rtree(space).intersection_v(mins, maxs)
        cand = unique(np.asarray(ids, dtype=np.int64))
        if cand.size == 0:
            return cand
        recs = self._records(txn, space, cand, ["key"])
        keys, off = recs["key"]
        return cand[rows_hitting(keys, off, cells)]

    # -- records ----------------------------------------------------------------------
    def records(self, space: str, pids: np.ndarray, fields: list[str]) -> Records:
        """Fields of the given pairs: name -> (cells, offsets); ``"pay"`` ->
        (pay_ids per pair, payload table)."""
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                return self._records(txn, space, np.asarray(pids, np.int64), fields)
        except CorruptLineage:
            raise
        except Exception as e:
            raise self._fail(e) from e

    def _records(self, txn: ReadTxn, space: str, pids: np.ndarray, fields: list[str]) -> Records:
        """Gather fields of the given pairs: decode each touched block once, then one
        vectorized gather per field over the blocks laid end to end."""
        pids = np.asarray(pids, np.int64)
        blocks, local = np.divmod(pids, REC_PAIRS)
        if blocks.size and (blocks.size == 1 or bool(np.all(blocks[1:] >= blocks[:-1]))):
            # sorted pair ids (what lookups return): blocks and their inverse in one pass
            first = run_starts(blocks)
            ublocks, inv = blocks[first], np.cumsum(first) - 1
        else:
            ublocks, inv = np.unique(blocks, return_inverse=True)
        decoded = self._record_blocks(txn, space, ublocks.tolist())
        if len(decoded) == 1 and "pay" not in fields:     # the common small query: no concatenation
            rb = decoded[0]
            return {f: (csr_take(*rb.field(f), local),
                        lengths_to_offsets(rb.lengths(f)[local])) for f in fields}
        base = lengths_to_offsets(np.array([rb.n for rb in decoded], np.int64))
        rows = base[inv] + local               # row of each pid in the concatenation
        out: Records = {}
        for f in fields:
            if f == "pay":
                continue
            if decoded:
                cells = np.concatenate([rb.cells(f) for rb in decoded])
                lens = np.concatenate([rb.lengths(f) for rb in decoded])
            else:
                cells, lens = np.zeros(0, np.int64), np.zeros(0, np.int64)
            off = lengths_to_offsets(lens)
            out[f] = (csr_take(cells, off, rows), lengths_to_offsets(lens[rows]))
        if "pay" in fields:
            # only the payloads of the requested pairs get a table entry (deduplicated)
            out["pay"] = merge_payload_tables([self._pays(rb) for rb in decoded], rows)
        return out

    def _pays(self, rb: RecordBlock) -> tuple[np.ndarray, list[bytes]]:
        """A block's (payload id per pair, payload table); a block of a space asked for
        payloads that has none is damaged lineage, which re-execution answers."""
        pay_local, table = rb.pay_local, rb.table
        if pay_local is None or table is None:
            raise CorruptLineage(f"stored lineage of {self.op!r} ({self.strategy}) has a record "
                                 f"block without payloads")
        return pay_local, table

    def all_pairs(self, space: str) -> np.ndarray:
        info = self._spaces.get(space)
        if info is None or not info.blocks:
            return np.zeros(0, np.int64)
        blocks = np.array(sorted(info.blocks), np.int64)
        # pair ids that exist: each block holds up to REC_PAIRS; trim by decoding lengths
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                decoded = self._record_blocks(txn, space, blocks.tolist())
            ids = [np.arange(b << REC_BITS, (b << REC_BITS) + rb.n)
                   for b, rb in zip(blocks.tolist(), decoded)]
        except CorruptLineage:
            raise
        except Exception as e:
            raise self._fail(e) from e
        return np.concatenate(ids)

    def scan_keys(self, space: str, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Key cells of the given pairs (sorted pids); inverts the key index for
        One encodings that do not keep key cells in their records."""
        if len(pids) == 0:
            return np.zeros(0, np.int64), np.zeros(1, np.int64)
        if "key" in self._space(space).fields:
            return self.records(space, pids, ["key"])["key"]
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                prefix = space.encode() + b"\x00K"
                raws, seen = [], []
                with txn.cursor() as cur:
                    if cur.set_range(prefix):
                        for key, value in cur:
                            if not key.startswith(prefix):
                                break
                            blk = int.from_bytes(key[len(prefix):], "big")
                            raw: Blob = value
                            if self._checked:
                                try:
                                    raw = unseal(value, seed_in(self._seed, key))
                                except ChecksumMismatch as e:
                                    raise self._damaged(f"key-index block {blk} of space {space!r} "
                                                        f"fails its checksum ({e})") from e
                            raws.append(raw)
                            seen.append(blk)
            if self._checked:      # a scan must meet every block written, and only those
                want = np.flatnonzero(self._key_set(space))
                if not np.array_equal(np.asarray(seen, np.int64), want):
                    raise self._damaged(f"the key-index blocks of space {space!r} found by a "
                                        f"scan ({len(seen)}) are not those written ({len(want)})")
            decs = decode_key_blocks(raws)    # together: a scan decodes every block
        except CorruptLineage:
            raise
        except Exception as e:
            raise self._fail(e) from e
        if not decs:
            return np.zeros(0, np.int64), np.zeros(len(pids) + 1, np.int64)
        k = np.repeat(np.concatenate([c for c, _, _ in decs]), np.concatenate([n for _, n, _ in decs]))
        p = np.concatenate([p for _, _, p in decs])
        pos, keep = sorted_positions(pids, p)
        if keep is not None:              # pairs not asked for
            k, pos = k[keep], pos[keep]
        order = stable_order(pos, len(pids))
        return k[order], lengths_to_offsets(np.bincount(pos, minlength=len(pids)))

    def covered(self, near: np.ndarray | None = None) -> np.ndarray:
        """Output cells covered by payload pairs (COMP strategies); read once, all of
        them (``near`` is for sharded sources)."""
        if self._covered is None:
            self._covered = self._read_covered()
        return self._covered

    def _read_covered(self) -> np.ndarray:
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                parts = []
                for j in range(self.meta.covered_chunks):
                    raw = self._get(txn, covered_key(j), f"covered-cell chunk {j}")
                    if raw is None:
                        raise self._damaged(f"covered-cell chunk {j} is missing")
                    parts.append(unpack_arrays(raw)[0])
        except CorruptLineage:
            raise
        except Exception as e:
            raise self._fail(e) from e
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _open_private(files: dict[str, bytes], props: rindex.Property) -> rindex.Index:
    """An R-tree opened on a private copy of verified bytes.  libspatialindex opens its
    files for writing and rewrites a page when it closes them (with leftover buffer
    bytes), so opening the store's own files would change them — and their checksums —
    and fail on a read-only store; the copy also means the bytes checked are the bytes
    used.  The copy is unlinked once open (the library keeps its descriptors)."""
    from rtree import index as rindex
    folder = tempfile.mkdtemp(prefix="subzero-rtree-")
    base = os.path.join(folder, "t")
    try:
        for ext, data in files.items():
            with open(f"{base}.{ext}", "wb") as f:
                f.write(data)
        return rindex.Index(base, properties=props)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def row_runs(ids: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted packed cells as boxes: each run of consecutive cells along the last
    axis is one box (its lowest and highest cell)."""
    last = shape[-1]
    brk = np.flatnonzero((np.diff(ids) != 1) | ((ids[1:] % last) == 0)) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [len(ids)])) - 1
    return unpack(ids[starts], shape), unpack(ids[ends], shape)


def _runs_to_boxes(q: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """R-tree probe boxes for sorted packed cells (:func:`row_runs`), so a query region
    costs one probe per row; a 1-D key gets a second, zero coordinate."""
    lo, hi = (c.astype(np.float64) for c in row_runs(q, shape))
    if lo.shape[1] == 1:
        lo = np.hstack([lo, np.zeros_like(lo)])
        hi = np.hstack([hi, np.zeros_like(hi)])
    return lo, hi
