"""Checksummed Zarr arrays: damage to a stored array is found, never read as data.

Every array node (the data array and its coordinate arrays) is written with a
``crc32c`` codec after its compressor, so each chunk file carries a checksum
that zarr verifies before it decompresses.  Chunks that hold only the fill
value are written too (``write_empty_chunks``): a chunk file that is missing
therefore always means damage, where zarr alone would quietly read fill values.
The ``zarr.json`` metadata files get a SHA-256 digest in a sidecar file beside
the ``.zarr`` folder (:func:`sums_file`; inside it, zarr would warn about an
unknown object to anyone opening the group) once the array's metadata is
final, checked on every open.

Arrays written before checksums existed (no sidecar, no ``crc32c`` codec) still
read; only their undecodable chunks are reported, since a missing chunk of such
an array cannot be told from an all-fill-value one.

The checks cost what the read costs: a region read checks the chunk files the
region touches (one ``stat`` each) and the few small metadata files; the
checksum of a chunk is verified by zarr as it decodes it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from subzero.errors import CorruptArray, UnsafeFile
from subzero.storage.files import read_regular
from subzero.tuning import METADATA_BYTES

#: suffix of the sidecar file beside an array's ``.zarr`` folder: its metadata digests
SUMS = ".sums.json"
SUMS_FORMAT = 1
_CRC = "crc32c"


def checksum_codecs() -> list:
    """The bytes-to-bytes codecs of every array SubZero writes: compress, then checksum
    (so a damaged chunk fails its checksum before the decompressor sees it)."""
    from zarr.codecs import Crc32cCodec, ZstdCodec
    return [ZstdCodec(), Crc32cCodec()]


@dataclass(frozen=True)
class ArrayNode:
    """One Zarr array of a stored array's group, as its (verified) metadata describes it."""

    path: str                     # relative to the .zarr folder: "data", or a coordinate
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    separator: str
    checksummed: bool             # crc32c codec and a regular default-keyed chunk grid

    def grid(self) -> tuple[int, ...]:
        if any(n == 0 for n in self.shape):
            return tuple(0 for _ in self.shape)
        return tuple(-(-n // c) for n, c in zip(self.shape, self.chunks))

    def chunk_file(self, root: Path, idx: tuple[int, ...]) -> Path:
        key = "c" + "".join(f"{self.separator}{k}" for k in idx)
        return root / self.path / key

    def touched(self, region: tuple[slice, ...] | None) -> Iterator[tuple[int, ...]]:
        """Chunk indices a region (slices, as for numpy; None = everything) reads."""
        ranges = []
        for d, (n, c) in enumerate(zip(self.shape, self.chunks)):
            s = region[d] if region is not None and d < len(region) else slice(None)
            a, b, step = s.indices(n)
            if step < 0:
                a, b = b + 1, a + 1
            if b <= a or n == 0:
                return
            ranges.append(range(a // c, (b - 1) // c + 1))
        yield from itertools.product(*ranges)


def sums_file(root: Path) -> Path:
    """The digest file of the array stored at ``root`` (``x.zarr`` -> ``x.sums.json``)."""
    return root.with_name(root.name.removesuffix(".zarr") + SUMS)


def read_metadata(path: Path) -> bytes:
    """A metadata or digest file's bytes: a regular file (not a link, a FIFO, a
    device), at most :data:`~subzero.tuning.METADATA_BYTES`; else
    :class:`~subzero.errors.UnsafeFile`."""
    return read_regular(path, METADATA_BYTES, "metadata file", limit_name="METADATA_BYTES")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _metadata_files(root: Path) -> list[str]:
    """The group's and its arrays' ``zarr.json`` (xarray writes a flat group)."""
    out = ["zarr.json"] if (root / "zarr.json").exists() else []
    for child in sorted(root.iterdir()):
        if child.is_dir() and (child / "zarr.json").exists():
            out.append(f"{child.name}/zarr.json")
    return out


def seal(root: Path) -> None:
    """Record the digests of the array's metadata files; called once its metadata is final
    (after :meth:`ArrayStore.write`, and after :meth:`ArrayStore.create`: region writes
    add chunks but never rewrite metadata)."""
    meta = {rel: _digest((root / rel).read_bytes()) for rel in _metadata_files(root)}
    body = {"format": SUMS_FORMAT, "metadata": meta}
    body["digest"] = _digest(json.dumps(meta, sort_keys=True).encode())
    dest = sums_file(root)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
    os.replace(tmp, dest)


def _node(rel: str, meta: dict) -> ArrayNode:
    path = rel.rsplit("/", 1)[0]
    shape = tuple(int(n) for n in meta.get("shape", ()))
    grid = meta.get("chunk_grid") or {}
    keys = meta.get("chunk_key_encoding") or {}
    codecs = [c.get("name") if isinstance(c, dict) else c for c in meta.get("codecs", ())]
    regular = grid.get("name") == "regular" and keys.get("name") == "default"
    chunks = tuple(int(c) for c in (grid.get("configuration") or {}).get("chunk_shape", shape))
    sep = (keys.get("configuration") or {}).get("separator", "/")
    ok = regular and _CRC in codecs and "sharding_indexed" not in codecs and len(chunks) == len(shape)
    return ArrayNode(path, shape, chunks if ok else shape, sep, ok)


def open_nodes(root: Path, label: str) -> dict[str, ArrayNode] | None:
    """Verify the metadata of the array stored at ``root`` against its digests and return
    its array nodes by path; None for an array written before checksums (nothing to
    verify).  ``label`` names the array and run in errors ("array 'x' of run 3")."""
    sums_path = sums_file(root)
    try:
        raw = read_metadata(sums_path)
    except FileNotFoundError:
        _legacy_or_lost(root, label)
        return None
    except UnsafeFile as e:
        raise CorruptArray(f"{label} is damaged: {e}") from e
    except OSError as e:
        raise CorruptArray(f"{label} cannot be read: {sums_path}: {e.strerror or e}") from e
    try:
        body = json.loads(raw)
        meta = body["metadata"]
        ok = isinstance(meta, dict) and body.get("digest") == _digest(
            json.dumps(meta, sort_keys=True).encode())
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise CorruptArray(f"{label} is damaged: its checksum file {sums_path} is unreadable "
                           f"or fails its own digest")
    nodes = {}
    for rel, want in sorted(meta.items()):
        f = root / rel
        try:
            data = read_metadata(f)
        except FileNotFoundError as err:
            raise CorruptArray(f"{label} is damaged: its metadata file {f} is missing") from err
        except UnsafeFile as e:
            raise CorruptArray(f"{label} is damaged: {e}") from e
        except OSError as e:
            raise CorruptArray(f"{label} cannot be read: {f}: {e.strerror or e}") from e
        if _digest(data) != want:
            raise CorruptArray(f"{label} is damaged: its metadata file {f} fails its checksum")
        if rel != "zarr.json":
            node = _node(rel, json.loads(data))
            nodes[node.path] = node
    if "data" not in nodes:
        raise CorruptArray(f"{label} is damaged: its checksum file {sums_path} lists no data array")
    return nodes


def _legacy_or_lost(root: Path, label: str) -> None:
    """No digest file: fine for an array written before checksums; damage for one whose
    data array declares the checksum codec (its digest file was lost)."""
    meta = root / "data" / "zarr.json"
    try:
        codecs = json.loads(read_metadata(meta)).get("codecs", ())
    except FileNotFoundError as err:
        raise CorruptArray(f"{label} is damaged: its metadata file {meta} is missing") from err
    except UnsafeFile as e:
        raise CorruptArray(f"{label} is damaged: {e}") from e
    except (OSError, ValueError, AttributeError) as err:
        raise CorruptArray(f"{label} is damaged: its metadata file {meta} is unreadable") from err
    if any(isinstance(c, dict) and c.get("name") == _CRC for c in codecs):
        raise CorruptArray(f"{label} is damaged: its checksum file {sums_file(root)} is missing")


def check_present(root: Path, node: ArrayNode, region: tuple[slice, ...] | None,
                  label: str) -> None:
    """Every chunk file the region reads exists (a checksummed array writes them all)."""
    if not node.checksummed:
        return
    base = f"{root / node.path}{os.sep}c"
    sep = node.separator
    isfile = os.path.isfile
    for idx in node.touched(region):            # one stat per chunk, no Path objects
        if not isfile(base + "".join(f"{sep}{k}" for k in idx)):
            raise CorruptArray(f"{label} is damaged: chunk file {node.chunk_file(root, idx)} "
                               f"is missing")


def bad_chunk(root: Path, node: ArrayNode, region: tuple[slice, ...] | None) -> str | None:
    """After a failed read: the first chunk file of the region that is missing, unreadable
    or fails its crc32c, described for an error message (None when all are sound).
    Only runs on the error path, so reading every touched chunk again is fine."""
    if not node.checksummed:
        return None
    import google_crc32c
    for idx in node.touched(region):
        f = node.chunk_file(root, idx)
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            return f"chunk file {f} is missing"
        except OSError as e:
            return f"chunk file {f} cannot be read ({e.strerror or e})"
        if len(data) < 4 or google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
            return f"chunk file {f} fails its checksum"
    return None
