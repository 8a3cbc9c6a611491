"""The format of one stored strategy: its metadata record and LMDB key layout.

Every (operator, strategy) sub-database holds one metadata record (key
:data:`META`) describing what was written: the strategy, the array shapes, the
covered-cell chunks of composite lineage and, per key space, how many pairs,
which record fields, the record block ids and the key-index block size.

The record is JSON with a ``format`` number.  Format 1 is what SubZero wrote
before the number existed: no ``format`` key, and a space without ``key_bits``
was written with ``2**LEGACY_KEY_BITS``-cell key blocks.  :meth:`StrategyMeta.
from_bytes` is the only place that knows those defaults; everything else reads
typed, frozen objects.  A record of a newer format than this SubZero knows is
refused with :class:`NewerLineageFormat`: it might mean something else, and a
trace must never answer wrongly in silence.

The JSON keys of format 2 are those of format 1 plus ``format`` (and
``key_bits`` always present).

Format 3 checksums everything a reader decodes (:mod:`subzero.storage.integrity`):
the metadata record is :data:`META_MAGIC` followed by its JSON sealed with a
CRC-32, every block is sealed, and the record itself lists what must exist
besides the record blocks — which key-index blocks were written (a B-tree
damaged so that a block is not found must not read as "no such cells") and the
size and CRC-32 of each R-tree file, checked before libspatialindex opens it.
Formats 1 and 2 have no checksums and are read as before
(:attr:`StrategyMeta.checksummed` says which a record is).  A format-3 record
without its seal is damaged, not old: a flipped digit must not turn the checks
off.

Format 4 is a *sharded* strategy (:mod:`subzero.storage.shards`): Spark tasks
encode their tiles' lineage into shard files, and the record in the run's LMDB
environment lists the committed shards — each one's file, size and CRC-32, and
per key space its pair count and the bounding box of its key cells — so that a
reader opens only the shards a query's cells fall in.  Each shard holds an
ordinary format-3 sub-database.  Unsharded strategies of unbound runs (below)
are still written in format 3, which older SubZero versions read.

Format 5 is *bound to its run* (:mod:`subzero.storage.place`): a checksum
proves that bytes are intact, and in format 5 also that they belong to this
run.  Every sealed value's CRC-32 is seeded with the run's uid before the
sub-database's name and the key (:func:`seed_name`: ``seed(tag + db, key)``,
``tag`` the uid's 16 bytes), and so is the CRC-32 of each R-tree file and each
shard file (a shard's also with its tile's name).  The metadata record is
sealed as in format 3 (so an older SubZero reads it, sees a newer format and
says so, rather than calling it damage) and names the run in its JSON
(``run``: the uid), which every reader checks against the run it reads for.
Lineage taken from another run — a ``lineage/`` folder, a ``data.mdb``, a
shard file — therefore fails like damage and says that it belongs to another
run.  Format 5 is written for every new sub-database of a run with a uid, its
shards' included, sharded or not (``sharded`` says which); runs made before
runs had uids (their catalog row has none) are *unbound*: they keep reading
and writing formats 2-4, and format 5 in them is foreign, while a run with a
uid reads only format 5 (:meth:`StrategyMeta.check_bound`).

A payload strategy whose pairs were checked against the operator's declared
reach when they were captured (:mod:`subzero.model.reach`) records it under
``reach`` (one number or null per input), in any format: a forward trace step
then looks up only the pairs near its cells.  The key is optional and only ever
narrows what a step reads to what the check proved, so a record without it
(older lineage, an operator that declares none) is scanned as before, and a
SubZero that does not know the key reads the record correctly.

The JSON of each record has a typed shape (:class:`StrategyRecord`,
:class:`SpaceRecord`, :class:`ShardRecord`).  Whether a record is sharded is
its ``sharded`` key; records written before that key existed (formats 1-3, and
format 4 as first written) say it by their format number, which
:meth:`StrategyMeta.from_json` reads in its place (format 4 is sharded, others
are not).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict, cast

import numpy as np

from subzero.errors import ChecksumMismatch, CorruptLineage, NewerLineageFormat, StrategyError
from subzero.model.strategy import Encoding, Strategy, parse_one
from subzero.storage.encodings import LEGACY_KEY_BITS
from subzero.storage.integrity import seal, seed, unseal
from subzero.storage.place import Place

#: The newest format this SubZero reads (and writes, for every run with a uid).
FORMAT_VERSION = 5
#: Format of the unsharded strategies this SubZero writes for an *unbound* run (one
#: made before runs had uids, resumed; and of every shard's own there).  The writer
#: (:func:`subzero.storage.lineage.encode_strategy`) reads it at each write, so a
#: test writes a store as SubZero did before checksums by setting it to 2
#: (``monkeypatch.setattr(subzero.storage.metadata, "WRITE_FORMAT", 2)``) for an
#: unbound run; appends keep a store's own format.
WRITE_FORMAT = 3
#: First format whose record may list shards instead of holding blocks.
SHARDED_FORMAT = 4
#: First format whose values, files and record are bound to their run's uid.
BOUND_FORMAT = 5
#: Format of metadata written without a ``format`` number.
LEGACY_FORMAT = 1
#: First format whose values carry checksums.
CHECKSUM_FORMAT = 3
#: How a sealed metadata record starts (a format 1/2 record is JSON: ``{``).
META_MAGIC = b"SZ\x03\x00"

Shape = tuple[int, ...]
#: The files libspatialindex keeps an R-tree in (suffixes of its base path); a
#: format-3 space of a Many encoding records the size and CRC-32 of each.
RTREE_FILES = ("dat", "idx")


# -- LMDB key layout -------------------------------------------------------------------
#: Key of the metadata record in each (operator, strategy) sub-database.
META = b"\x00meta"


def db_name(op: str, strategy: Strategy) -> bytes:
    """The name of an (operator, strategy) sub-database, in a run's LMDB environment
    and in each shard; the checksums of its values are seeded with it."""
    return f"{op}|{strategy}".encode()


def seed_name(db: bytes, run_uid: str | None) -> bytes:
    """What the checksums of sub-database ``db``'s values are seeded with: its name,
    behind its run's uid in a bound run (format 5: ``seed(seed_name(db, uid), key)``),
    alone in an unbound one."""
    return db if run_uid is None else Place(run_uid).tag + db


def shard_seed(db: bytes, run_uid: str | None, stem: str) -> int:
    """The CRC-32 seed of a shard file of sub-database ``db`` for tile ``stem`` (its
    file name without suffix): bound to the run and the tile in format 5, 0 before."""
    return 0 if run_uid is None else seed(seed_name(db, run_uid), stem.encode())


def rtree_seed(db: bytes, run_uid: str | None, space: str, ext: str) -> int:
    """The CRC-32 seed of one R-tree file of ``space``: bound to the run, the
    sub-database and the space in format 5, 0 before."""
    return 0 if run_uid is None else seed(seed_name(db, run_uid), f"rtree|{space}|{ext}".encode())


def block_key(space: str, kind: bytes, n: int) -> bytes:
    """Key of block ``n`` of one kind (``R`` record, ``K`` key index, ``C`` covered cells)."""
    return space.encode() + b"\x00" + kind + struct.pack(">Q", n)


def record_key(space: str, blk: int) -> bytes:
    return block_key(space, b"R", blk)


def key_index_key(space: str, blk: int) -> bytes:
    return block_key(space, b"K", blk)


def covered_key(chunk: int) -> bytes:
    return block_key("c", b"C", chunk)


def stored_encoding(strategy: Strategy) -> Encoding:
    """The encoding of a strategy that stores lineage (MAP and BLACKBOX store none)."""
    if strategy.encoding is None:
        raise ValueError(f"strategy {strategy} stores no lineage")
    return strategy.encoding


# -- the JSON of a metadata record ---------------------------------------------------------
class SpaceRecord(TypedDict):
    """One key space as stored (:meth:`SpaceMeta.to_json`)."""

    #: pairs written (the next pair id)
    next: int
    key_shape: list[int]
    fields: list[str]
    value_shapes: dict[str, list[int]]
    blocks: list[int]
    #: key-index block size; absent in format 1 (then ``LEGACY_KEY_BITS``)
    key_bits: NotRequired[int]
    #: format 3 on, One encodings: the key-index blocks written (:func:`encode_block_set`)
    key_index: NotRequired[str]
    #: format 3 on, Many encodings: (suffix, size, CRC-32) of each R-tree file
    files: NotRequired[list[tuple[str, int, int]]]


class ShardRecord(TypedDict):
    """One committed shard as stored (:meth:`ShardMeta.to_json`)."""

    file: str
    size: int
    crc: int
    #: per key space: [pairs, lowest key cell, highest key cell]
    spaces: dict[str, tuple[int, list[int], list[int]]]
    #: [lowest, highest] output cell its payload pairs cover, or None
    covered: list[list[int]] | None


class StrategyRecord(TypedDict):
    """A metadata record as stored (:meth:`StrategyMeta.to_json`)."""

    #: absent in format 1
    format: NotRequired[int]
    strategy: str
    out_shape: list[int]
    in_shapes: list[list[int]]
    spaces: dict[str, SpaceRecord]
    covered_chunks: NotRequired[int]
    #: written on sharded records; absent before it existed (then: format >= 4)
    sharded: NotRequired[bool]
    #: sharded records only
    shards: NotRequired[list[ShardRecord]]
    #: format 5 on: the uid of the run the lineage belongs to
    run: NotRequired[str]
    #: payload strategies whose pairs were checked against the operator's declared
    #: reach: the reach per input (null: none); absent: not checked (forward steps scan)
    reach: NotRequired[list[int | None]]


# -- metadata records ------------------------------------------------------------------
@dataclass(frozen=True)
class SpaceMeta:
    """One key space (``"b"``, or ``"f0"``, ``"f1"``... per input) of a stored strategy.

    ``pairs``: pairs written (ids 0..pairs-1, appends start at the next record
    block); ``fields``: what each record block holds, in order; ``blocks``: the
    record block ids written; ``key_bits``: key-index block size (One encodings).
    Format 3 adds ``key_index``: the key-index block ids written (One encodings,
    see :func:`encode_block_set`), and ``files``: (suffix, size, CRC-32) of each
    R-tree file (Many encodings)."""

    name: str
    key_shape: Shape
    fields: tuple[str, ...]
    value_shapes: tuple[tuple[str, Shape], ...]
    key_bits: int
    pairs: int = 0
    blocks: tuple[int, ...] = ()
    key_index: str = ""
    files: tuple[tuple[str, int, int], ...] = ()

    @staticmethod
    def new(name: str, key_shape: Sequence[int], fields: Sequence[str],
            value_shapes: Mapping[str, Sequence[int]], key_bits: int) -> SpaceMeta:
        return SpaceMeta(name, _shape(key_shape), tuple(fields),
                         tuple((k, _shape(v)) for k, v in value_shapes.items()), int(key_bits))

    def appended(self, first: int, n: int, blocks: Iterable[int],
                 key_blocks: Iterable[int] = ()) -> SpaceMeta:
        """This space after ``n`` pairs were written from pair id ``first`` on (into
        record ``blocks`` and key-index ``key_blocks``)."""
        kb = np.fromiter(key_blocks, np.int64)
        key_index = self.key_index
        if kb.size:
            have = decode_block_set(key_index, self.n_key_blocks)
            have[kb] = True
            key_index = encode_block_set(have)
        return dataclasses.replace(self, pairs=first + n, blocks=self.blocks + tuple(blocks),
                                   key_index=key_index)

    def with_files(self, files: Iterable[tuple[str, int, int]]) -> SpaceMeta:
        """This space with the R-tree files' (suffix, size, CRC-32) as now written."""
        return dataclasses.replace(self, files=tuple((str(a), int(b), int(c)) for a, b, c in files))

    @property
    def n_key_blocks(self) -> int:
        """Key-index blocks the key array spans."""
        cells = 1
        for n in self.key_shape:
            cells *= n
        return -(-cells >> self.key_bits) if cells else 0

    def to_json(self) -> SpaceRecord:
        d: SpaceRecord = {
            "next": self.pairs, "key_shape": list(self.key_shape), "fields": list(self.fields),
            "value_shapes": {k: list(v) for k, v in self.value_shapes},
            "blocks": list(self.blocks), "key_bits": self.key_bits}
        if self.key_index:
            d["key_index"] = self.key_index
        if self.files:
            d["files"] = list(self.files)
        return d

    @staticmethod
    def from_json(name: str, d: SpaceRecord, version: int) -> SpaceMeta:
        key_bits = d.get("key_bits", LEGACY_KEY_BITS) if version == LEGACY_FORMAT else d["key_bits"]
        files = tuple((str(a), int(b), int(c)) for a, b, c in d.get("files", ()))
        return SpaceMeta(name, _shape(d["key_shape"]), tuple(str(f) for f in d["fields"]),
                         tuple((str(k), _shape(v)) for k, v in d["value_shapes"].items()),
                         int(key_bits), int(d["next"]), tuple(int(b) for b in d["blocks"]),
                         str(d.get("key_index", "")), files)


Box = tuple[Shape, Shape]


@dataclass(frozen=True)
class ShardMeta:
    """One committed shard of a sharded strategy: its file (relative to the run's
    lineage folder), the size and CRC-32 it was written with, and per key space
    its pair count and the inclusive bounding box (lowest, highest cell) of its
    key cells; ``covered``: the box of the output cells its payload pairs cover
    (composite lineage), None when it covers none."""

    file: str
    size: int
    crc: int
    spaces: tuple[tuple[str, int, Box], ...] = ()
    covered: Box | None = None

    def pairs(self, space: str) -> int:
        return next((n for name, n, _ in self.spaces if name == space), 0)

    def box(self, space: str) -> Box | None:
        return next((b for name, n, b in self.spaces if name == space and n), None)

    def to_json(self) -> ShardRecord:
        return {"file": self.file, "size": self.size, "crc": self.crc,
                "spaces": {name: (n, list(lo), list(hi)) for name, n, (lo, hi) in self.spaces},
                "covered": None if self.covered is None else [list(c) for c in self.covered]}

    @staticmethod
    def from_json(d: ShardRecord) -> ShardMeta:
        cov = d.get("covered")
        return ShardMeta(str(d["file"]), int(d["size"]), int(d["crc"]),
                         tuple((str(k), int(n), (_shape(lo), _shape(hi)))
                               for k, (n, lo, hi) in d["spaces"].items()),
                         None if cov is None else (_shape(cov[0]), _shape(cov[1])))


@dataclass(frozen=True)
class StrategyMeta:
    """What one (operator, strategy) sub-database holds: blocks described by
    ``spaces`` (formats 1-3), or, ``sharded`` (format 4), the ``shards`` holding them;
    format 5 either of them, bound to the run ``run`` (its uid)."""

    strategy: Strategy
    out_shape: Shape
    in_shapes: tuple[Shape, ...]
    spaces: tuple[SpaceMeta, ...] = ()
    covered_chunks: int = 0
    version: int = WRITE_FORMAT
    shards: tuple[ShardMeta, ...] = ()
    #: whether the record lists shards instead of holding blocks
    sharded: bool = False
    #: the uid of the run it belongs to (format 5 on; None before)
    run: str | None = None
    #: the payload reach per input every stored pair was checked against at capture
    #: (:mod:`subzero.model.reach`); None: not checked.  A reader that does not know
    #: the key scans, as before it existed: the key changes speed, never answers.
    reach: tuple[int | None, ...] | None = None

    @staticmethod
    def new(strategy: Strategy, out_shape: Sequence[int],
            in_shapes: Sequence[Sequence[int]]) -> StrategyMeta:
        return StrategyMeta(strategy, _shape(out_shape), tuple(_shape(s) for s in in_shapes))

    @staticmethod
    def sharded_index(strategy: Strategy, out_shape: Sequence[int],
                      in_shapes: Sequence[Sequence[int]], shards: Sequence[ShardMeta],
                      run_uid: str | None = None,
                      reach: Sequence[int | None] | None = None) -> StrategyMeta:
        """The record of a sharded strategy: the shards, no blocks of its own (format 5,
        bound to run ``run_uid``, when the run has one); ``reach``: what every shard's
        pairs were checked against."""
        meta = StrategyMeta(strategy, _shape(out_shape), tuple(_shape(s) for s in in_shapes),
                            version=SHARDED_FORMAT, shards=tuple(shards), sharded=True,
                            reach=_reach(reach))
        return meta if run_uid is None else meta.bound(run_uid)

    def bound(self, run_uid: str) -> StrategyMeta:
        """This metadata as written bound to run ``run_uid`` (format 5)."""
        return dataclasses.replace(self, version=BOUND_FORMAT, run=run_uid)

    def check_bound(self, run_uid: str | None, where: str) -> None:
        """Refuse lineage that is not this run's: a bound record naming another run, a
        bound record in an unbound run (``run_uid`` None), or an unbound record in a
        run with a uid (lineage of a run made before uids, or written unbound, cannot
        prove it is this run's).  Raises :class:`CorruptLineage`, which a trace answers
        another way."""
        if self.run is not None:
            if self.run != run_uid:
                mine = f"not this run's ({run_uid})" if run_uid is not None else \
                    "and this run has no uid (made before runs had uids)"
                raise CorruptLineage(f"{where} belongs to another run: its record names run uid "
                                     f"{self.run}, {mine}")
        elif run_uid is not None:
            raise CorruptLineage(f"{where} is not bound to this run: format {self.version} "
                                 f"names no run, and run uid {run_uid} reads only lineage bound "
                                 f"to it (format {BOUND_FORMAT}); it was written elsewhere or "
                                 f"copied from another run")

    def space(self, name: str) -> SpaceMeta | None:
        for sp in self.spaces:
            if sp.name == name:
                return sp
        return None

    @property
    def space_names(self) -> list[str]:
        return [sp.name for sp in self.spaces]

    @property
    def checksummed(self) -> bool:
        """Whether this strategy's values and files carry checksums (format 3 on);
        older stores are read unchecked."""
        return self.version >= CHECKSUM_FORMAT

    def with_space(self, space: SpaceMeta) -> StrategyMeta:
        """This metadata with ``space`` added or replaced."""
        spaces = tuple(space if sp.name == space.name else sp for sp in self.spaces)
        if self.space(space.name) is None:
            spaces += (space,)
        return dataclasses.replace(self, spaces=spaces)

    def with_covered_chunk(self) -> StrategyMeta:
        return dataclasses.replace(self, covered_chunks=self.covered_chunks + 1)

    def in_format(self, version: int) -> StrategyMeta:
        """This metadata as written in format ``version``."""
        return dataclasses.replace(self, version=version)

    def with_pairs_checked(self, reach: Sequence[int | None] | None, first: bool) -> StrategyMeta:
        """This metadata after a write whose pairs were checked against ``reach`` (None:
        not checked).  The first write records it; an append keeps, per input, the
        larger of the two, and loses it where either write was not checked."""
        new = _reach(reach)
        if first or self.reach is None or new is None or len(new) != len(self.reach):
            return dataclasses.replace(self, reach=new if first else None)
        both = tuple(None if a is None or b is None else max(a, b) for a, b in zip(self.reach, new))
        return dataclasses.replace(self, reach=both if any(x is not None for x in both) else None)

    # -- serialisation ---------------------------------------------------------------
    def to_json(self) -> StrategyRecord:
        d: StrategyRecord = {
            "format": self.version, "strategy": str(self.strategy),
            "out_shape": list(self.out_shape), "in_shapes": [list(s) for s in self.in_shapes],
            "spaces": {sp.name: sp.to_json() for sp in self.spaces},
            "covered_chunks": self.covered_chunks}
        if self.sharded:
            d["sharded"] = True
            d["shards"] = [sh.to_json() for sh in self.shards]
        if self.run is not None:
            d["run"] = self.run
        if self.reach is not None:
            d["reach"] = list(self.reach)
        return d

    def to_bytes(self, db: bytes = b"") -> bytes:
        """The stored record (sealed from format 3 on; ``db``: the sub-database's name,
        which the checksum covers)."""
        return encode_record(self.to_json(), db)

    @staticmethod
    def from_json(d: object, where: str = "stored lineage") -> StrategyMeta:
        """Read a metadata record of any known format (the JSON a record decodes to:
        :class:`StrategyRecord`, checked here); ``where`` names it in errors."""
        if not isinstance(d, dict):
            raise CorruptLineage(f"{where} has malformed metadata (not a JSON object)")
        rec = cast(StrategyRecord, d)
        version = rec.get("format", LEGACY_FORMAT)
        if not isinstance(version, int) or version < LEGACY_FORMAT:
            raise CorruptLineage(f"{where} has malformed metadata (format {version!r})")
        if version > FORMAT_VERSION:
            raise NewerLineageFormat(
                f"{where} was written by a newer SubZero (lineage format {version}; this one "
                f"reads up to {FORMAT_VERSION}); upgrade SubZero to use it")
        # records from before the key: sharded exactly when of the sharded format
        sharded = rec.get("sharded", version == SHARDED_FORMAT)
        if not isinstance(sharded, bool) or (sharded and version < SHARDED_FORMAT):
            raise CorruptLineage(f"{where} has malformed metadata (sharded {sharded!r} in "
                                 f"format {version})")
        run = rec.get("run")
        if (version >= BOUND_FORMAT) != (run is not None) or not (run is None or _is_uid(run)):
            raise CorruptLineage(f"{where} has malformed metadata (run {run!r} in format "
                                 f"{version})")
        try:
            reach = rec.get("reach")
            if reach is not None and (not isinstance(reach, list) or any(
                    x is not None and (isinstance(x, bool) or not isinstance(x, int) or x < 0)
                    for x in reach) or len(reach) != len(rec["in_shapes"])):
                raise CorruptLineage(f"{where} has malformed metadata (reach {reach!r})")
            return StrategyMeta(
                parse_one(rec["strategy"]), _shape(rec["out_shape"]),
                tuple(_shape(s) for s in rec["in_shapes"]),
                tuple(SpaceMeta.from_json(str(k), v, version) for k, v in rec["spaces"].items()),
                int(rec.get("covered_chunks", 0)), version,
                tuple(ShardMeta.from_json(sh) for sh in rec["shards"]) if sharded else (),
                sharded, run, _reach(reach))
        except (KeyError, TypeError, ValueError, AttributeError, StrategyError) as e:
            raise CorruptLineage(f"{where} has malformed metadata: {type(e).__name__}: {e}") from e

    @staticmethod
    def from_bytes(raw: bytes, where: str = "stored lineage", db: bytes = b"") -> StrategyMeta:
        return StrategyMeta.from_json(decode_record(raw, where, db), where)


# -- the stored record ------------------------------------------------------------------
def encode_record(d: StrategyRecord, db: bytes = b"") -> bytes:
    """A metadata record's JSON as stored: format 3 on sealed behind :data:`META_MAGIC`."""
    body = json.dumps(d).encode()
    version = d.get("format", LEGACY_FORMAT)
    if isinstance(version, int) and version >= CHECKSUM_FORMAT:
        return META_MAGIC + seal(body, seed(db, META))
    return body


def decode_record(raw: bytes, where: str = "stored lineage", db: bytes = b"") -> object:
    """The JSON of a stored metadata record (a :class:`StrategyRecord` once
    :meth:`StrategyMeta.from_json` checked it), its checksum verified where it has one."""
    sealed = bytes(raw[:len(META_MAGIC)]) == META_MAGIC
    body: bytes | memoryview = raw
    if sealed:
        try:
            body = unseal(memoryview(raw)[len(META_MAGIC):], seed(db, META))
        except ChecksumMismatch as e:
            raise CorruptLineage(f"{where} has damaged metadata ({e})") from e
    try:
        d: object = json.loads(bytes(body))
    except ValueError as e:
        raise CorruptLineage(f"{where} has unreadable metadata: {e}") from e
    version = d.get("format", LEGACY_FORMAT) if isinstance(d, dict) else None
    if isinstance(version, int) and not sealed and CHECKSUM_FORMAT <= version <= FORMAT_VERSION:
        raise CorruptLineage(f"{where} has damaged metadata (format {version} without its checksum)")
    if isinstance(version, int) and sealed and version < CHECKSUM_FORMAT:
        raise CorruptLineage(f"{where} has damaged metadata (format {version} behind a checksum)")
    return d


# -- sets of block ids --------------------------------------------------------------------
def encode_block_set(present: np.ndarray) -> str:
    """A boolean array of block ids as text for the JSON record (compressed bits)."""
    return base64.b64encode(zlib.compress(np.packbits(present).tobytes())).decode()


def decode_block_set(text: str, n: int) -> np.ndarray:
    """The boolean array of ``n`` block ids :func:`encode_block_set` wrote ("" = none)."""
    if not text:
        return np.zeros(n, bool)
    bits = np.frombuffer(zlib.decompress(base64.b64decode(text)), np.uint8)
    out = np.unpackbits(bits, count=n).astype(bool) if n <= bits.size * 8 else None
    if out is None:
        raise ValueError("key-index block set shorter than the key array")
    return out


def _is_uid(text: object) -> bool:
    """A run uid as records name it: 32 lower-case hex digits."""
    return isinstance(text, str) and len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def _reach(r: Sequence[int | None] | None) -> tuple[int | None, ...] | None:
    """A reach as recorded: per input, or None when no input has one."""
    if r is None:
        return None
    out = tuple(None if x is None else int(x) for x in r)
    return out if any(x is not None for x in out) else None


def _shape(s: Iterable[int]) -> Shape:
    return tuple(int(n) for n in s)
