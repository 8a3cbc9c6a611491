"""What can be damaged in a store, and how.

A *target* is either a file of the store (by kind: the catalog, a run's pickled
workflow, LMDB data and lock files, R-tree ``.dat``/``.idx`` files, Zarr chunks and
``zarr.json`` metadata, the Spark engine's lineage shards) or one value stored in the run's LMDB environment (by
role: a strategy's metadata record, record blocks, payload tables, the key index
of One encodings, COMP covered cells).  Damaging a value goes through LMDB itself,
so the environment stays well-formed and only the stored object is wrong: random
bytes in ``data.mdb`` rarely land on the few hundred bytes a query reads.

A *damage* is plain data drawn from a seeded RNG (bit flips, an overwritten range
of random bytes or zeros, truncation to zero or a random length, deletion), so a
case is reproducible from (seed, case number).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FILE_KINDS = ("catalog", "workflow-pkl", "lmdb-data", "lmdb-lock", "rtree-dat", "rtree-idx",
              "zarr-chunk", "zarr-meta", "other-file", "lineage-shard")
VALUE_KINDS = ("lmdb:meta", "lmdb:records", "lmdb:payload-table", "lmdb:key-index",
               "lmdb:covered", "lmdb:other")
DAMAGES = ("bitflip", "overwrite-random", "overwrite-zeros", "truncate-zero", "truncate-random",
           "delete")
#: a third of the positions fall in the first HEAD bytes, where formats keep headers
HEAD = 4096


@dataclass(frozen=True)
class Target:
    """A file (``db`` None) or one LMDB value (``db``/``key`` hex) of a store."""

    kind: str
    path: str            # relative to the store
    size: int
    db: str | None = None
    key: str | None = None

    def describe(self) -> str:
        if self.db is None:
            return self.path
        return f"{self.path} [{self.db}] key {self.key}"


@dataclass(frozen=True)
class Damage:
    kind: str
    offset: int = 0
    length: int = 0
    bits: tuple[int, ...] = ()
    seed: int = 0
    #: what a move puts in the target's place (:mod:`faultlib.moves`): another path,
    #: an SQL statement
    other: str = ""

    def describe(self) -> str:
        if self.other:
            return f"{self.kind} {self.other}"
        if self.kind == "bitflip":
            return f"bitflip {len(self.bits)} bit(s) at " + ",".join(
                f"{b // 8}.{b % 8}" for b in self.bits)
        if self.kind.startswith("overwrite"):
            return f"{self.kind} {self.length} byte(s) at {self.offset}"
        if self.kind == "truncate-random":
            return f"truncate to {self.length} byte(s)"
        return self.kind


# -- what a store holds ----------------------------------------------------------------
def file_kind(rel: str) -> str:
    p = Path(rel)
    parts = p.parts
    if rel == "catalog.sqlite":
        return "catalog"
    if p.name == "workflow.pkl":
        return "workflow-pkl"
    if "lineage" in parts:
        if p.name == "data.mdb":
            return "lmdb-data"
        if p.name == "lock.mdb":
            return "lmdb-lock"
        if p.suffix == ".szs":
            return "lineage-shard"        # written by the Spark engine's tasks
        if "rtree" in parts:
            return "rtree-dat" if p.suffix == ".dat" else "rtree-idx" if p.suffix == ".idx" \
                else "other-file"
    if any(x.endswith(".zarr") for x in parts):
        return "zarr-meta" if p.name == "zarr.json" else "zarr-chunk"
    return "other-file"


def value_kind(db: bytes, key: bytes) -> str:
    """The role of one LMDB value, from the key layout of ``subzero.storage.metadata``
    (``<space>\\0<kind><block>``; kinds R records, K key index, C covered cells)."""
    if key == b"\x00meta":
        return "lmdb:meta"
    strategy = db.split(b"|", 1)[-1]
    head, sep, rest = key.partition(b"\x00")
    kind = rest[:1] if sep and head else b""
    if kind == b"R":
        return "lmdb:payload-table" if strategy.startswith((b"pay", b"comp")) else "lmdb:records"
    if kind == b"K":
        return "lmdb:key-index"
    if kind == b"C":
        return "lmdb:covered"
    return "lmdb:other"


def lmdb_values(lineage: Path) -> list[tuple[bytes, bytes, int]]:
    """(sub-database, key, value size) of every value of a run's LMDB environment."""
    import lmdb
    env = lmdb.open(str(lineage), readonly=True, lock=False, max_dbs=4096, subdir=True)
    try:
        with env.begin() as txn:
            names = [k for k, _ in txn.cursor()]
        out = []
        for name in names:
            db = env.open_db(name, create=False)
            with env.begin(db=db) as txn:
                out += [(name, k, len(v)) for k, v in txn.cursor()]
        return out
    finally:
        env.close()


def list_targets(store: Path, run: int = 1) -> list[Target]:
    """Every file of the store outside other runs' folders, and every LMDB value of
    run ``run``, in a stable order."""
    out = []
    for f in sorted(p for p in store.rglob("*") if p.is_file()):
        rel = f.relative_to(store).as_posix()
        if rel.startswith("runs/") and not rel.startswith(f"runs/{run}/"):
            continue
        out.append(Target(file_kind(rel), rel, f.stat().st_size))
        if f.name == "data.mdb":
            for db, key, size in lmdb_values(f.parent):
                out.append(Target(value_kind(db, key), rel, size, db.decode(), key.hex()))
    return out


# -- drawing a damage ---------------------------------------------------------------------
def _position(rng: np.random.Generator, n: int, head: int = HEAD) -> int:
    """A position in [0, n): a third of them in the first ``head`` positions."""
    if n <= 1:
        return 0
    if rng.random() < 1 / 3:
        return int(rng.integers(0, min(n, head)))
    return int(rng.integers(0, n))


def draw_damage(rng: np.random.Generator, size: int, kind: str | None = None) -> Damage:
    """A damage for an object of ``size`` bytes (an empty one can only be deleted)."""
    if kind is None:
        kinds = DAMAGES if size > 1 else ("truncate-zero", "delete") if size == 1 else ("delete",)
        kind = str(rng.choice(kinds))
    if kind == "bitflip":
        n = int(rng.integers(1, 9))
        bits = sorted({_position(rng, size * 8, HEAD * 8) for _ in range(n)})
        return Damage(kind, bits=tuple(bits))
    if kind in ("overwrite-random", "overwrite-zeros"):
        length = max(1, min(size, int(2 ** rng.uniform(0, 12))))
        offset = min(_position(rng, size), size - length)
        return Damage(kind, offset=offset, length=length, seed=int(rng.integers(0, 2 ** 31)))
    if kind == "truncate-random":
        return Damage(kind, length=int(rng.integers(1, size)))
    return Damage(kind)


def damaged(data: bytes, d: Damage) -> bytes | None:
    """The bytes after the damage; None when the object is deleted."""
    if d.kind == "none":
        return data
    if d.kind == "delete":
        return None
    if d.kind == "truncate-zero":
        return b""
    if d.kind == "truncate-random":
        return data[:d.length]
    buf = bytearray(data)
    if d.kind == "bitflip":
        for b in d.bits:
            buf[b // 8] ^= 1 << (b % 8)
    elif d.kind == "overwrite-random":
        buf[d.offset:d.offset + d.length] = np.random.default_rng(d.seed).bytes(d.length)
    elif d.kind == "overwrite-zeros":
        buf[d.offset:d.offset + d.length] = bytes(d.length)
    else:
        raise ValueError(f"unknown damage {d.kind!r}")
    return bytes(buf)


# -- applying it ------------------------------------------------------------------------------
def apply(store: Path, t: Target, d: Damage, fx=None) -> None:
    """Damage target ``t`` of the store copy at ``store`` (``fx``: its fixture, which
    moves take pieces from)."""
    from faultlib.moves import MOVES, move
    if d.kind in MOVES:
        move(store, t, d, fx)
        return
    path = store / t.path
    if t.db is None:
        new = damaged(path.read_bytes(), d)
        if new is None:
            path.unlink()
        else:
            path.write_bytes(new)
        return
    import lmdb
    assert t.key is not None
    env = lmdb.open(str(path.parent), max_dbs=4096, subdir=True,
                    map_size=2 * path.stat().st_size + (8 << 20))
    try:
        db = env.open_db(t.db.encode(), create=False)
        key = bytes.fromhex(t.key)
        with env.begin(write=True, db=db) as txn:
            old = txn.get(key)
            assert old is not None, f"no value {t.describe()}"
            new = damaged(old, d)
            if new is None:
                txn.delete(key)
            else:
                txn.put(key, new)
    finally:
        env.close()
