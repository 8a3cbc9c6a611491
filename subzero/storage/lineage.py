"""LineageStore: one LMDB environment per run, a sub-database per
(operator, strategy), and R-tree files beside it for the *Many encodings.

Region lineage is a cache (it can be rebuilt by re-running the operator), so
the environment is written without fsync; everything a strategy stores is
put in one write transaction, so a reader sees all of it or none of it.

The writer lives here; what a strategy's sub-database holds (its metadata
record and key layout, versioned) is :mod:`subzero.storage.metadata`, and
reading it is :class:`~subzero.storage.reader.StrategyReader`.  Every value is
written sealed with its checksum and every R-tree file's size and checksum go
into the metadata record, in the same transaction
(:mod:`subzero.storage.integrity`).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import lmdb
import numpy as np
from rtree import index as rindex

from subzero.capture.buffer import Pairs
from subzero.model.cells import unpack
from subzero.model.modes import Mode
from subzero.model.strategy import Strategy
from subzero.storage.codec import pack_arrays
from subzero.storage.encodings import (
    KEY_BITS,
    REC_PAIRS,
    Space,
    key_blocks,
    merge_key_blocks,
    record_blocks,
    record_fields,
    spaces_for,
)
from subzero.storage.integrity import ChecksumMismatch, file_digest, lmdb_extent, seal, seed, unseal
from subzero.storage.metadata import (
    FORMAT_VERSION,
    META,
    CorruptLineage,
    NewerLineageFormat,
    SpaceMeta,
    StrategyMeta,
    covered_key,
    key_index_key,
    record_key,
    stored_encoding,
)
from subzero.storage.reader import RTREE_FILES, StrategyReader
from subzero.tuning import COVERED_CHUNK, LMDB_MAP_SIZE

__all__ = ["META", "CorruptLineage", "LineageStore", "NewerLineageFormat", "StrategyReader",
           "WriteStats"]

#: Format of new (operator, strategy) sub-databases.  Tests set it to 2 to write a
#: store as SubZero did before checksums; appends keep a store's own format.
WRITE_FORMAT = FORMAT_VERSION


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:60] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]


@dataclass
class WriteStats:
    bytes: int
    seconds: float
    pairs: int


# LMDB allows one open environment per path per process, so handles are
# shared (reference-counted) between LineageStore objects of the same process.
_ENVS: dict[str, list] = {}


def _open_env(path: Path, readonly: bool):
    key = str(path.resolve())
    entry = _ENVS.get(key)
    if entry is not None:
        if entry[2] and not readonly:
            raise CorruptLineage(f"lineage store {path} is open read-only in this process")
        entry[1] += 1
        return entry[0], entry[3]
    # a reader maps only the file (a writer reserves address space to grow into):
    # thousands of runs can then be open in one process
    size = LMDB_MAP_SIZE
    if readonly:
        data = path / "data.mdb"
        size = data.stat().st_size
        extent = lmdb_extent(data)
        if extent is not None and extent > size:
            raise CorruptLineage(f"lineage file {data} is damaged: truncated to {size} bytes, "
                                 f"its header says {extent}")
        size = max(1 << 20, size)
    env = lmdb.open(str(path), map_size=size, max_dbs=4096, subdir=True, readonly=readonly,
                    lock=not readonly, sync=False, metasync=False, readahead=False)
    dbs: dict[bytes, object] = {}
    _ENVS[key] = [env, 1, readonly, dbs]
    return env, dbs


def _close_env(path: Path) -> None:
    key = str(path.resolve())
    entry = _ENVS.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _ENVS[key]
        entry[0].close()


class LineageStore:
    """All stored lineage of one run."""

    def __init__(self, path: str | os.PathLike, readonly: bool = False):
        self.path = Path(path)
        if readonly and not (self.path / "data.mdb").exists():
            raise CorruptLineage(f"lineage store {self.path} is missing")
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
        try:
            self.env, self._dbs = _open_env(self.path, readonly)
        except lmdb.Error as e:
            raise CorruptLineage(f"cannot open lineage store {self.path}: {e}") from None
        self.readonly = readonly
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _close_env(self.path)

    def sync(self) -> None:
        """Flush what is written to disk (writes are not synced one by one)."""
        self.env.sync(True)

    def drop_operator(self, op: str, strategies) -> None:
        """Remove whatever an operator's strategies wrote (a resumed run redoes an
        operator its lost driver may have left half-written)."""
        for s in strategies:
            self.drop(op, s)

    # -- names --------------------------------------------------------------------
    @staticmethod
    def db_name(op: str, strategy: Strategy) -> bytes:
        return f"{op}|{strategy}".encode()

    def rtree_path(self, op: str, strategy: Strategy, space: str) -> Path:
        return self.path / "rtree" / f"{_safe(op + '|' + str(strategy))}.{space}"

    def _db(self, name: bytes, create: bool):
        db = self._dbs.get(name)
        if db is None:
            try:
                db = self.env.open_db(name, create=create)
            except lmdb.NotFoundError:
                return None
            except lmdb.Error as e:
                raise CorruptLineage(f"lineage database {name.decode()} is unreadable: {e}") from None
            self._dbs[name] = db
        return db

    def has(self, op: str, strategy: Strategy) -> bool:
        try:
            with self.env.begin() as txn:
                return txn.get(self.db_name(op, strategy)) is not None
        except lmdb.Error:
            return False

    # -- writing ----------------------------------------------------------------------
    def write(self, op: str, strategy: Strategy, pairs: Pairs, out_shape, in_shapes,
              map_p_pairs=None) -> WriteStats:
        """Encode and store ``pairs`` under (op, strategy); appends if already present.

        Raises :class:`NewerLineageFormat` (a one-line StoreError) rather than append
        to lineage a newer SubZero wrote."""
        t0 = time.perf_counter()
        enc = stored_encoding(strategy)
        spaces = spaces_for(strategy, pairs, out_shape, in_shapes, map_p_pairs)
        name = self.db_name(op, strategy)
        db = self._db(name, create=True)
        with self.env.begin(write=True, db=db) as txn:
            raw = txn.get(META)
            if raw:
                meta = StrategyMeta.from_bytes(raw, f"stored lineage of {op!r} ({strategy})", name)
                # an old store stays unchecked (its blocks have no checksums); format 1
                # becomes 2, which only makes its key-block size explicit
                meta = meta.in_format(max(meta.version, 2))
            else:
                meta = StrategyMeta.new(strategy, out_shape, in_shapes).in_format(WRITE_FORMAT)
            put = _Sealer(name) if meta.checksummed else _plain
            for sp in spaces:
                info = meta.space(sp.name) or SpaceMeta.new(
                    sp.name, sp.key_shape, record_fields(sp, enc), sp.value_shapes, KEY_BITS)
                meta = meta.with_space(self._write_space(txn, op, strategy, sp, info, put))
            if strategy.mode is Mode.COMP:
                cov = np.unique(pairs.out)
                for a in range(0, len(cov), COVERED_CHUNK):
                    key = covered_key(meta.covered_chunks)
                    txn.put(key, put(key, pack_arrays(cov[a:a + COVERED_CHUNK])))
                    meta = meta.with_covered_chunk()
            txn.put(META, meta.to_bytes(name))
        return WriteStats(self.bytes_of(op, strategy), time.perf_counter() - t0, pairs.n)

    def _write_space(self, txn, op: str, strategy: Strategy, sp: Space, info: SpaceMeta,
                     put) -> SpaceMeta:
        """Append one space's pairs after those already stored; returns its new metadata.
        ``put(key, body)`` gives the value to store (sealed, or as is in old formats)."""
        if sp.n == 0:
            return info
        first = -(-info.pairs // REC_PAIRS) * REC_PAIRS
        enc = stored_encoding(strategy)
        puts = []
        blocks = record_blocks(sp, enc, first)
        for blk, blob in blocks.items():
            key = record_key(sp.name, blk)
            puts.append((key, put(key, blob)))
        kblocks: list[int] = []
        if enc.one:
            for blk, blob in key_blocks(sp.key, sp.key_off, first, info.key_bits).items():
                key = key_index_key(sp.name, blk)
                old = txn.get(key)
                if old is not None:
                    blob = merge_key_blocks(put.body(key, old), blob)
                puts.append((key, put(key, blob)))
                kblocks.append(blk)
        puts.sort()
        with txn.cursor() as cur:
            cur.putmulti(puts)
        info = info.appended(first, sp.n, blocks, kblocks if put.checked else ())
        if not enc.one:
            files = self._write_rtree(op, strategy, sp, first)
            if put.checked:
                info = info.with_files(files)
        return info

    def _write_rtree(self, op, strategy, sp: Space, first: int) -> list[tuple[str, int, int]]:
        """Build (or extend) the space's R-tree; returns its files' (suffix, size, CRC-32)."""
        coords = unpack(sp.key, sp.key_shape)
        starts = sp.key_off[:-1]
        mins = np.minimum.reduceat(coords, starts, axis=0).astype(np.float64)
        maxs = np.maximum.reduceat(coords, starts, axis=0).astype(np.float64)
        if coords.shape[1] == 1:
            mins = np.hstack([mins, np.zeros_like(mins)])
            maxs = np.hstack([maxs, np.zeros_like(maxs)])
        ids = np.arange(first, first + sp.n, dtype=np.int64)
        path = self.rtree_path(op, strategy, sp.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        props = rindex.Property()
        props.dimension = mins.shape[1]
        if Path(str(path) + ".idx").exists():
            idx = rindex.Index(str(path), properties=props)
            for j, lo, hi in zip(ids.tolist(), mins, maxs):
                idx.insert(j, tuple(lo) + tuple(hi))
        else:
            idx = rindex.Index(str(path), (ids, mins, maxs), properties=props)
        idx.close()
        return [(ext, *file_digest(str(path) + "." + ext)) for ext in RTREE_FILES]

    # -- sizes ------------------------------------------------------------------------
    def bytes_of(self, op: str, strategy: Strategy) -> int:
        """Bytes on disk: LMDB pages of the sub-database plus R-tree files."""
        db = self._db(self.db_name(op, strategy), create=False)
        if db is None:
            return 0
        with self.env.begin() as txn:
            st = txn.stat(db)
        total = (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
        rdir = self.path / "rtree"
        if rdir.is_dir():
            prefix = _safe(op + "|" + str(strategy)) + "."
            total += sum(f.stat().st_size for f in rdir.iterdir() if f.name.startswith(prefix))
        return int(total)

    def drop(self, op: str, strategy: Strategy) -> None:
        """Delete one (operator, strategy): its sub-database and R-tree files (a run's
        disk budget undoes a write that overflowed it this way)."""
        name = self.db_name(op, strategy)
        db = self._db(name, create=False)
        if db is not None:
            with self.env.begin(write=True) as txn:
                txn.drop(db, delete=True)
            self._dbs.pop(name, None)
        rdir = self.path / "rtree"
        if rdir.is_dir():
            prefix = _safe(op + "|" + str(strategy)) + "."
            for f in rdir.iterdir():
                if f.name.startswith(prefix):
                    f.unlink()

    def reader(self, op: str, strategy: Strategy) -> StrategyReader:
        return StrategyReader(self, op, strategy)


class _Sealer:
    """Seals values of one sub-database (format 3 on)."""

    checked = True

    def __init__(self, db: bytes):
        self.db = db

    def __call__(self, key: bytes, body: bytes) -> bytes:
        return seal(body, seed(self.db, key))

    def body(self, key: bytes, value: bytes) -> bytes:
        """The body of a value this sub-database holds (checked: a merge must not carry
        damage into a freshly sealed block)."""
        try:
            return bytes(unseal(value, seed(self.db, key)))
        except ChecksumMismatch:
            raise CorruptLineage(f"stored lineage {self.db.decode()!r} has a damaged key-index "
                                 f"block; it cannot be appended to") from None


class _Plain:
    """Values of an old-format sub-database: stored as they are."""

    checked = False

    def __call__(self, key: bytes, body: bytes) -> bytes:
        return body

    def body(self, key: bytes, value: bytes) -> bytes:
        return value


_plain = _Plain()


