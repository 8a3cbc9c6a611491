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

**Bound to their place** (sidecar format 2).  A checksum proves that a chunk is
intact, not that it is the chunk its place names: a chunk swapped with another
of the same array, or copied from another run, passes zarr's check.  So in a
run with a uid the sidecar also names the run (its uid) and the array, and,
once the array's chunks are final (:func:`bind`, which the driver loop calls
after each operator's step and after the inputs are stored, before the
journal says so), holds a *manifest*: per array node, the 4-byte crc32c
trailer of every chunk file, in the C order of the chunk grid.  A read then
opens each chunk it touches without following links or blocking
(``O_NOFOLLOW | O_NONBLOCK``), requires a regular file, and compares its last
4 bytes (one ``pread``) with the manifest's; zarr checks the body against that
trailer as it decodes.  A swapped, foreign, linked or FIFO chunk is therefore
a :class:`CorruptArray` naming the chunk ("is not the chunk its place names"),
and an array folder taken from another run fails on its sidecar ("belongs to
another run").  The sidecar's ``digest`` covers the metadata digests as in
format 1 (so an older SubZero still reads the array), its ``seal`` covers all
of it; the run's signed record lists each sidecar's SHA-256
(:meth:`~subzero.storage.arrays.ArrayStore.sidecar_digests`), so the signature
covers every manifest.  Arrays without a manifest (runs made before runs had
uids, whose sidecars are format 1, and an array read during its own run before
it is bound) keep the checks above; a run with a uid reads only sidecars that
name it, and an unbound run none that name a run.

The checks cost what the read costs: a region read checks the chunk files the
region touches (an open, a ``pread`` of 4 bytes and a close each; one ``lstat``
without a manifest) and the few small metadata files; the checksum of a chunk
is verified by zarr as it decodes it.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import itertools
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from subzero.errors import CorruptArray, UnsafeFile
from subzero.storage.files import read_array_file, read_regular
from subzero.tuning import METADATA_BYTES

#: suffix of the sidecar file beside an array's ``.zarr`` folder: its metadata digests
SUMS = ".sums.json"
#: 1: metadata digests; 2: also the run's uid, the array's name and the chunk manifest;
#: 3: an array not kept (:func:`drop`): also each data chunk's SHA-256 (what this reads up to)
SUMS_FORMAT = 3
#: the format of a bound array's sidecar (format 3 only for an array not kept, so that an
#: older SubZero says it is too old for it instead of calling its missing chunks damage)
BOUND_SUMS_FORMAT = 2
#: the sidecar format of an unbound run (a run made before runs had uids)
UNBOUND_SUMS_FORMAT = 1
_CRC = "crc32c"
#: bytes of a chunk file's crc32c trailer (zarr's codec appends it)
TRAILER = 4
#: bytes of a chunk's SHA-256, as an array not kept records it
CHUNK_SHA = 32
#: how a chunk file is opened to check it: never through a link, never waiting on a FIFO
_OPEN_CHUNK = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


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
    #: the manifest: each chunk file's crc32c trailer, in C order of the grid (None: unbound)
    trailers: bytes | None = None
    #: an array not kept (:func:`drop`): the SHA-256 of each chunk's values (C-order bytes),
    #: in C order of the grid, against which a recomputed array is checked; None: kept
    dropped: bytes | None = None

    def chunk_index(self, idx: tuple[int, ...], grid: tuple[int, ...] | None = None) -> int:
        """The chunk's position in C order of the grid (the manifests' order); ``grid``:
        :meth:`grid`, when the caller has it (a loop over many chunks)."""
        k = 0
        for i, n in zip(idx, grid if grid is not None else self.grid()):
            k = k * n + i
        return k

    def chunk_slices(self, idx: tuple[int, ...]) -> tuple[slice, ...]:
        """The region of the array a chunk holds."""
        return tuple(slice(i * c, min((i + 1) * c, n))
                     for i, c, n in zip(idx, self.chunks, self.shape))

    def chunks_all(self) -> Iterator[tuple[int, ...]]:
        """Every chunk index of the grid, in C order."""
        return itertools.product(*(range(n) for n in self.grid()))

    def chunk_count(self) -> int:
        """The chunks of the grid (what each manifest holds one entry of)."""
        n = 1
        for k in self.grid():
            n *= k
        return n

    def chunk_sum(self, idx: tuple[int, ...]) -> bytes:
        """The SHA-256 an array not kept recorded for chunk ``idx``'s values."""
        assert self.dropped is not None
        k = self.chunk_index(idx)
        return self.dropped[CHUNK_SHA * k:CHUNK_SHA * (k + 1)]

    def grid(self) -> tuple[int, ...]:
        if any(n == 0 for n in self.shape):
            return tuple(0 for _ in self.shape)
        return tuple(-(-n // c) for n, c in zip(self.shape, self.chunks))

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        return "c" + "".join(f"{self.separator}{k}" for k in idx)

    def chunk_file(self, root: Path, idx: tuple[int, ...]) -> Path:
        return root / self.path / self.chunk_key(idx)

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


def metadata_files(root: Path) -> list[str]:
    """The group's and its arrays' ``zarr.json`` (xarray writes a flat group)."""
    out = ["zarr.json"] if (root / "zarr.json").exists() else []
    for child in sorted(root.iterdir()):
        if child.is_dir() and (child / "zarr.json").exists():
            out.append(f"{child.name}/zarr.json")
    return out


def _sealed(body: dict) -> str:
    """The digest of a format-2 sidecar: everything in it but the digest itself."""
    return _digest(json.dumps({k: v for k, v in body.items() if k != "seal"},
                              sort_keys=True).encode())


def _write_sums(root: Path, body: dict) -> None:
    dest = sums_file(root)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
    os.replace(tmp, dest)


def seal(root: Path, array: str | None = None, run_uid: str | None = None,
         owner: str = "run") -> None:
    """Record the digests of the array's metadata files; called once its metadata is final
    (after :meth:`ArrayStore.write`, and after :meth:`ArrayStore.create`: region writes
    add chunks but never rewrite metadata).  In a run with a uid (``run_uid``) the
    sidecar also names the run and the array (format 2); :func:`bind` adds the chunk
    manifest once the chunks are final.  ``owner`` says what ``run_uid`` is the uid of:
    a run, or the store for an input stored once (:mod:`.shared`)."""
    meta = {rel: _digest((root / rel).read_bytes()) for rel in metadata_files(root)}
    body: dict = {"format": UNBOUND_SUMS_FORMAT, "metadata": meta,
                  "digest": _digest(json.dumps(meta, sort_keys=True).encode())}
    if run_uid is not None:
        body.update({"format": BOUND_SUMS_FORMAT, "run": run_uid, "array": array,
                     "chunks": None})
        if owner != "run":
            body["owner"] = owner
        body["seal"] = _sealed(body)
    _write_sums(root, body)


def bind(root: Path, array: str, run_uid: str, label: str, owner: str = "run") -> None:
    """Bind the array's chunks to their place: record every chunk file's crc32c trailer
    in the sidecar (the manifest), once its chunks are final.  Every chunk of the grid
    must be there, a regular file (a missing one is damage: the array is incomplete)."""
    body = _read_sums(root, label, run_uid, array, owner)
    if body is None:
        raise CorruptArray(f"{label} cannot be bound: its checksum file {sums_file(root)} "
                           f"is missing")
    chunks = {}
    for path, node in _nodes(root, body, label).items():
        if node.checksummed:
            chunks[path] = _manifest(root, node, label).hex()
    body["chunks"] = chunks
    body["seal"] = _sealed(body)
    _write_sums(root, body)


def _manifest(root: Path, node: ArrayNode, label: str) -> bytes:
    """The crc32c trailers of every chunk file of ``node``, in C order of its grid."""
    base = f"{root / node.path}{os.sep}"
    out = []
    for idx in node.chunks_all():
        got = _read_trailer(base + node.chunk_key(idx))
        if isinstance(got, str):
            raise CorruptArray(f"{label} cannot be bound: chunk file "
                               f"{node.chunk_file(root, idx)} {got}")
        out.append(got)
    return b"".join(out)


def _read_trailer(path: str) -> bytes | str:
    """The last :data:`TRAILER` bytes of a chunk file, or what is wrong with it (see
    :func:`read_chunk`)."""
    return read_chunk(path, tail=True)


def read_chunk(path: str, tail: bool = False) -> bytes | str:
    """A chunk file's bytes (``tail``: only its crc32c trailer), or what is wrong with it,
    as an error message says it after the file's name: opened without following a link
    or waiting on a FIFO, and only when a regular file long enough to hold a checksum."""
    try:
        fd = os.open(path, _OPEN_CHUNK)
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a link, not the chunk its place names"
        return f"cannot be read ({e.strerror or e})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file, not the chunk its place names"
        if st.st_size < TRAILER:
            return "fails its checksum (too short to hold one)"
        if tail:
            return os.pread(fd, TRAILER, st.st_size - TRAILER)
        return os.pread(fd, st.st_size, 0)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)


def misplaced(what: str) -> bool:
    """Whether :func:`read_chunk`'s complaint says the file is not the chunk its place
    names (a link, a FIFO) rather than damaged."""
    return what.endswith("not the chunk its place names")


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


def open_nodes(root: Path, label: str, run_uid: str | None = None,
               array: str | None = None, owner: str = "run") -> dict[str, ArrayNode] | None:
    """Verify the metadata of the array stored at ``root`` against its digests, and its
    sidecar's place (the run ``run_uid`` and the array ``array``; see the module's
    docstring), and return its array nodes by path, each with its chunk manifest when
    the array is bound; None for an array written before checksums (nothing to
    verify).  ``label`` names the array and run in errors ("array 'x' of run 3");
    ``owner`` says whose uid ``run_uid`` is (a run's, or the store's for an input
    stored once)."""
    body = _read_sums(root, label, run_uid, array, owner)
    if body is None:
        if run_uid is not None:
            raise CorruptArray(f"{label} is damaged: its checksum file {sums_file(root)} is "
                               f"missing")
        _legacy_or_lost(root, label)
        return None
    nodes = _nodes(root, body, label)
    chunks = body.get("chunks")
    if chunks:
        for path, node in list(nodes.items()):
            if not node.checksummed:
                continue
            try:
                trailers = bytes.fromhex(chunks[path])
            except (KeyError, TypeError, ValueError):
                trailers = b""
            if len(trailers) != TRAILER * node.chunk_count():
                raise CorruptArray(f"{label} is damaged: its checksum file {sums_file(root)} "
                                   f"has no manifest of the chunks of {path!r}")
            nodes[path] = dataclasses.replace(node, trailers=trailers)
    dropped = body.get("dropped")
    if dropped is not None:
        node = nodes["data"]
        try:
            sums = bytes.fromhex(dropped["data"])
        except (KeyError, TypeError, ValueError):
            sums = b""
        if not node.checksummed or len(sums) != CHUNK_SHA * node.chunk_count():
            raise CorruptArray(f"{label} is damaged: its checksum file {sums_file(root)} has "
                               f"no checksums of the values it did not keep")
        nodes["data"] = dataclasses.replace(node, dropped=sums)
    return nodes


def chunk_sha(values: np.ndarray) -> bytes:
    """The SHA-256 of one chunk's values as :func:`drop` records them: the chunk's dtype
    string, shape and C-order bytes (a recomputed chunk of another dtype or shape never
    matches)."""
    v = np.ascontiguousarray(values)
    h = hashlib.sha256(f"{v.dtype.str}{v.shape}".encode())
    h.update(v.tobytes())
    return h.digest()


def drop(root: Path, array: str, run_uid: str, label: str, sums: bytes) -> None:
    """Stop keeping a bound array's values: record ``sums`` (each data chunk's
    :func:`chunk_sha`, in C order) in its sidecar, sealed, then remove its data chunk
    files.  Its metadata and coordinates stay, so its shape, dtype and labels read as
    before, and a read recomputes its values and checks them chunk by chunk against
    ``sums``.  The sidecar is written first: a crash before the chunks are gone leaves
    an array read as not kept (its leftover chunks are never read)."""
    body = _read_sums(root, label, run_uid, array)
    if body is None or not body.get("chunks"):
        raise CorruptArray(f"{label} cannot be dropped: it is not bound (no chunk manifest)")
    node = _nodes(root, body, label)["data"]
    body.update({"format": SUMS_FORMAT, "dropped": {"data": sums.hex()}})
    body["seal"] = _sealed(body)
    _write_sums(root, body)
    remove_chunks(root, node)


def remove_chunks(root: Path, node: ArrayNode) -> None:
    """Remove every chunk file of ``node`` (of an array not kept), and the folders of the
    chunk grid they leave empty (a folder takes a block of its own)."""
    for idx in node.chunks_all():
        try:
            os.unlink(node.chunk_file(root, idx))
        except FileNotFoundError:
            pass
    grid = root / node.path / "c"
    if grid.is_dir() and not grid.is_symlink():
        for here, _dirs, _files in sorted(os.walk(grid, topdown=False), reverse=True):
            try:
                os.rmdir(here)
            except OSError:
                pass                          # not empty: something else is there


def _read_sums(root: Path, label: str, run_uid: str | None, array: str | None,
               owner: str = "run") -> dict | None:
    """The array's sidecar, verified (its own digests) and checked to be of this run and
    array; None when there is none."""
    sums_path = sums_file(root)
    raw = read_array_file(sums_path, METADATA_BYTES, "metadata file", label,
                          limit_name="METADATA_BYTES")
    if raw is None:
        return None
    try:
        body = json.loads(raw)
        meta = body["metadata"]
        version = body.get("format", UNBOUND_SUMS_FORMAT)
        ok = isinstance(meta, dict) and isinstance(version, int) and body.get("digest") == _digest(
            json.dumps(meta, sort_keys=True).encode())
        if ok and version > UNBOUND_SUMS_FORMAT:
            ok = version > SUMS_FORMAT or body.get("seal") == _sealed(body)
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise CorruptArray(f"{label} is damaged: its checksum file {sums_path} is unreadable "
                           f"or fails its own digest")
    if version > SUMS_FORMAT:
        raise CorruptArray(f"{label} was written by a newer SubZero (checksum format {version}; "
                           f"this one reads up to {SUMS_FORMAT}): upgrade SubZero to read it")
    run = body.get("run") if version > UNBOUND_SUMS_FORMAT else None
    if run is not None and body.get("owner", "run") != owner:
        raise CorruptArray(f"{label} is not the array its place names: its checksum file "
                           f"{sums_path} is of a {body.get('owner', 'run')}'s array, not a {owner}'s")
    if run != run_uid:
        if run is None:
            raise CorruptArray(f"{label} is not bound to this {owner} (uid {run_uid}): its checksum "
                               f"file {sums_path} names no run (copied from a run made before "
                               f"runs had uids?)")
        mine = f"not this run's ({run_uid})" if run_uid is not None else \
            "and this run has no uid (made before runs had uids)"
        if owner != "run":
            mine = f"not this {owner}'s ({run_uid})"
        raise CorruptArray(f"{label} belongs to another {owner}: its checksum file {sums_path} "
                           f"names {owner} uid {run}, {mine}")
    if run is not None and array is not None and body.get("array") != array:
        raise CorruptArray(f"{label} is not the array its place names: its checksum file "
                           f"{sums_path} is of array {body.get('array')!r}")
    return dict(body)


def _nodes(root: Path, body: dict, label: str) -> dict[str, ArrayNode]:
    """The array's nodes, from its metadata files checked against the sidecar's digests."""
    nodes = {}
    for rel, want in sorted(body["metadata"].items()):
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
        raise CorruptArray(f"{label} is damaged: its checksum file {sums_file(root)} lists no "
                           f"data array")
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
    """Every chunk file the region reads is there as a regular file (a checksummed array
    writes them all) and, in a bound array, is the chunk its place names: its crc32c
    trailer is the manifest's (zarr then checks the body against the trailer)."""
    if not node.checksummed:
        return
    base = f"{root / node.path}{os.sep}c"
    sep = node.separator
    if node.trailers is None:
        lstat, isreg = os.lstat, stat.S_ISREG
        for idx in node.touched(region):            # one lstat per chunk, no Path objects
            try:
                mode = lstat(base + "".join(f"{sep}{k}" for k in idx)).st_mode
            except FileNotFoundError:
                mode = 0
            except OSError as e:
                raise CorruptArray(f"{label} cannot be read: chunk file "
                                   f"{node.chunk_file(root, idx)}: {e.strerror or e}") from e
            if not isreg(mode):
                what = "is missing" if mode == 0 else "is not a regular file"
                raise CorruptArray(f"{label} is damaged: chunk file {node.chunk_file(root, idx)} "
                                   f"{what}")
        return
    trailers, grid = node.trailers, node.grid()
    for idx in node.touched(region):
        got = _read_trailer(base + "".join(f"{sep}{k}" for k in idx))
        k = node.chunk_index(idx, grid)
        if got == trailers[TRAILER * k:TRAILER * (k + 1)]:
            continue
        f = node.chunk_file(root, idx)
        if isinstance(got, str):
            raise CorruptArray(f"{label}{': ' if misplaced(got) else ' is damaged: '}chunk file {f} "
                               f"{got}")
        if _self_consistent(f):
            raise CorruptArray(f"{label}: chunk file {f} is not the chunk its place names (its "
                               f"checksum is not the one the array's manifest records for it)")
        raise CorruptArray(f"{label} is damaged: chunk file {f} fails its checksum")


def _sound(fd: int, want: bytes | None) -> bool:
    """Whether the open chunk file ``fd`` is a regular file whose body matches its crc32c
    trailer, and whose trailer is ``want`` (the manifest's; None: not bound)."""
    import google_crc32c
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return False
    data = os.pread(fd, st.st_size, 0)
    return len(data) >= TRAILER and (want is None or data[-TRAILER:] == want) and \
        google_crc32c.value(data[:-TRAILER]) == int.from_bytes(data[-TRAILER:], "little")


def share_chunks(src_root: Path, src: ArrayNode, dst_root: Path, dst: ArrayNode,
                 region: tuple[slice, ...], label: str) -> int:
    """Make the chunks ``region`` covers in array ``src`` (another run's, verified) the
    chunks of array ``dst`` (of the same shape, chunks and codecs): hard links where the
    file system allows, else byte copies; never decoded and encoded again.  Each source
    chunk must be the one its manifest names and sound (else :class:`CorruptArray`,
    and nothing of it is taken); each linked file is checked again once it is ours, so a
    file swapped in between is not kept.  Returns the chunks linked (not copied)."""
    if src.shape != dst.shape or src.chunks != dst.chunks or not (src.checksummed and dst.checksummed):
        raise CorruptArray(f"{label}: its chunks cannot be shared (another layout)")
    grid = src.grid()
    linked = 0
    made: set[Path] = set()     # folders made (a mkdir per chunk was a third of a made run's time)
    for idx in src.touched(region):
        k = src.chunk_index(idx, grid)
        want = src.trailers[TRAILER * k:TRAILER * (k + 1)] if src.trailers is not None else None
        f, g = src.chunk_file(src_root, idx), dst.chunk_file(dst_root, idx)
        if g.parent not in made:
            g.parent.mkdir(parents=True, exist_ok=True)
            made.add(g.parent)
        try:
            os.link(f, g, follow_symlinks=False)
            linked += 1
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
                raise CorruptArray(f"{label} cannot be read: chunk file {f}: {e.strerror or e}") from e
            _copy_chunk(f, g, want, label)
            continue
        try:
            fd = os.open(g, _OPEN_CHUNK)
        except OSError as e:
            g.unlink(missing_ok=True)
            raise CorruptArray(f"{label} cannot be read: chunk file {f}: {e.strerror or e}") from e
        try:
            ok = _sound(fd, want)
        finally:
            os.close(fd)
        if not ok:
            g.unlink(missing_ok=True)
            raise CorruptArray(f"{label}: chunk file {f} is damaged or not the chunk its place names")
    return linked


def _copy_chunk(f: Path, g: Path, want: bytes | None, label: str) -> None:
    try:
        fd = os.open(f, _OPEN_CHUNK)
    except OSError as e:
        raise CorruptArray(f"{label} cannot be read: chunk file {f}: {e.strerror or e}") from e
    try:
        if not _sound(fd, want):
            raise CorruptArray(f"{label}: chunk file {f} is damaged or not the chunk its place names")
        data = os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)
    with open(g, "xb") as out:
        out.write(data)


def _self_consistent(f: Path) -> bool:
    """Whether a chunk file's body matches its own crc32c trailer (after its trailer did not
    match the manifest's: a misplaced chunk, not a damaged one)."""
    import google_crc32c
    data = read_chunk(str(f))
    return not isinstance(data, str) and google_crc32c.value(data[:-TRAILER]) == int.from_bytes(
        data[-TRAILER:], "little")


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
            fd = os.open(f, _OPEN_CHUNK)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return f"chunk file {f} is not a regular file"
                data = os.pread(fd, st.st_size, 0)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return f"chunk file {f} is missing"
        except OSError as e:
            return f"chunk file {f} cannot be read ({e.strerror or e})"
        if len(data) < 4 or google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
            return f"chunk file {f} fails its checksum"
    return None
