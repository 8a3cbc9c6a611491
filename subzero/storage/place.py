"""Identities that stored bytes are bound to: the store's and each run's.

A checksum proves that bytes are intact; it must also prove *where* they belong.
Every store has a random uid, kept in ``store.json`` at its root and in its
catalog; every run has one, kept in its catalog row and in its signed record.
A run's stored bytes are bound to its uid (lineage values are sealed with
checksums seeded with it, array chunk manifests name it), so a piece copied,
swapped or restored from another run or store fails its check like damage.
The two copies of the store's uid catch a catalog taken from another store;
``store.json`` also tells a store whose catalog was lost from a new one.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from subzero.errors import StoreError
from subzero.storage.files import read_regular

#: the store's identity file, at its root
STORE_FILE = "store.json"
STORE_FORMAT = 1
#: the largest store.json read (it holds a few short fields)
_STORE_FILE_BYTES = 1 << 16


def new_uid() -> str:
    """A random identity: 128 bits, hex."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Place:
    """Where a run's bytes belong: the run's uid (and the store's, where known).  A run
    made before runs had uids has no place: its bytes read as unbound."""

    run_uid: str
    store_uid: str | None = None

    @property
    def tag(self) -> bytes:
        """The bytes checksums are seeded with."""
        return bytes.fromhex(self.run_uid)


def read_store_uid(root: Path) -> str | None:
    """The uid in a store's ``store.json`` (None when it has none: a store made before
    stores had one).  A file that is not a small regular file, or does not parse, is
    a one-line StoreError naming it."""
    path = Path(root) / STORE_FILE
    try:
        data = read_regular(path, _STORE_FILE_BYTES, "the store's identity file")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(f"the store's identity file {path} cannot be read: {e.strerror or e}") from e
    try:
        uid = json.loads(data)["uid"]
        bytes.fromhex(uid)
    except (ValueError, KeyError, TypeError) as err:
        raise StoreError(f"the store's identity file {path} is damaged: it holds no store "
                         f"uid") from err
    return str(uid)


def write_store_uid(root: Path, uid: str) -> None:
    """Write ``store.json`` atomically (a reader sees none or all of it)."""
    path = Path(root) / STORE_FILE
    tmp = path.with_name(f".{STORE_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "x") as f:
            json.dump({"format": STORE_FORMAT, "uid": uid}, f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write the store's identity file {path}: {e.strerror or e}") from e
