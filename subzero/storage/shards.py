"""Sharded lineage: what Spark tasks write, and how a trace reads it.

A Spark tile task encodes its tile's lineage itself, one *shard* per stored
(operator, strategy): an ordinary format-3 sub-database (sealed record blocks,
key-index blocks, covered cells, and the R-tree files' bytes of Many
encodings) laid out as one immutable file.  The task writes it under a name
that carries its attempt id; the driver commits only the attempt whose
result it received, by renaming that file to the tile's name and listing it
in the strategy's format-4 record (:class:`~subzero.storage.metadata.ShardMeta`:
file, size, CRC-32, and the bounding box of the key cells of each space).
Retried and speculative attempts therefore neither duplicate nor lose
lineage, and the driver never holds a tile's pairs.

In a run with a uid, shards are bound to it like the run's own sub-databases
(lineage format 5): the sub-database inside is bound (its record names the
run, its checksums are seeded with the uid), and the shard file's CRC-32 in
the record is seeded with the uid and the tile's name, so a shard taken from
another run, or from another tile, fails its check like damage.

A trace reads through :class:`ShardedReader`, the same pair-source interface
as :class:`~subzero.storage.reader.StrategyReader`: it opens only the shards
whose key box meets the query's cells (each checked whole against its size
and CRC-32 first), answers with pair ids numbered shard after shard, and
delegates everything inside a shard to a ``StrategyReader`` over it.

File layout: ``MAGIC``, the number of entries (u32), each key's length (u32),
each value's length (u64), the keys, then the values; keys sorted.
"""

from __future__ import annotations

import bisect
import os
import stat
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from subzero.errors import ChecksumMismatch, CorruptLineage
from subzero.model.cells import csr_take, lengths_to_offsets, unpack
from subzero.model.cellset import CellSet
from subzero.storage.encodings import Records, concat_records
from subzero.storage.integrity import read_verified, verified
from subzero.storage.metadata import ShardMeta, StrategyMeta, db_name, shard_seed
from subzero.storage.reader import LineageSource, StrategyReader, row_runs

if TYPE_CHECKING:
    from subzero.model.strategy import Strategy

#: How a shard file starts.
MAGIC = b"SZSHARD1"
#: The file suffix of a shard.
SUFFIX = ".szs"
_COUNT = struct.Struct("<I")


def rtree_key(space: str, ext: str) -> bytes:
    """Key of one R-tree file's bytes inside a shard (Many encodings)."""
    return b"\x00rtree|" + space.encode() + b"|" + ext.encode()


# -- the file ------------------------------------------------------------------------
def pack_shard(items: dict[bytes, bytes]) -> bytes:
    """A shard file's bytes from its sub-database's entries."""
    keys = sorted(items)
    vals = [items[k] for k in keys]
    head = (MAGIC + _COUNT.pack(len(keys))
            + np.array([len(k) for k in keys], "<u4").tobytes()
            + np.array([len(v) for v in vals], "<u8").tobytes())
    return b"".join([head, *keys, *vals])


class ShardEnv:
    """A parsed shard file: the read-only view of a sub-database that
    :class:`~subzero.storage.reader.StrategyReader` reads an LMDB environment
    through (``begin``, ``get``, ``cursor`` with ``set_range``)."""

    def __init__(self, data: bytes, where: str):
        try:
            if data[:len(MAGIC)] != MAGIC:
                raise ValueError("not a SubZero shard file")
            at = len(MAGIC)
            (n,) = _COUNT.unpack_from(data, at)
            at += _COUNT.size
            klen = np.frombuffer(data, "<u4", n, at).astype(np.int64)
            at += 4 * n
            vlen = np.frombuffer(data, "<u8", n, at).astype(np.int64)
            at += 8 * n
            koff = at + lengths_to_offsets(klen)
            voff = int(koff[-1]) + lengths_to_offsets(vlen)
            if int(voff[-1]) != len(data):
                raise ValueError(f"{len(data)} bytes, its table says {int(voff[-1])}")
        except (ValueError, struct.error) as e:
            raise CorruptLineage(f"{where} is damaged: {e}") from e
        self._data = data
        self._keys = [data[int(a):int(b)] for a, b in zip(koff[:-1], koff[1:])]
        self._voff = voff
        self._index = {k: j for j, k in enumerate(self._keys)}

    def begin(self, db: object = None, buffers: bool = False) -> ShardEnv:
        """A read transaction: the file itself (it never changes)."""
        return self

    def __enter__(self) -> ShardEnv:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def _value(self, j: int) -> bytes:
        return self._data[int(self._voff[j]):int(self._voff[j + 1])]

    def get(self, key: bytes) -> bytes | None:
        j = self._index.get(bytes(key))
        return None if j is None else self._value(j)

    def cursor(self) -> _Cursor:
        return _Cursor(self)


class _Cursor:
    def __init__(self, env: ShardEnv):
        self.env, self.pos = env, len(env._keys)

    def __enter__(self) -> _Cursor:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def set_range(self, key: bytes) -> bool:
        self.pos = bisect.bisect_left(self.env._keys, bytes(key))
        return self.pos < len(self.env._keys)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        for j in range(self.pos, len(self.env._keys)):
            yield self.env._keys[j], self.env._value(j)


class ShardStore:
    """One opened shard, as the store a :class:`StrategyReader` reads from (for the
    run ``run_uid``)."""

    def __init__(self, file: Path, data: bytes, name: bytes, where: str,
                 run_uid: str | None = None):
        self.file = file
        self.path = file.parent
        self.env = ShardEnv(data, where)
        self.run_uid = run_uid
        self._name = name

    def database(self, name: bytes, create: bool = False) -> ShardEnv | None:
        """The shard's one sub-database (the parsed file) when it is ``name``."""
        return self.env if name == self._name else None

    def rtree_path(self, op: str, strategy: Strategy, space: str) -> Path:
        """What names the R-tree of ``space`` in errors (its bytes are in the shard)."""
        return Path(f"{self.file}#rtree-{space}")

    def rtree_file(self, op: str, strategy: Strategy, space: str, ext: str, size: int,
                   digest: int, start: int = 0) -> bytes:
        data = self.env.get(rtree_key(space, ext))
        if data is None:
            raise ChecksumMismatch("missing")
        return verified(data, size, digest, start=start)


# -- reading ---------------------------------------------------------------------------
class ShardedReader:
    """Reads a sharded (operator, strategy): the pair-source interface of
    :class:`StrategyReader` over the shards its record lists, opening only those
    a query's cells fall in.  Pair ids run shard after shard, in the record's
    order.  Any damage (a shard missing, of another size or checksum, or damaged
    inside) raises :class:`CorruptLineage`, which a trace answers by re-execution."""

    def __init__(self, store: LineageSource, op: str, strategy: Strategy, meta: StrategyMeta):
        self.store, self.op, self.strategy, self.meta = store, op, strategy, meta
        self.file = store.file
        self.shards: tuple[ShardMeta, ...] = meta.shards
        self._open: dict[int, StrategyReader] = {}
        self._bases: dict[str, np.ndarray] = {}
        self._spaces = list(dict.fromkeys(n for sh in self.shards for n, _, _ in sh.spaces))

    def reach(self, i: int) -> int | None:
        """The payload reach of input ``i`` every shard's pairs were checked against
        (recorded in the index), or None."""
        r = self.meta.reach
        return r[i] if r is not None and i < len(r) else None

    # -- shards -----------------------------------------------------------------------
    @property
    def opened(self) -> int:
        """How many shards this reader has opened (a small query opens few)."""
        return len(self._open)

    def _reader(self, k: int) -> StrategyReader:
        r = self._open.get(k)
        if r is None:
            sh = self.shards[k]
            path = self.store.path / sh.file
            what = f"stored lineage of operator {self.op!r} ({self.strategy}) is damaged"
            name = db_name(self.op, self.strategy)
            start = shard_seed(name, self.meta.run, Path(sh.file).name.removesuffix(SUFFIX))
            try:
                data = read_verified(path, sh.size, sh.crc, start)
            except ChecksumMismatch as e:
                other = _named_run(path, sh.size, name)
                if other is not None and other != self.store.run_uid:
                    raise CorruptLineage(f"stored lineage of operator {self.op!r} ({self.strategy}): "
                                         f"shard {sh.file} belongs to another run: its record "
                                         f"names run uid {other} ({path})") from e
                raise CorruptLineage(f"{what}: shard {sh.file}: {e} ({path})") from e
            r = StrategyReader(ShardStore(path, data, name, f"shard {path}", self.store.run_uid),
                               self.op, self.strategy)
            self._open[k] = r
        return r

    def _base(self, space: str) -> np.ndarray:
        """First pair id of each shard in ``space`` (and the total, last)."""
        b = self._bases.get(space)
        if b is None:
            b = self._bases[space] = lengths_to_offsets(
                np.array([sh.pairs(space) for sh in self.shards], np.int64))
        return b

    def _key_shape(self, space: str) -> tuple[int, ...]:
        return self.meta.out_shape if space == "b" else self.meta.in_shapes[int(space[1:])]

    def _meeting(self, boxes: list[tuple[tuple[int, ...], tuple[int, ...]] | None], ids: np.ndarray,
                 shape: tuple[int, ...]) -> list[int]:
        """The shards whose box meets any of the sorted cell ids ``ids``: each row
        run of the ids is one box, tested against every shard's box at once."""
        have = [k for k, b in enumerate(boxes) if b is not None]
        if not have or ids.size == 0:
            return []
        lo, hi = row_runs(ids, shape)
        slo = np.array([boxes[k][0] for k in have], np.int64)        # type: ignore[index]
        shi = np.array([boxes[k][1] for k in have], np.int64)        # type: ignore[index]
        hit = np.zeros(len(have), bool)
        step = max(1, (1 << 22) // max(1, len(have) * len(shape)))
        for a in range(0, len(lo), step):
            l, h = lo[a:a + step, None, :], hi[a:a + step, None, :]
            hit |= np.all((l <= shi[None]) & (h >= slo[None]), axis=2).any(axis=0)
        return [have[j] for j in np.flatnonzero(hit)]

    # -- the pair-source interface ------------------------------------------------------
    def has_space(self, space: str) -> bool:
        return space in self._spaces

    def spaces(self) -> list[str]:
        return list(self._spaces)

    def clear_cache(self) -> None:
        for r in self._open.values():
            r.clear_cache()

    def lookup(self, space: str, q: CellSet) -> np.ndarray:
        """Ids of the pairs whose key cells meet ``q``, from the shards ``q`` meets."""
        if not q or space not in self._spaces:
            return np.zeros(0, np.int64)
        base, shape, ids = self._base(space), self._key_shape(space), q.ids()
        touched = self._meeting([sh.box(space) for sh in self.shards], ids, shape)
        if len(touched) <= 1:
            parts = [self._reader(k).lookup(space, q) + base[k] for k in touched]
        else:       # each shard looks up only the query cells inside its box
            coords = unpack(ids, shape)
            parts = []
            for k in touched:
                lo, hi = self.shards[k].box(space)          # type: ignore[misc]
                inside = np.all((coords >= lo) & (coords <= hi), axis=1)
                sub = CellSet.of_sorted(ids[inside], shape)
                parts.append(self._reader(k).lookup(space, sub) + base[k])
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _split(self, space: str, pids: np.ndarray) -> Iterator[tuple[int, slice]]:
        """(shard, slice of ``pids``) for sorted pair ids."""
        if pids.size == 0:
            return
        base = self._base(space)
        at = np.searchsorted(base, pids, side="right") - 1
        if at[0] < 0 or pids[-1] >= base[-1]:
            raise CorruptLineage(f"stored lineage of {self.op!r} ({self.strategy}): pair id "
                                 f"out of range")
        cuts = np.flatnonzero(np.diff(at)) + 1
        starts = np.concatenate(([0], cuts)).astype(np.int64)
        ends = np.concatenate((cuts, [len(pids)])).astype(np.int64)
        for a, b in zip(starts.tolist(), ends.tolist()):
            yield int(at[a]), slice(a, b)

    def records(self, space: str, pids: np.ndarray, fields: list[str]) -> Records:
        pids = np.asarray(pids, np.int64)
        if pids.size > 1 and not bool(np.all(pids[1:] >= pids[:-1])):
            order = np.argsort(pids, kind="stable")
            return _reorder(self.records(space, pids[order], fields), np.argsort(order), fields)
        base = self._base(space)
        parts = [self._reader(k).records(space, pids[s] - base[k], fields)
                 for k, s in self._split(space, pids)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return _empty_records(fields)
        return concat_records(parts, fields)

    def all_pairs(self, space: str) -> np.ndarray:
        return np.arange(int(self._base(space)[-1]), dtype=np.int64)

    def scan_keys(self, space: str, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pids = np.asarray(pids, np.int64)
        base = self._base(space)
        parts = [self._reader(k).scan_keys(space, pids[s] - base[k]) for k, s in self._split(space, pids)]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(len(pids) + 1, np.int64)
        got = concat_records([{"key": p} for p in parts], ["key"])["key"]
        return got[0], got[1]

    def covered(self, near: np.ndarray | None = None) -> np.ndarray:
        """Output cells covered by payload pairs: of the shards whose covered box
        meets the cell ids ``near`` (all shards when None)."""
        boxes = [sh.covered for sh in self.shards]
        if near is None:
            touched = [k for k, b in enumerate(boxes) if b is not None]
        else:
            ids = np.unique(np.asarray(near, np.int64))
            touched = self._meeting(boxes, ids, self.meta.out_shape)
        parts = [self._reader(k).covered() for k in touched]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def _named_run(path: Path, size: int, name: bytes) -> str | None:
    """After a shard failed its check: the run its own record names, if it is a
    readable shard of a bound run (to say "another run" rather than "damaged")."""
    from subzero.storage.metadata import META
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.pread(fd, 2 * size + (1 << 20), 0)
        finally:
            os.close(fd)
        raw = ShardEnv(data, str(path)).get(META)
        return None if raw is None else StrategyMeta.from_bytes(raw, str(path), name).run
    except (OSError, CorruptLineage):
        return None


def box_of(ids: np.ndarray, shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The inclusive bounding box of cell ids (not empty)."""
    c = unpack(np.asarray(ids, np.int64), tuple(shape))
    return tuple(int(v) for v in c.min(axis=0)), tuple(int(v) for v in c.max(axis=0))


def _empty_records(fields: list[str]) -> Records:
    out: Records = {}
    for f in fields:
        out[f] = (np.zeros(0, np.int64), []) if f == "pay" else (np.zeros(0, np.int64),
                                                                  np.zeros(1, np.int64))
    return out


def _reorder(rec: Records, rows: np.ndarray, fields: list[str]) -> Records:
    """Records of sorted pairs put back in the order asked (``rows``: where each asked
    pair sits among the sorted ones)."""
    out: Records = {}
    for f in fields:
        if f == "pay":
            ids, table = rec["pay"]
            out["pay"] = (np.asarray(ids)[rows], table)
        else:
            cells, off = rec[f]
            out[f] = (csr_take(cells, off, rows), lengths_to_offsets(np.diff(off)[rows]))
    return out
