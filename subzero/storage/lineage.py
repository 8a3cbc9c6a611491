"""LineageStore: one LMDB environment per run, a sub-database per
(operator, strategy), and R-tree files beside it for the *Many encodings.

Region lineage is a cache (it can be rebuilt by re-running the operator), so
the environment is written without fsync; everything a strategy stores is
put in one write transaction, so a reader sees all of it or none of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import lmdb
import numpy as np
from rtree import index as rindex

from subzero.capture.buffer import Pairs
from subzero.errors import SubZeroError
from subzero.model.cells import (
    csr_take,
    lengths_to_offsets,
    rows_hitting,
    run_starts,
    sorted_unique,
    unique_ids,
    unpack,
)
from subzero.model.modes import Mode
from subzero.model.strategy import Strategy
from subzero.storage.codec import pack_arrays, unpack_arrays
from subzero.storage.encodings import (
    KEY_BITS,
    LEGACY_KEY_BITS,
    REC_BITS,
    REC_PAIRS,
    RecordBlock,
    Space,
    decode_key_block,
    decode_record_block,
    key_blocks,
    merge_key_blocks,
    record_blocks,
    record_fields,
    spaces_for,
)
from subzero.tuning import COVERED_CHUNK, LMDB_MAP_SIZE

META = b"\x00meta"


class CorruptLineage(SubZeroError):
    """Stored lineage of one operator/strategy is missing or unreadable."""


def _be(n: int) -> bytes:
    return struct.pack(">Q", n)


def _k(space: str, kind: bytes, n: int) -> bytes:
    return space.encode() + b"\x00" + kind + _be(n)


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
        env, count, ro, dbs = entry
        if ro and not readonly:
            raise CorruptLineage(f"lineage store {path} is open read-only in this process")
        entry[1] += 1
        return env, dbs
    # a reader maps only the file (a writer reserves address space to grow into):
    # thousands of runs can then be open in one process
    size = LMDB_MAP_SIZE
    if readonly:
        size = max(1 << 20, (path / "data.mdb").stat().st_size)
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
        """Encode and store ``pairs`` under (op, strategy); appends if already present."""
        import time
        t0 = time.perf_counter()
        enc = strategy.encoding
        spaces = spaces_for(strategy, pairs, out_shape, in_shapes, map_p_pairs)
        db = self._db(self.db_name(op, strategy), create=True)
        with self.env.begin(write=True, db=db) as txn:
            raw = txn.get(META)
            meta = json.loads(raw) if raw else {
                "strategy": str(strategy), "out_shape": list(out_shape),
                "in_shapes": [list(s) for s in in_shapes], "spaces": {}, "covered_chunks": 0}
            for sp in spaces:
                self._write_space(txn, op, strategy, enc, sp, meta)
            if strategy.mode is Mode.COMP:
                cov = np.unique(pairs.out)
                for a in range(0, len(cov), COVERED_CHUNK):
                    txn.put(_k("c", b"C", meta["covered_chunks"]), pack_arrays(cov[a:a + COVERED_CHUNK]))
                    meta["covered_chunks"] += 1
            txn.put(META, json.dumps(meta).encode())
        return WriteStats(self.bytes_of(op, strategy), time.perf_counter() - t0, pairs.n)

    def _write_space(self, txn, op, strategy, enc, sp: Space, meta) -> None:
        info = meta["spaces"].get(sp.name)
        if info is None:
            info = meta["spaces"][sp.name] = {
                "next": 0, "key_shape": list(sp.key_shape), "fields": record_fields(sp, enc),
                "value_shapes": {k: list(v) for k, v in sp.value_shapes.items()}, "blocks": [],
                "key_bits": KEY_BITS}
        first = -(-info["next"] // REC_PAIRS) * REC_PAIRS
        if sp.n == 0:
            return
        puts = []
        for blk, blob in record_blocks(sp, enc, first).items():
            puts.append((_k(sp.name, b"R", blk), blob))
            info["blocks"].append(blk)
        if enc.one:
            bits = info.get("key_bits", LEGACY_KEY_BITS)
            for blk, blob in key_blocks(sp.key, sp.key_off, first, bits).items():
                key = _k(sp.name, b"K", blk)
                old = txn.get(key)
                puts.append((key, merge_key_blocks(old, blob) if old is not None else blob))
        else:
            self._write_rtree(op, strategy, sp, first)
        puts.sort()
        with txn.cursor() as cur:
            cur.putmulti(puts)
        info["next"] = first + sp.n

    def _write_rtree(self, op, strategy, sp: Space, first: int) -> None:
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

    def reader(self, op: str, strategy: Strategy) -> "StrategyReader":
        return StrategyReader(self, op, strategy)


class StrategyReader:
    """Reads one (operator, strategy): key lookups, record fetches, full scans.

    Any storage or decoding failure raises :class:`CorruptLineage`, which the
    executor answers by re-executing the operator.
    """

    def __init__(self, store: LineageStore, op: str, strategy: Strategy):
        self.store, self.op, self.strategy = store, op, strategy
        self.enc = strategy.encoding
        self._cache: dict[bytes, object] = {}
        self._rtrees: dict[str, object] = {}
        try:
            self.db = store._db(store.db_name(op, strategy), create=False)
            if self.db is None:
                raise CorruptLineage(f"no stored lineage for operator {op!r} strategy {strategy}")
            with store.env.begin(db=self.db) as txn:
                raw = txn.get(META)
            if raw is None:
                raise CorruptLineage(f"stored lineage of {op!r} ({strategy}) has no metadata")
            self.meta = json.loads(raw)
        except (lmdb.Error, ValueError) as e:
            raise CorruptLineage(f"stored lineage of {op!r} ({strategy}) is unreadable: {e}") from None

    def clear_cache(self) -> None:
        """Forget decoded blocks (benchmarks use it to measure cold lookups)."""
        self._cache.clear()
        self._covered = None

    def _fail(self, e: Exception):
        return CorruptLineage(f"stored lineage of operator {self.op!r} ({self.strategy}) "
                              f"is damaged: {type(e).__name__}: {e}")

    def has_space(self, space: str) -> bool:
        return space in self.meta["spaces"]

    def spaces(self) -> list[str]:
        return list(self.meta["spaces"])

    def _record(self, txn, space: str, blk: int) -> RecordBlock:
        key = _k(space, b"R", blk)
        rb = self._cache.get(key)
        if rb is None:
            raw = txn.get(key)
            if raw is None:
                raise CorruptLineage(f"stored lineage of {self.op!r} ({self.strategy}) misses a record block")
            rb = decode_record_block(raw, self.meta["spaces"][space]["fields"])
            self._cache[key] = rb
        return rb

    # -- lookups ---------------------------------------------------------------------
    def lookup(self, space: str, q: np.ndarray, q_flat: np.ndarray) -> np.ndarray:
        """Ids of the pairs whose key cells intersect the query.

        ``q``: sorted unique packed query cells; ``q_flat``: the query as a flat
        bitmap of the key array (for exact checks).
        """
        info = self.meta["spaces"].get(space)
        if info is None or info["next"] == 0 or q.size == 0:   # nothing stored: no R-tree either
            return np.zeros(0, np.int64)
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                if self.enc.one:
                    return self._lookup_one(txn, space, q)
                return self._lookup_many(txn, space, q, q_flat)
        except CorruptLineage:
            raise
        except Exception as e:  # lmdb, zstd, struct, rtree errors: damaged store
            raise self._fail(e) from None

    def _decoded_key_block(self, txn, space, blk):
        key = _k(space, b"K", blk)
        dec = self._cache.get(key)
        if dec is None:
            raw = txn.get(key)
            dec = decode_key_block(raw) if raw is not None else None
            self._cache[key] = dec
        return dec

    def _lookup_one(self, txn, space, q):
        """Decode every touched key block, then one vectorized search over all of them
        (blocks are in key order, so their cells concatenate sorted)."""
        info = self.meta["spaces"][space]
        bits, n_pairs = info.get("key_bits", LEGACY_KEY_BITS), int(info["next"])
        blocks = sorted_unique(q >> bits).tolist()      # q is sorted
        decs = [d for d in (self._decoded_key_block(txn, space, b) for b in blocks) if d is not None]
        if not decs:
            return np.zeros(0, np.int64)
        if len(decs) == 1:       # one block: search it as decoded (work ~ the query, not the block)
            c, off, p = decs[0]
            pos = np.minimum(np.searchsorted(c, q), len(c) - 1)
            return unique_ids(csr_take(p, off, pos[c[pos] == q]), n_pairs)
        cells = np.concatenate([d[0] for d in decs])
        counts = [np.diff(d[1]) for d in decs]
        pids = [d[2] for d in decs]
        off = lengths_to_offsets(np.concatenate(counts))
        pos = np.searchsorted(cells, q)
        pos_c = np.minimum(pos, len(cells) - 1)
        hit = pos_c[cells[pos_c] == q]
        return unique_ids(csr_take(np.concatenate(pids), off, hit), n_pairs)

    def _rtree(self, space: str):
        t = self._rtrees.get(space)
        if t is None:
            path = self.store.rtree_path(self.op, self.strategy, space)
            if not Path(str(path) + ".idx").exists():
                raise CorruptLineage(f"R-tree index of {self.op!r} ({self.strategy}) is missing")
            props = rindex.Property()
            props.dimension = max(2, len(self.meta["spaces"][space]["key_shape"]))
            t = self._rtrees[space] = rindex.Index(str(path), properties=props)
        return t

    def _lookup_many(self, txn, space, q, q_flat):
        shape = tuple(self.meta["spaces"][space]["key_shape"])
        mins, maxs = _runs_to_boxes(q, shape)
        ids, _counts = self._rtree(space).intersection_v(mins, maxs)
        cand = np.unique(np.asarray(ids, dtype=np.int64))
        if cand.size == 0:
            return cand
        recs = self._records(txn, space, cand, ["key"])
        cells, off = recs["key"]
        return cand[rows_hitting(cells, off, q_flat)]

    # -- records ----------------------------------------------------------------------
    def records(self, space: str, pids: np.ndarray, fields: list[str]) -> dict:
        """Fields of the given pairs: name -> (cells, offsets); ``"pay"`` ->
        (pay_ids per pair, payload table)."""
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                return self._records(txn, space, np.asarray(pids, np.int64), fields)
        except CorruptLineage:
            raise
        except Exception as e:
            raise self._fail(e) from None

    def _records(self, txn, space, pids, fields):
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
        decoded = [self._record(txn, space, int(b)) for b in ublocks.tolist()]
        if len(decoded) == 1 and "pay" not in fields:     # the common small query: no concatenation
            rb = decoded[0]
            return {f: (csr_take(*rb.field(f), local),
                        lengths_to_offsets(np.diff(rb.field(f)[1])[local])) for f in fields}
        base = lengths_to_offsets(np.array([rb.n for rb in decoded], np.int64))
        rows = base[inv] + local               # row of each pid in the concatenation
        out = {}
        for f in fields:
            if f == "pay":
                continue
            if decoded:
                cells = np.concatenate([rb.field(f)[0] for rb in decoded])
                lens = np.concatenate([np.diff(rb.field(f)[1]) for rb in decoded])
            else:
                cells, lens = np.zeros(0, np.int64), np.zeros(0, np.int64)
            off = lengths_to_offsets(lens)
            out[f] = (csr_take(cells, off, rows), lengths_to_offsets(lens[rows]))
        if "pay" in fields:
            # only the payloads of the requested pairs get a table entry (deduplicated)
            tbase = lengths_to_offsets(np.array([len(rb.table) for rb in decoded], np.int64))
            glob = np.concatenate([rb.pay_local + tbase[j] for j, rb in enumerate(decoded)]) \
                if decoded else np.zeros(0, np.int64)
            used, inv_ids = np.unique(glob[rows], return_inverse=True)
            flat_tables = [p for rb in decoded for p in rb.table]
            tindex: dict[bytes, int] = {}
            remap = np.array([tindex.setdefault(flat_tables[u], len(tindex)) for u in used.tolist()],
                             np.int64)
            out["pay"] = (remap[inv_ids].reshape(-1), list(tindex))   # dict order is id order
        return out

    def all_pairs(self, space: str) -> np.ndarray:
        info = self.meta["spaces"].get(space)
        if not info or not info["blocks"]:
            return np.zeros(0, np.int64)
        blocks = np.array(sorted(info["blocks"]), np.int64)
        # pair ids that exist: each block holds up to REC_PAIRS; trim by decoding lengths
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                ids = [np.arange(b << REC_BITS, (b << REC_BITS) + self._record(txn, space, int(b)).n)
                       for b in blocks]
        except CorruptLineage:
            raise
        except Exception as e:
            raise self._fail(e) from None
        return np.concatenate(ids)

    def scan_keys(self, space: str, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Key cells of the given pairs (sorted pids); inverts the key index for
        One encodings that do not keep key cells in their records."""
        if len(pids) == 0:
            return np.zeros(0, np.int64), np.zeros(1, np.int64)
        if "key" in self.meta["spaces"][space]["fields"]:
            return self.records(space, pids, ["key"])["key"]
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                prefix = space.encode() + b"\x00K"
                ks, ps = [], []
                with txn.cursor() as cur:
                    if cur.set_range(prefix):
                        for key, raw in cur:
                            if not key.startswith(prefix):
                                break
                            cells, off, p = decode_key_block(raw)
                            ks.append(np.repeat(cells, np.diff(off)))
                            ps.append(p)
        except Exception as e:
            raise self._fail(e) from None
        if not ks:
            return np.zeros(0, np.int64), np.zeros(len(pids) + 1, np.int64)
        k, p = np.concatenate(ks), np.concatenate(ps)
        pos = np.searchsorted(pids, p)
        pos_c = np.minimum(pos, len(pids) - 1)
        keep = (pos < len(pids)) & (pids[pos_c] == p)
        k, pos = k[keep], pos[keep]
        order = np.argsort(pos, kind="stable")
        return k[order], lengths_to_offsets(np.bincount(pos, minlength=len(pids)))

    def covered(self) -> np.ndarray:
        """Output cells covered by payload pairs (COMP strategies); read once."""
        if getattr(self, "_covered", None) is None:
            self._covered = self._read_covered()
        return self._covered

    def _read_covered(self) -> np.ndarray:
        try:
            with self.store.env.begin(db=self.db, buffers=False) as txn:
                parts = []
                for j in range(self.meta.get("covered_chunks", 0)):
                    raw = txn.get(_k("c", b"C", j))
                    if raw is None:
                        raise CorruptLineage(f"stored lineage of {self.op!r} misses covered cells")
                    parts.append(unpack_arrays(raw)[0])
        except CorruptLineage:
            raise
        except Exception as e:
            raise self._fail(e) from None
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _runs_to_boxes(q: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """Turn sorted packed cells into boxes: runs of consecutive cells along the
    last axis become one box, so a query region costs one R-tree probe per row."""
    last = shape[-1]
    brk = np.flatnonzero((np.diff(q) != 1) | ((q[1:] % last) == 0)) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [len(q)])) - 1
    lo = unpack(q[starts], shape).astype(np.float64)
    hi = unpack(q[ends], shape).astype(np.float64)
    if lo.shape[1] == 1:
        lo = np.hstack([lo, np.zeros_like(lo)])
        hi = np.hstack([hi, np.zeros_like(hi)])
    return lo, hi
