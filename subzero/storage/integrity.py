"""Checksums of stored lineage: the one place that knows how a value or a file is
checksummed.

Region lineage is written without fsync and read through native code (LMDB,
libspatialindex), so damage must be caught before a damaged byte can become a
wrong answer or reach a library that trusts its input.  CRC-32 (zlib, ~2.4 GB/s
here) is enough against accidental damage; deliberate tampering is the trust
model's concern, not this one.

* An LMDB value is *sealed*: its body followed by a 4-byte CRC-32 that is seeded
  with where the value lives (sub-database name and key).  A value that LMDB
  hands back under the wrong key — a damaged B-tree page pointing at another
  leaf — therefore fails its check like a damaged body does.
* A file (an R-tree's ``.dat`` / ``.idx``) is recorded as (size, CRC-32) and
  checked before anything opens it.
* In a run with a uid (lineage format 5) every seed starts with the run's uid as
  well, so a value or file copied from another run fails its check like damage
  (:mod:`subzero.storage.metadata`); a file's CRC-32 then starts from a seed too
  (``start``).

Everything raises :class:`ChecksumMismatch` (a plain ``ValueError``): callers
know which operator and file it belongs to and turn it into the error the user
sees.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from subzero.errors import ChecksumMismatch, UnsafeFile
from subzero.storage.files import open_regular, read_fd
from subzero.tuning import CHECKSUM_READ_BYTES

_CRC = struct.Struct("<I")
#: Bytes a sealed value is longer than its body.
SEAL_BYTES = _CRC.size


def seed(*parts: bytes) -> int:
    """The CRC seed of a value stored under ``parts`` (sub-database, key)."""
    return zlib.crc32(b"\x00".join(parts))


def seed_in(db_seed: int, key: bytes) -> int:
    """:func:`seed` ``(db, key)`` from ``db_seed = seed(db, b"")`` (CRC-32 continues
    over the key): a reader computes its sub-database's part once."""
    return zlib.crc32(key, db_seed)


def seal(body: bytes, at: int) -> bytes:
    """``body`` with its checksum appended; ``at`` is :func:`seed` of its location."""
    return body + _CRC.pack(zlib.crc32(body, at))


def unseal(value: bytes | memoryview, at: int) -> memoryview:
    """The body of a sealed value (a view, no copy), after checking it."""
    view = memoryview(value)
    if len(view) < SEAL_BYTES:
        raise ChecksumMismatch("value too short to hold its checksum")
    body = view[:-SEAL_BYTES]
    (want,) = _CRC.unpack_from(view, len(view) - SEAL_BYTES)
    if zlib.crc32(body, at) != want:
        raise ChecksumMismatch("checksum mismatch")
    return body


def crc(data: bytes | memoryview) -> int:
    """Plain CRC-32 of ``data`` (self-describing records such as lineage metadata)."""
    return zlib.crc32(data)


def file_digest(path: str | os.PathLike, start: int = 0) -> tuple[int, int]:
    """(size in bytes, CRC-32 seeded with ``start``) of a file."""
    c, n = start, 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHECKSUM_READ_BYTES)
            if not chunk:
                break
            c = zlib.crc32(chunk, c)
            n += len(chunk)
    return n, c


def read_verified(path: str | os.PathLike, size: int, digest: int, start: int = 0) -> bytes:
    """The bytes of a file, checked against its recorded (size, CRC-32 seeded with
    ``start``).  Callers use these bytes (not the file again), so what was checked is
    what is used."""
    p = Path(path)
    try:
        fd = open_regular(p, "file")       # not a link, a FIFO or a device: never blocks
        try:
            data = read_fd(fd, size)       # at most one byte more than was written
        finally:
            os.close(fd)
    except FileNotFoundError as err:
        raise ChecksumMismatch("missing") from err
    except UnsafeFile as e:
        raise ChecksumMismatch(str(e).removeprefix(f"file {p} ")) from e
    except OSError as e:
        raise ChecksumMismatch(f"unreadable ({e.strerror or e})") from e
    return verified(data, size, digest, longer="more than ", start=start)


def verified(data: bytes, size: int, digest: int, longer: str = "", start: int = 0) -> bytes:
    """``data``, checked against its recorded (size, CRC-32 seeded with ``start``)
    (``longer``: what to say before a size read past the recorded one)."""
    if len(data) != size:
        raise ChecksumMismatch(f"{longer if len(data) > size else ''}{len(data)} bytes, "
                               f"{size} were written")
    if zlib.crc32(data, start) != digest:
        raise ChecksumMismatch("checksum mismatch")
    return data


# -- the extent of an LMDB data file ----------------------------------------------------
_LMDB_MAGIC = 0xBEEFC0DE
_META_PAGE = struct.Struct("<II")          # at offset 16 of a meta page: magic, version
_META_PSIZE = struct.Struct("<I")          # at 40: the free DB's md_pad, the page size
_META_LAST = struct.Struct("<QQ")          # at 136: last page number, transaction id


def lmdb_extent(data_file: Path) -> int | None:
    """Bytes an LMDB data file must hold, by its meta pages (None: no valid meta page,
    which LMDB itself refuses).

    A reader maps the file read-only; LMDB checks page numbers against the last page
    its meta records, not against the file, so a truncated file would be read past its
    end and the process killed by SIGBUS.  Comparing the file's size with this extent
    first turns truncation into an error.  Both meta pages count (the larger extent),
    so a damaged meta page errs towards refusing."""
    fd = open_regular(data_file, "lineage file")
    try:
        return lmdb_extent_of(fd)
    finally:
        os.close(fd)


def lmdb_extent_of(fd: int) -> int | None:
    """:func:`lmdb_extent` of an open data file (read with ``pread``: the file's
    position is left alone)."""
    head = os.pread(fd, 16 + 152, 0)
    if len(head) < 152:
        return None
    psize = _META_PSIZE.unpack_from(head, 40)[0]
    pages = [head]
    if 152 <= psize <= 1 << 16:
        pages.append(os.pread(fd, 152, psize))
    extent = None
    for pg in pages:
        if len(pg) < 152 or _META_PAGE.unpack_from(pg, 16)[0] != _LMDB_MAGIC:
            continue
        last = _META_LAST.unpack_from(pg, 136)[0]
        need = (last + 1) * psize
        extent = need if extent is None else max(extent, need)
    return extent
