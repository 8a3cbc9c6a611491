"""Inputs stored once per store: a night of runs keeps one bias, one dark, one flat.

Every run reads its inputs from its own array store (:class:`.arrays.ArrayStore`).
An input whose content (:mod:`subzero.model.content`) and stored form (dims,
attributes, chunking: what a read gives back besides the values) are those of an
input some run already kept is not copied again: the run's ``arrays/`` folder
holds a small *reference* file (``<name>.input.json``) in place of the array,
and reads of that name go to the store's copy, ``inputs/<digest>-<form>.zarr``.

**Bound like every stored byte.**  A shared copy's sidecar names the store (its
uid) and the input (content digest and form) where a run's array names the run
and the array, with the same chunk manifest; a reference names the run, the
input's name in it, the digest and the store, and carries its own checksum.  So
a shared copy taken from another store, a reference copied from another run and
a damaged reference are refused like damage.  A run's signed record lists each
input's digest and the digest of the sidecar it reads, so the signature covers
the shared copy as it covers a run's own arrays.

**Never lost, never half-written.**  A run stores its inputs in its own folder as
before; when it commits, each input is *published*: the run's copy is cloned
(hard links, copied where links are not possible) into a hidden folder of
``inputs/``, sealed for the store, renamed into place, and only then does the
run's reference replace its copy.  A crash at any instant leaves the run's own
copy, or a reference to a complete shared copy.  A run that finds its input
already shared before it starts writes the reference and skips the copy.
Publishing, referencing and :func:`sweep` (the removal of shared copies no run
refers to any more, by ``subzero clean``) hold the store's input lock, so a
copy is never removed while a run is taking it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from subzero.errors import CorruptArray, StoreError, UnsafeFile
from subzero.storage.files import fsync_dir, read_array_file, read_regular
from subzero.tuning import METADATA_BYTES

#: the store's folder of inputs stored once
INPUTS = "inputs"
#: suffix of a run's reference to a shared input, in its ``arrays/`` folder
REF = ".input.json"
REF_FORMAT = 1
_LOCK = ".lock"


@dataclass(frozen=True)
class Ref:
    """A run's reference to a shared input (the content of its ``<name>.input.json``)."""

    run: str               # the run's uid
    array: str             # the input's name in that run
    digest: str            # content digest (sz1:...)
    form: str              # digest of the stored form (dims, attributes, chunks)
    store: str             # the store's uid
    numpy: bool            # whether the run's operators saw it as numpy, not a DataArray

    @property
    def key(self) -> str:
        """The shared copy's name in ``inputs/``."""
        return shared_key(self.digest, self.form)

    def body(self) -> dict[str, Any]:
        body = {"format": REF_FORMAT, "run": self.run, "array": self.array, "input": self.digest,
                "form": self.form, "store": self.store, "numpy": self.numpy}
        body["seal"] = _seal(body)
        return body


def shared_key(digest: str, form: str) -> str:
    """``sz1:<hex>`` and a form digest -> the shared copy's folder name (without .zarr)."""
    return f"{digest.split(':', 1)[-1]}-{form}"


def owner_name(digest: str, form: str) -> str:
    """What a shared copy's sidecar names as its array (where a run's names the array)."""
    return f"input {digest} {form}"


def _seal(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in body.items() if k != "seal"},
                                     sort_keys=True).encode()).hexdigest()


def ref_path(arrays_dir: Path, name: str) -> Path:
    return Path(arrays_dir) / f"{name}{REF}"


def read_ref(path: Path, label: str) -> Ref | None:
    """The reference at ``path`` (None when there is none), checked against its own seal;
    a damaged one is a :class:`CorruptArray` naming it."""
    raw = read_array_file(path, METADATA_BYTES, "input reference", label, limit_name="METADATA_BYTES")
    if raw is None:
        return None
    try:
        body = json.loads(raw)
        if body.get("format") != REF_FORMAT or body.get("seal") != _seal(body):
            raise ValueError
        return Ref(str(body["run"]), str(body["array"]), str(body["input"]), str(body["form"]),
                   str(body["store"]), bool(body["numpy"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CorruptArray(f"{label} is damaged: its reference to the store's copy {path} is "
                           f"unreadable or fails its own checksum") from None


def write_ref(path: Path, ref: Ref) -> None:
    """Write a reference atomically and durably (a reader sees none or all of it)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    with open(tmp, "x") as f:
        json.dump(ref.body(), f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class SharedInputs:
    """The store's ``inputs/`` folder: each distinct input, stored once."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.dir = self.root / INPUTS

    def path(self, digest: str, form: str) -> Path:
        return self.dir / f"{shared_key(digest, form)}.zarr"

    def has(self, digest: str, form: str) -> bool:
        from subzero.storage.chunks import sums_file
        p = self.path(digest, form)
        return p.is_dir() and not p.is_symlink() and sums_file(p).is_file()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The store's input lock (see the module's docstring): held while a copy is
        published or referenced, and while unreferenced copies are swept."""
        try:
            self.dir.mkdir(exist_ok=True)
            fd = os.open(self.dir / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise StoreError(f"cannot lock the store's inputs folder {self.dir}: "
                             f"{e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def publish(self, src: Path, digest: str, form: str, store_uid: str, label: str) -> None:
        """Make ``src`` (a run's stored input, bound and final) the store's copy of this
        input, unless the store has one; the caller holds :meth:`lock`.  The copy is a
        clone of ``src`` (hard links where possible), sealed for the store in a hidden
        folder and renamed into place, its sidecar first: a reader that sees the folder
        sees its sidecar."""
        from subzero.storage.chunks import bind, seal, sums_file
        if self.has(digest, form):
            return
        dest = self.path(digest, form)
        for stale in self.dir.glob(f".{dest.name}.*"):     # a publication a crash cut short
            shutil.rmtree(stale) if stale.is_dir() and not stale.is_symlink() else stale.unlink()
        tmp = self.dir / f".{dest.name}.{secrets.token_hex(4)}"
        try:
            _clone(src, tmp)
            seal(tmp, owner_name(digest, form), store_uid, owner="store")
            bind(tmp, owner_name(digest, form), store_uid, label, owner="store")
            _fsync_tree(tmp)
            os.replace(sums_file(tmp), sums_file(dest))
            if dest.exists():       # a folder without its sidecar: left by a crash, never read
                shutil.rmtree(dest)
            os.replace(tmp, dest)
            fsync_dir(self.dir)
        except OSError as e:
            raise StoreError(f"cannot store input {digest} in {self.dir}: {e.strerror or e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            sums_file(tmp).unlink(missing_ok=True)

    def copies(self) -> dict[str, Path]:
        """Every shared copy by its key, and what is left beside them (hidden folders of
        publications a crash cut short, sidecars without their folder) by name."""
        out: dict[str, Path] = {}
        if not self.dir.is_dir():
            return out
        for p in self.dir.iterdir():
            if p.name != _LOCK:
                out[p.name] = p
        return out


def references(root: Path) -> tuple[dict[str, list[tuple[Path, Ref]]], list[str]]:
    """Every shared copy some run folder refers to -- complete, partial, task attempts
    and quarantined runs alike, by a reference or in its record -- by key, with the
    run folders and references that name it; and the run folders whose references or
    record could not be read (a sweep then removes nothing: it cannot prove a copy
    unused)."""
    keys: dict[str, list[tuple[Path, Ref]]] = {}
    unreadable: list[str] = []
    for top in (root / "runs", root / "quarantine"):
        if not top.is_dir():
            continue
        for run in sorted(top.iterdir()):
            arrays = run / "arrays"
            if run.is_symlink() or not arrays.is_dir():
                continue
            try:
                files = sorted(f for f in arrays.iterdir() if f.name.endswith(REF))
            except OSError:
                unreadable.append(str(run))
                continue
            for f in files:
                try:
                    ref = read_ref(f, f"input reference {f}")
                except CorruptArray:
                    unreadable.append(str(f))
                    continue
                if ref is not None:
                    keys.setdefault(ref.key, []).append((run, ref))
            # the run's record names the copies it read too: a reference damaged, or copied
            # from another run, must not make the run's own copy look unused
            for key in _recorded(run, unreadable):
                keys.setdefault(key, [])
    return keys, unreadable


def _recorded(run: Path, unreadable: list[str]) -> list[str]:
    """The keys of the store's copies a run folder's record (``run.json``) names."""
    path = run / "run.json"
    try:
        raw = read_regular(path, 1 << 26, "run record")
    except FileNotFoundError:
        return []
    except (OSError, UnsafeFile):
        unreadable.append(str(path))
        return []
    try:
        return [str(a["shared"]) for a in json.loads(raw)["arrays"] if a.get("shared")]
    except (ValueError, KeyError, TypeError, AttributeError):
        unreadable.append(str(path))
        return []


def sweep(root: Path, dry_run: bool = False, ignoring: set[str] | frozenset[str] = frozenset(),
          keep: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Remove the shared copies no run refers to any more, and what interrupted
    publications left; with the input lock held, so no run takes a copy meanwhile.
    Nothing is removed when some run's references cannot be read.  References of the
    run folders ``ignoring`` (paths) do not count (what a dry run of ``clean`` would
    have removed first).  Copies of the content digests ``keep`` (those the catalog names
    for its runs) are kept whatever the run folders say: a run folder replaced by
    another's must not make its input look unused."""
    from subzero.storage.chunks import SUMS
    shared = SharedInputs(root)
    if not shared.dir.is_dir():
        return []
    out: list[dict[str, Any]] = []
    with shared.lock() if not dry_run else contextlib.nullcontext():
        found, unreadable = references(root)
        if unreadable:
            return []
        used = {k for k, runs in found.items() if any(str(r) not in ignoring for r, _ in runs)}
        for name, p in sorted(shared.copies().items()):
            key = name.removesuffix(".zarr").removesuffix(SUMS)
            if name.startswith("."):
                why = "left by a publication a crash cut short"
            elif key in used or f"sz1:{key.rsplit('-', 1)[0]}" in keep:
                continue
            else:
                why = "an input no run refers to any more"
            out.append({"path": str(p), "run": None, "bytes": _bytes(p), "why": why,
                        "action": "remove"})
            if not dry_run:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() \
                    else p.unlink(missing_ok=True)
    return out


def _bytes(p: Path) -> int:
    if p.is_symlink() or p.is_file():
        return p.lstat().st_size
    return sum(f.lstat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def _clone(src: Path, dest: Path) -> None:
    """A copy of the array folder ``src`` at ``dest``: its files hard-linked (they are
    never written again), copied where the file system cannot link; links refused."""
    for folder, dirs, files in os.walk(src):
        rel = os.path.relpath(folder, src)
        target = dest / rel if rel != "." else dest
        target.mkdir(parents=True, exist_ok=False)
        for f in files:
            s = os.path.join(folder, f)
            if os.path.islink(s):
                raise StoreError(f"{s} is a link, not a file of a stored array")
            try:
                os.link(s, target / f, follow_symlinks=False)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copy2(s, target / f, follow_symlinks=False)
        for d in dirs:
            if os.path.islink(os.path.join(folder, d)):
                raise StoreError(f"{os.path.join(folder, d)} is a link, not a folder of a stored array")


def _fsync_tree(root: Path) -> None:
    """Make a cloned copy durable before it is renamed into place."""
    for folder, _dirs, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(folder, f), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))
