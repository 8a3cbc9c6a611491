"""LineageStore: one LMDB environment per run, a sub-database per
(operator, strategy), and R-tree files beside it for the *Many encodings.

Region lineage is a cache (it can be rebuilt by re-running the operator), so
the environment is written without fsync; everything a strategy stores is
put in one write transaction, so a reader sees all of it or none of it.

The writer lives here; what a strategy's sub-database holds (its metadata
record and key layout, versioned) is :mod:`subzero.storage.metadata`, and
reading it is :class:`~subzero.storage.reader.StrategyReader` (over any
:class:`~subzero.storage.reader.LineageSource`, which this store is).  Every value is
written sealed with its checksum and every R-tree file's size and checksum go
into the metadata record, in the same transaction
(:mod:`subzero.storage.integrity`).

A store is opened for one run (``run_uid``, its catalog row's uid): a run with a
uid writes its lineage bound to it (format 5, :mod:`subzero.storage.metadata`)
and reads only lineage bound to it; a run without one (made before runs had
uids) writes and reads unbound lineage as before.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import lmdb
import numpy as np

from subzero.capture.buffer import Pairs
from subzero.errors import ChecksumMismatch, CorruptLineage, NewerLineageFormat
from subzero.model.cells import unpack
from subzero.model.modes import Mode
from subzero.model.strategy import Encoding, Strategy
from subzero.scratch import scratch
from subzero.storage import metadata
from subzero.storage.codec import pack_arrays
from subzero.storage.encodings import (
    KEY_BITS,
    REC_PAIRS,
    MapPPairs,
    Space,
    key_blocks,
    merge_key_blocks,
    record_blocks,
    record_fields,
    spaces_for,
)
from subzero.storage.integrity import file_digest, read_verified, seal, seed, seed_in, unseal
from subzero.storage.mapped import open_mapped
from subzero.storage.metadata import (
    META,
    RTREE_FILES,
    ShardMeta,
    SpaceMeta,
    StrategyMeta,
    covered_key,
    db_name,
    key_index_key,
    record_key,
    rtree_seed,
    seed_name,
    shard_seed,
    stored_encoding,
)
from subzero.storage.reader import StrategyReader
from subzero.storage.shards import SUFFIX as SHARD_SUFFIX
from subzero.storage.shards import ShardedReader, box_of, pack_shard, rtree_key
from subzero.tuning import COVERED_CHUNK, LMDB_MAP_SIZE, LMDB_MAX_DBS

__all__ = ["META", "CorruptLineage", "LineageStore", "NewerLineageFormat", "ShardWrite",
           "ShardedReader", "StoredCopy", "StrategyReader", "WriteStats", "commit_shard_files", "write_shard"]

#: The folder (in a run's lineage folder) that sharded strategies' files go to.
SHARDS_DIR = "shards"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:60] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]


@dataclass
class WriteStats:
    bytes: int
    seconds: float
    pairs: int


@dataclass
class StoredCopy:
    """One stored strategy of a run, read whole and checked, for another run of the same
    operator on the same inputs to store as its own (:meth:`LineageStore.write_copy`):
    its metadata record and every value's body (key order), without their checksums.
    ``record``: what the run that stored it recorded of it (pairs, space sizes, write
    seconds), for the new run's record."""

    meta: StrategyMeta
    entries: list[tuple[bytes, bytes]]
    record: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass
class _OpenEnv:
    """One LMDB environment open in this process, and the handles of its sub-databases."""

    env: Any                 # lmdb.Environment (lmdb ships no types)
    refs: int
    readonly: bool
    dbs: dict[bytes, Any]


# LMDB allows one open environment per path per process, so handles are
# shared (reference-counted) between LineageStore objects of the same process.
_ENVS: dict[str, _OpenEnv] = {}


def _open_env(path: Path, readonly: bool) -> tuple[Any, dict[bytes, Any]]:
    key = str(path.resolve())
    entry = _ENVS.get(key)
    if entry is not None:
        if entry.readonly and not readonly:
            raise CorruptLineage(f"lineage store {path} is open read-only in this process")
        entry.refs += 1
        return entry.env, entry.dbs
    # a reader maps only the file (a writer reserves address space to grow into):
    # thousands of runs can then be open in one process; its reads are guarded against
    # the file being truncated under them (storage.mapped)
    env: Any
    if readonly:
        env = open_mapped(path / "data.mdb", max_dbs=LMDB_MAX_DBS)
    else:
        env = lmdb.open(str(path), map_size=LMDB_MAP_SIZE, max_dbs=LMDB_MAX_DBS, subdir=True,
                        lock=True, sync=False, metasync=False, readahead=False)
    dbs: dict[bytes, Any] = {}
    _ENVS[key] = _OpenEnv(env, 1, readonly, dbs)
    return env, dbs


def _close_env(path: Path) -> None:
    key = str(path.resolve())
    entry = _ENVS.get(key)
    if entry is None:
        return
    entry.refs -= 1
    if entry.refs == 0:
        del _ENVS[key]
        entry.env.close()


class LineageStore:
    """All stored lineage of one run (``run_uid``: the run's uid, None for a run made
    before runs had one; see the module's docstring)."""

    def __init__(self, path: str | os.PathLike[str], readonly: bool = False,
                 run_uid: str | None = None):
        self.path = Path(path)
        #: the uid of the run whose lineage this is (None: an unbound run)
        self.run_uid = run_uid
        if readonly and not (self.path / "data.mdb").exists():
            raise CorruptLineage(f"lineage store {self.path} is missing")
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
        try:
            self.env, self._dbs = _open_env(self.path, readonly)
        except lmdb.Error as e:
            raise CorruptLineage(f"cannot open lineage store {self.path}: {e}") from e
        self.readonly = readonly
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _close_env(self.path)

    def sync(self) -> None:
        """Flush what is written to disk (writes are not synced one by one)."""
        self.env.sync(True)

    def drop_operator(self, op: str, strategies: Iterable[Strategy]) -> None:
        """Remove whatever an operator's strategies wrote (a resumed run redoes an
        operator its lost driver may have left half-written)."""
        for s in strategies:
            self.drop(op, s)

    # -- names --------------------------------------------------------------------
    db_name = staticmethod(db_name)

    def rtree_path(self, op: str, strategy: Strategy, space: str) -> Path:
        return self.path / "rtree" / f"{_safe(op + '|' + str(strategy))}.{space}"

    def database(self, name: bytes, create: bool = False) -> Any:
        """The LMDB handle of sub-database ``name`` (see :meth:`db_name`), opened once per
        process; None when it does not exist and ``create`` is not set.  A reader
        begins its transactions on it; tests use it to read and damage raw values."""
        db = self._dbs.get(name)
        if db is None:
            try:
                db = self.env.open_db(name, create=create)
            except lmdb.NotFoundError:
                return None
            except lmdb.Error as e:
                raise CorruptLineage(f"lineage database {name.decode()} is unreadable: {e}") from e
            self._dbs[name] = db
        return db

    def has(self, op: str, strategy: Strategy) -> bool:
        try:
            with self.env.begin() as txn:
                return txn.get(self.db_name(op, strategy)) is not None
        except lmdb.Error:
            return False

    # -- writing ----------------------------------------------------------------------
    def write(self, op: str, strategy: Strategy, pairs: Pairs, out_shape: Sequence[int],
              in_shapes: Sequence[Sequence[int]], map_p_pairs: MapPPairs | None = None,
              reach: Sequence[int | None] | None = None,
              prepared: Prepared | None = None) -> WriteStats:
        """Encode and store ``pairs`` under (op, strategy); appends if already present.
        ``reach``: the payload reach the pairs were checked against, if they were.
        ``prepared``: the pairs encoded ahead (:func:`prepare_strategy`); the seconds
        returned then count that encoding's as well.

        Raises :class:`NewerLineageFormat` (a one-line StoreError) rather than append
        to lineage a newer SubZero wrote."""
        t0 = time.perf_counter()
        name = self.db_name(op, strategy)
        db = self.database(name, create=True)
        with self.env.begin(write=True, db=db) as txn:
            spaces = encode_strategy(txn, name, strategy, pairs, out_shape, in_shapes,
                                     map_p_pairs, lambda space: self.rtree_path(op, strategy, space),
                                     f"stored lineage of {op!r} ({strategy})", self.run_uid,
                                     reach, prepared)
        # no spaces back: the blocks encoded ahead were written, their encoding counted too
        ahead = prepared.seconds if prepared is not None and not spaces else 0.0
        return WriteStats(self.bytes_of(op, strategy), time.perf_counter() - t0 + ahead, pairs.n)

    def stored_copy(self, op: str, strategy: Strategy) -> StoredCopy | None:
        """What (op, strategy) holds, read whole with every value checked, for another run
        to store (:meth:`write_copy`); None where it cannot be copied so: nothing stored,
        a record of a run without a uid or of an old format, sharded or with R-tree files
        (their checksums cover files, not values), or a value or the record that fails
        its check (the caller then reads the pairs back, or runs the operator again)."""
        if strategy.many:
            return None
        try:
            meta = self.meta(op, strategy)
        except CorruptLineage:
            return None
        if meta is None or meta.sharded or meta.run is None or not meta.checksummed \
                or meta.strategy != strategy:
            return None
        name = self.db_name(op, strategy)
        at = seed(seed_name(name, meta.run), b"")
        entries = []
        try:
            with self.env.begin(db=self.database(name)) as txn:
                for key, value in txn.cursor():
                    key = bytes(key)
                    if key != META:
                        entries.append((key, bytes(unseal(value, seed_in(at, key)))))
        except (lmdb.Error, ChecksumMismatch):
            return None
        return StoredCopy(meta, entries)

    def write_copy(self, op: str, strategy: Strategy, copy: StoredCopy, pairs: int) -> WriteStats:
        """Store ``copy`` (another run's lineage of the same operator on the same inputs:
        :meth:`stored_copy`) as this run's (op, strategy): every value sealed again, and
        the record, bound to this run.  What encoding the pairs again would store, bytes
        for bytes, without decoding and encoding them: a run made from another keeps
        the strategies they share this way (``pairs``: how many the copy holds)."""
        if self.run_uid is None:
            raise CorruptLineage(f"stored lineage of {op!r} ({strategy}) can be copied only "
                                 f"into a run with a uid")
        t0 = time.perf_counter()
        name = self.db_name(op, strategy)
        db = self.database(name, create=True)
        sealer = _Sealer(seed_name(name, self.run_uid), name)
        with self.env.begin(write=True, db=db) as txn:
            if txn.get(META) is not None:
                raise CorruptLineage(f"stored lineage of {op!r} ({strategy}) is already written")
            with txn.cursor() as cur:      # in key order: appended, as encoding does
                cur.putmulti([(k, sealer(k, b)) for k, b in copy.entries], append=True)
            txn.put(META, copy.meta.bound(self.run_uid).to_bytes(name))
        return WriteStats(self.bytes_of(op, strategy), time.perf_counter() - t0, pairs)

    def commit_shards(self, op: str, strategy: Strategy, out_shape: Sequence[int],
                      in_shapes: Sequence[Sequence[int]], shards: list[ShardMeta],
                      reach: Sequence[int | None] | None = None) -> int:
        """Record (op, strategy) as sharded: the committed ``shards`` (files already in
        place under this store's folder), in one write transaction; returns the bytes
        it holds.  ``reach``: the payload reach every shard's pairs were checked against."""
        name = self.db_name(op, strategy)
        db = self.database(name, create=True)
        meta = StrategyMeta.sharded_index(strategy, out_shape, in_shapes, shards, self.run_uid,
                                          reach)
        with self.env.begin(write=True, db=db) as txn:
            if txn.get(META) is not None:
                raise CorruptLineage(f"stored lineage of {op!r} ({strategy}) is already written")
            txn.put(META, meta.to_bytes(name))
        return self.bytes_of(op, strategy)

    def shard_folder(self, op: str, strategy: Strategy) -> Path:
        """Where the shards of (op, strategy) are written."""
        return shard_folder(self.path, op, strategy)

    def meta(self, op: str, strategy: Strategy) -> StrategyMeta | None:
        """The metadata record of (op, strategy), or None when nothing is stored; one
        that is not this run's (:meth:`StrategyMeta.check_bound`) is CorruptLineage."""
        name = self.db_name(op, strategy)
        db = self.database(name, create=False)
        if db is None:
            return None
        where = f"stored lineage of {op!r} ({strategy}) in {self.file}"
        try:
            with self.env.begin(db=db) as txn:
                raw = txn.get(META)
        except lmdb.Error as e:
            raise CorruptLineage(f"{where} is unreadable: {e}") from e
        if raw is None:
            return None
        meta = StrategyMeta.from_bytes(raw, where, name)
        meta.check_bound(self.run_uid, f"stored lineage of operator {op!r} ({strategy}) in "
                                       f"{self.file}")
        return meta

    def rtree_file(self, op: str, strategy: Strategy, space: str, ext: str, size: int,
                   digest: int, start: int = 0) -> bytes:
        """One R-tree file's bytes, checked against its recorded size and CRC-32
        (seeded with ``start``)."""
        return read_verified(f"{self.rtree_path(op, strategy, space)}.{ext}", size, digest, start)

    @property
    def file(self) -> Path:
        """The LMDB data file (named in errors)."""
        return self.path / "data.mdb"

    # -- sizes ------------------------------------------------------------------------
    def bytes_of(self, op: str, strategy: Strategy) -> int:
        """Bytes on disk: LMDB pages of the sub-database plus R-tree files."""
        db = self.database(self.db_name(op, strategy), create=False)
        if db is None:
            return 0
        with self.env.begin() as txn:
            st = txn.stat(db)
        total = (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
        meta = self.meta(op, strategy)
        if meta is not None and meta.sharded:
            total += sum(sh.size for sh in meta.shards)
        rdir = self.path / "rtree"
        if rdir.is_dir():
            prefix = _safe(op + "|" + str(strategy)) + "."
            total += sum(f.stat().st_size for f in rdir.iterdir() if f.name.startswith(prefix))
        return int(total)

    def drop(self, op: str, strategy: Strategy) -> None:
        """Delete one (operator, strategy): its sub-database and R-tree files (a run's
        disk budget undoes a write that overflowed it this way)."""
        name = self.db_name(op, strategy)
        db = self.database(name, create=False)
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
        shutil.rmtree(self.shard_folder(op, strategy), ignore_errors=True)

    def reader(self, op: str, strategy: Strategy) -> StrategyReader | ShardedReader:
        """What reads (op, strategy): its blocks here, or the shards its record lists."""
        meta = self.meta(op, strategy)
        if meta is not None and meta.sharded:
            if meta.strategy != strategy:
                raise CorruptLineage(f"stored lineage of {op!r} ({strategy}) holds lineage of "
                                     f"another strategy ({meta.strategy})")
            return ShardedReader(self, op, strategy, meta)
        return StrategyReader(self, op, strategy)



class WriteCursor(Protocol):
    """What :func:`encode_strategy` writes blocks through (LMDB's cursor's shape)."""

    def __enter__(self) -> WriteCursor: ...

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> bool | None: ...

    def putmulti(self, items: Iterable[tuple[bytes, bytes]]) -> Any: ...


class WriteTxn(Protocol):
    """A write transaction on one sub-database: an LMDB one, or :class:`_MemoryTxn`
    (a shard's entries, in memory)."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> Any: ...

    def cursor(self) -> WriteCursor: ...


@dataclass
class PreparedSpace:
    """One space of a strategy encoded ahead of its write (:func:`prepare_strategy`): its
    sizes and shapes, the fields its record blocks hold, and the blocks themselves
    (record and key index, unsealed), as :func:`encode_strategy` would make them for
    a sub-database that holds nothing yet."""
    name: str
    n: int
    key_shape: tuple[int, ...]
    value_shapes: dict[str, tuple[int, ...]]
    fields: list[str]
    blocks: dict[int, bytes]
    kblocks: dict[int, bytes]
    #: the base path of its R-tree files, built ahead (Many encodings), to be moved into
    #: place by the write; None for One encodings
    rtree: str | None = None


@dataclass
class Prepared:
    """A strategy's lineage encoded ahead of its write, and the seconds that took (what
    writing it cost, for the run's record and the cost model)."""
    strategy: Strategy
    pairs: int
    #: the shapes the pairs' cells were packed and unpacked in (its output's, its inputs')
    shapes: tuple[tuple[int, ...], ...]
    spaces: list[PreparedSpace]
    seconds: float
    #: per input, what ``map_p`` expanded the payloads to (a payload strategy keyed
    #: forward: the counts ``engines.lineage.map_p_counting`` makes, for its statistics)
    expanded: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)


def prepare_strategy(strategy: Strategy, pairs: Pairs, out_shape: Sequence[int],
                     in_shapes: Sequence[Sequence[int]], map_p_pairs: MapPPairs | None = None,
                     rtree_dir: Path | None = None) -> Prepared | None:
    """``pairs`` of one strategy encoded for a sub-database that holds nothing yet, to be
    written by :func:`encode_strategy` (``prepared``) elsewhere or later: the work of a
    write but its sealing and puts, in plain data another process can hand over, and a
    Many encoding's R-tree files built in ``rtree_dir`` (which the write moves into
    place).  None for Comp (its covered cells are written with it), and for Many without
    an ``rtree_dir``: those are encoded where they are written."""
    enc = stored_encoding(strategy)
    if strategy.mode is Mode.COMP or (not enc.one and rtree_dir is None):
        return None
    t0 = time.perf_counter()
    out = []
    for sp in spaces_for(strategy, pairs, out_shape, in_shapes, map_p_pairs):
        blocks, kblocks = _encode_space(sp, enc, 0, KEY_BITS)
        rtree = None
        if not enc.one and sp.n:
            assert rtree_dir is not None
            rtree = rtree_dir / sp.name
            _write_rtree(rtree, sp, 0)
        out.append(PreparedSpace(sp.name, int(sp.n), tuple(sp.key_shape), dict(sp.value_shapes),
                                 record_fields(sp, enc), blocks, kblocks,
                                 None if rtree is None else str(rtree)))
    return Prepared(strategy, int(pairs.n), _shapes(out_shape, in_shapes), out,
                    time.perf_counter() - t0)


def _shapes(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]
            ) -> tuple[tuple[int, ...], ...]:
    return (tuple(int(n) for n in out_shape), *(tuple(int(n) for n in s) for s in in_shapes))


def encode_strategy(txn: WriteTxn, name: bytes, strategy: Strategy, pairs: Pairs,
                    out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]],
                    map_p_pairs: MapPPairs | None, rtree_base: Callable[[str], Path],
                    where: str, run_uid: str | None = None,
                    reach: Sequence[int | None] | None = None,
                    prepared: Prepared | None = None) -> list[Space]:
    """Encode ``pairs`` of one strategy into a sub-database (``txn``: an LMDB write
    transaction opened on it, or anything with ``get``/``put``/``cursor().putmulti``),
    after what it already holds; ``rtree_base(space)`` is the base path of a space's
    R-tree files.  New sub-databases of a run with a uid (``run_uid``) are written
    bound to it (format 5), of an unbound run in :data:`metadata.WRITE_FORMAT
    <subzero.storage.metadata.WRITE_FORMAT>`.  ``reach``: the payload reach every pair was
    checked against (:func:`subzero.model.reach.check`), recorded for forward steps; None
    when they were not checked.  ``prepared``: these pairs encoded already
    (:func:`prepare_strategy`), written as they are when the sub-database holds nothing
    yet and they are this strategy's, of as many pairs, in these shapes (else the pairs
    are encoded here).  Returns the spaces written (their key cells;
    none of them for prepared ones)."""
    enc = stored_encoding(strategy)
    raw = txn.get(META)
    if prepared is not None and not raw and prepared.strategy == strategy \
            and prepared.pairs == pairs.n and prepared.shapes == _shapes(out_shape, in_shapes):
        return _write_prepared(txn, name, strategy, prepared, out_shape, in_shapes, run_uid,
                               reach, rtree_base)
    spaces = spaces_for(strategy, pairs, out_shape, in_shapes, map_p_pairs)
    if raw:
        meta = StrategyMeta.from_bytes(raw, where, name)
        meta.check_bound(run_uid, where)        # never append to another run's lineage
        if meta.sharded:
            raise CorruptLineage(f"{where} is sharded; it cannot be appended to")
        # an old store stays unchecked (its blocks have no checksums); format 1
        # becomes 2, which only makes its key-block size explicit
        meta = meta.in_format(max(meta.version, 2)).with_pairs_checked(reach, first=False)
    else:
        meta = StrategyMeta.new(strategy, out_shape, in_shapes)
        # WRITE_FORMAT read at each write: the one switch tests turn to write an older format
        meta = meta.in_format(metadata.WRITE_FORMAT) if run_uid is None else meta.bound(run_uid)
        meta = meta.with_pairs_checked(reach, first=True)
    put: _Sealer | _Plain = _Sealer(seed_name(name, meta.run), name) if meta.checksummed else _plain
    run = meta.run

    def rtree_start(space: str, ext: str) -> int:
        return rtree_seed(name, run, space, ext)
    for sp in spaces:
        info = meta.space(sp.name) or SpaceMeta.new(
            sp.name, sp.key_shape, record_fields(sp, enc), sp.value_shapes, KEY_BITS)
        meta = meta.with_space(_write_space(txn, strategy, sp, info, put, rtree_base, rtree_start))
    if strategy.mode is Mode.COMP:
        cov = np.unique(pairs.out)
        for a in range(0, len(cov), COVERED_CHUNK):
            key = covered_key(meta.covered_chunks)
            txn.put(key, put(key, pack_arrays(cov[a:a + COVERED_CHUNK])))
            meta = meta.with_covered_chunk()
    txn.put(META, meta.to_bytes(name))
    return spaces


def _write_space(txn: WriteTxn, strategy: Strategy, sp: Space, info: SpaceMeta,
                 put: _Sealer | _Plain, rtree_base: Callable[[str], Path],
                 rtree_start: Callable[[str, str], int]) -> SpaceMeta:
    """Append one space's pairs after those already stored; returns its new metadata.
    ``put(key, body)`` gives the value to store (sealed, or as is in old formats);
    ``rtree_start(space, ext)`` the CRC-32 seed of an R-tree file."""
    if sp.n == 0:
        return info
    first = -(-info.pairs // REC_PAIRS) * REC_PAIRS
    enc = stored_encoding(strategy)
    blocks, kblocks = _encode_space(sp, enc, first, info.key_bits)
    info = _put_space(txn, sp.name, sp.n, first, blocks, kblocks, info, put)
    if not enc.one:
        _write_rtree(rtree_base(sp.name), sp, first)
        files = _rtree_files(rtree_base(sp.name), lambda ext: rtree_start(sp.name, ext))
        if put.checked:
            info = info.with_files(files)
    return info


def _encode_space(sp: Space, enc: Encoding, first: int, key_bits: int
                  ) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """One space's record blocks and (One encodings) key index blocks, its pairs
    numbered from ``first``: block id -> bytes, unsealed."""
    blocks = record_blocks(sp, enc, first)
    kblocks = key_blocks(sp.key, sp.key_off, first, key_bits) if enc.one else {}
    return blocks, kblocks


def _put_space(txn: WriteTxn, space: str, n: int, first: int, blocks: dict[int, bytes],
               kblocks: dict[int, bytes], info: SpaceMeta, put: _Sealer | _Plain) -> SpaceMeta:
    """Seal and store one space's blocks (a key block the sub-database holds already
    merged with the new one); returns its metadata with them appended."""
    puts = []
    for blk, blob in blocks.items():
        key = record_key(space, blk)
        puts.append((key, put(key, blob)))
    for blk, blob in kblocks.items():
        key = key_index_key(space, blk)
        old = txn.get(key)
        if old is not None:
            blob = merge_key_blocks(put.body(key, old), blob)
        puts.append((key, put(key, blob)))
    puts.sort()
    with txn.cursor() as cur:
        cur.putmulti(puts)
    return info.appended(first, n, blocks, list(kblocks) if put.checked else ())


def _write_prepared(txn: WriteTxn, name: bytes, strategy: Strategy, prepared: Prepared,
                    out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]],
                    run_uid: str | None, reach: Sequence[int | None] | None,
                    rtree_base: Callable[[str], Path]) -> list[Space]:
    """:func:`encode_strategy` of a sub-database that holds nothing yet, from its blocks
    encoded ahead: the same metadata, seals and puts, and a Many encoding's R-tree files
    moved to their place (``rtree_base(space)``) and their checksums taken there."""
    meta = StrategyMeta.new(strategy, out_shape, in_shapes)
    meta = meta.in_format(metadata.WRITE_FORMAT) if run_uid is None else meta.bound(run_uid)
    meta = meta.with_pairs_checked(reach, first=True)
    put: _Sealer | _Plain = _Sealer(seed_name(name, meta.run), name) if meta.checksummed else _plain
    run = meta.run
    for ps in prepared.spaces:
        info = SpaceMeta.new(ps.name, ps.key_shape, ps.fields, ps.value_shapes, KEY_BITS)
        if ps.n:
            info = _put_space(txn, ps.name, ps.n, 0, ps.blocks, ps.kblocks, info, put)
        if ps.rtree is not None:
            dest = rtree_base(ps.name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            for ext in RTREE_FILES:
                shutil.move(f"{ps.rtree}.{ext}", f"{dest}.{ext}")
            files = _rtree_files(dest, functools.partial(rtree_seed, name, run, ps.name))
            if put.checked:
                info = info.with_files(files)
        meta = meta.with_space(info)
    txn.put(META, meta.to_bytes(name))
    return []


def _rtree_files(path: Path, start: Callable[[str], int]) -> list[tuple[str, int, int]]:
    """The R-tree files at ``path``: (suffix, size, CRC-32 seeded with ``start(suffix)``)."""
    return [(ext, *file_digest(str(path) + "." + ext, start(ext))) for ext in RTREE_FILES]


def _write_rtree(path: Path, sp: Space, first: int) -> None:
    """Build (or extend) the space's R-tree at ``path``."""
    coords = unpack(sp.key, sp.key_shape)
    starts = sp.key_off[:-1]
    mins = np.minimum.reduceat(coords, starts, axis=0).astype(np.float64)
    maxs = np.maximum.reduceat(coords, starts, axis=0).astype(np.float64)
    if coords.shape[1] == 1:
        mins = np.hstack([mins, np.zeros_like(mins)])
        maxs = np.hstack([maxs, np.zeros_like(maxs)])
    ids = np.arange(first, first + sp.n, dtype=np.int64)
    from rtree import index as rindex  # imported by the first R-tree written (see reader)
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


class _Sealer:
    """Seals values of one sub-database (format 3 on; ``db``: what the checksums are
    seeded with, :func:`~subzero.storage.metadata.seed_name`; ``name``: its name)."""

    checked = True

    def __init__(self, db: bytes, name: bytes):
        self.db, self.name = db, name

    def __call__(self, key: bytes, body: bytes) -> bytes:
        return seal(body, seed(self.db, key))

    def body(self, key: bytes, value: bytes) -> bytes:
        """The body of a value this sub-database holds (checked: a merge must not carry
        damage into a freshly sealed block)."""
        try:
            return bytes(unseal(value, seed(self.db, key)))
        except ChecksumMismatch as err:
            raise CorruptLineage(f"stored lineage {self.name.decode()!r} has a damaged key-index "
                                 f"block; it cannot be appended to") from err


class _Plain:
    """Values of an old-format sub-database: stored as they are."""

    checked = False

    def __call__(self, key: bytes, body: bytes) -> bytes:
        return body

    def body(self, key: bytes, value: bytes) -> bytes:
        return value


_plain = _Plain()




# -- shards (written by Spark tasks) ---------------------------------------------------------
class _MemoryTxn:
    """A sub-database written in memory: what :func:`encode_strategy` fills for a shard."""

    def __init__(self) -> None:
        self.items: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.items.get(bytes(key))

    def put(self, key: bytes, value: bytes) -> None:
        self.items[bytes(key)] = bytes(value)

    def cursor(self) -> _MemoryTxn:
        return self

    def __enter__(self) -> _MemoryTxn:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def putmulti(self, puts: Iterable[tuple[bytes, bytes]]) -> None:
        for k, v in puts:
            self.put(k, v)


@dataclass
class ShardWrite:
    """One shard a task wrote (under its attempt's name), for the driver to commit."""

    meta: ShardMeta
    seconds: float
    pairs: int


#: A shard as its task attempt names it: ``<tile>.a<attempt>.szs``; the driver commits
#: it as ``<tile>.szs``
_ATTEMPT = re.compile(r"(.+)\.a\d+" + re.escape(SHARD_SUFFIX))


def shard_folder(lineage_dir: str | os.PathLike[str], op: str, strategy: Strategy) -> Path:
    """Where the shards of (op, strategy) go, in a run's lineage folder."""
    return Path(lineage_dir) / SHARDS_DIR / _safe(op + "|" + str(strategy))


def write_shard(lineage_dir: str | os.PathLike[str], stem: str, attempt: int, op: str,
                strategy: Strategy, pairs: Pairs, out_shape: Sequence[int],
                in_shapes: Sequence[Sequence[int]], map_p_pairs: MapPPairs | None = None,
                run_uid: str | None = None,
                reach: Sequence[int | None] | None = None) -> ShardWrite | None:
    """Encode one task's ``pairs`` of (op, strategy) into a shard file named for the
    tile (``stem``) and the task ``attempt``, written whole then renamed into place;
    None when there is nothing to store.  A run with a uid (``run_uid``) writes it
    bound to the run and the tile (format 5)."""
    if pairs.n == 0:
        return None
    t0 = time.perf_counter()
    name = db_name(op, strategy)
    txn = _MemoryTxn()
    with scratch("shard", swept=False) as held:    # one per tile: swept by the next sweep
        tmp = held.path
        spaces = encode_strategy(txn, name, strategy, pairs, out_shape, in_shapes, map_p_pairs,
                                 lambda space: Path(tmp) / space, f"a shard of {op!r} ({strategy})",
                                 run_uid, reach)
        if not stored_encoding(strategy).one:
            for sp in spaces:
                for ext in RTREE_FILES if sp.n else ():
                    txn.put(rtree_key(sp.name, ext), Path(tmp, f"{sp.name}.{ext}").read_bytes())
    boxes = tuple((sp.name, int(sp.n), box_of(sp.key, sp.key_shape)) for sp in spaces if sp.n)
    covered = box_of(pairs.out, out_shape) if strategy.mode is Mode.COMP and pairs.out.size else None
    body = pack_shard(txn.items)
    folder = shard_folder(lineage_dir, op, strategy)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{stem}.a{attempt}{SHARD_SUFFIX}"
    tmp_file = folder / f".{final.name}.{os.getpid()}.tmp"
    tmp_file.write_bytes(body)
    os.replace(tmp_file, final)
    rel = final.relative_to(Path(lineage_dir)).as_posix()
    crc = zlib.crc32(body, shard_seed(name, run_uid, stem))
    return ShardWrite(ShardMeta(rel, len(body), crc, boxes, covered),
                      time.perf_counter() - t0, pairs.n)


def commit_shard_files(lineage_dir: str | os.PathLike[str], op: str, strategy: Strategy,
                       written: list[ShardMeta]) -> list[ShardMeta]:
    """Give the shards of the attempts that succeeded their tiles' names, and remove
    every other file of (op, strategy): attempts that failed or lost a race."""
    root = Path(lineage_dir)
    out = []
    for sh in written:
        src = root / sh.file
        named = _ATTEMPT.fullmatch(src.name)
        if named is None:
            raise CorruptLineage(f"shard {src} is not named for a task attempt")
        dst = src.with_name(named.group(1) + SHARD_SUFFIX)
        os.replace(src, dst)
        out.append(dataclasses.replace(sh, file=dst.relative_to(root).as_posix()))
    keep = {root / sh.file for sh in out}
    folder = shard_folder(root, op, strategy)
    if folder.is_dir():
        for f in folder.iterdir():
            if f not in keep:
                f.unlink(missing_ok=True)
    return out


def sweep_shard_attempts(lineage_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove the shard files no record lists: attempts (``t<tile>.a<N>.szs``) and
    half-written files (``.<name>.tmp``) that a speculative or retried task wrote after
    its operator was committed.  A run calls it as it commits; returns what it removed."""
    root = Path(lineage_dir) / SHARDS_DIR
    gone = []
    if root.is_dir():
        for f in root.glob("*/*"):
            if f.name.startswith(".") or _ATTEMPT.fullmatch(f.name):
                f.unlink(missing_ok=True)
                gone.append(f)
    return gone

