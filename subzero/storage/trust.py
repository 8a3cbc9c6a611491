"""Signed runs: a store is data until its user trusts its code.

A run's ``workflow.pkl`` is code (unpickling it can run anything), and so is
the workflow module a trace re-imports when the pickle fails.  SubZero loads
either only for runs it can prove were written — or explicitly accepted — by
this user, as Jupyter does for notebooks: every run is signed at commit with an
HMAC-SHA256 under a secret key kept per user *outside* the store, and loading a
run's operators checks the signature first.  A store from elsewhere, a tampered
run, or one written before signing existed does not verify; such a run stays
readable as data (runs, arrays, traces answered from stored lineage) and
``subzero trust`` re-signs it once its user has looked at what it runs.

What is signed is the run's record, ``runs/<id>/run.json``
(:mod:`subzero.runs.record`): its identity (run and store uids), every field
that steers a trace or a code load, each array's chunk-manifest digest and
the sha256 of ``workflow.pkl``.  The signature (format 2) is an HMAC over the
record's bytes; a verified record is then what traces take their shapes, edges
and strategies from, so an edited catalog row cannot steer them.  Runs made
before records existed were signed over one canonical record made from their
catalog rows (format 1: the pickle's sha256 and the same steering fields);
they verify as before.  The signature lives in ``runs/<id>/signature``
beside what it covers; without the key it cannot be forged.

The key is 32 random bytes, hex, in ``$SUBZERO_CONFIG_DIR/key``, else
``$XDG_CONFIG_HOME/subzero/key``, else ``~/.config/subzero/key``; it is
created on first signing with mode 0600 in a 0700 folder.  Everything here is
plain functions over plain data: no state is kept between calls.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from subzero.errors import StoreError, UnsafeFile, warn
from subzero.storage.catalog import Catalog, RunRow
from subzero.storage.files import read_regular
from subzero.storage.pickles import FILE as PICKLE_FILE
from subzero.storage.pickles import PickleCode, pickle_code
from subzero.tuning import KEY_BYTES, PICKLE_BYTES, SIGNATURE_BYTES

#: Environment variable naming the folder that holds the key (tests, CI, shared setups).
CONFIG_ENV = "SUBZERO_CONFIG_DIR"
KEY_FILE = "key"
#: The signature's file name inside a run's folder.
SIGNATURE_FILE = "signature"
_FORMAT = 1
#: a signature over the bytes of the run's record (run.json)
_RECORD_FORMAT = 2
_ALGORITHM = "hmac-sha256"


# -- the key --------------------------------------------------------------------------------
def config_dir() -> Path:
    """Where this user's SubZero key lives (see the module docstring)."""
    given = os.environ.get(CONFIG_ENV)
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "subzero"


def key_path() -> Path:
    return config_dir() / KEY_FILE


def load_key(create: bool = False) -> bytes | None:
    """This user's signing key; with ``create``, made on first use (0600 in a 0700
    folder), else None when there is none yet.  Raises StoreError naming the file
    when it cannot be read or made."""
    path = key_path()
    try:
        text = _read_key(path)
    except FileNotFoundError:
        if not create:
            return None
        return _create_key(path)
    except OSError as e:
        raise StoreError(f"cannot read the SubZero signing key {path}: {e.strerror or e}") from e
    return _parse_key(path, text)


def _read_key(path: Path) -> str:
    """The key file's text: a regular file of a few bytes (a link the user made in
    their own config folder is followed), read without blocking."""
    try:
        return read_regular(path, KEY_BYTES, "the SubZero signing key", follow=True,
                            limit_name="KEY_BYTES").decode("ascii", "replace")
    except UnsafeFile as e:
        raise StoreError(f"{e}; delete it to make a new one (runs signed with it then need "
                         f"`subzero trust` again)") from e


def _parse_key(path: Path, text: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) < 16:
        raise StoreError(f"the SubZero signing key {path} is malformed; delete it to make a new "
                         f"one (runs signed with it then need `subzero trust` again)")
    try:
        if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            warn(f"the SubZero signing key {path} can be read by other users, who could then "
                 f"make stores that run code here; restrict it with `chmod 600 {path}`")
    except OSError:
        pass
    return key


def _create_key(path: Path) -> bytes:
    """A new key, written so that two processes making one at once agree on it: the
    key is written to a private temporary file and linked into place, which fails
    if another process got there first (whose key is then used)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass                       # another process made it first: use theirs
            except OSError:                # a file system without hard links
                if not path.exists():
                    os.rename(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return _parse_key(path, _read_key(path))
    except OSError as e:
        raise StoreError(f"cannot create the SubZero signing key {path}: {e.strerror or e} "
                         f"(set {CONFIG_ENV} to a private folder SubZero may write)") from e


def key_id(key: bytes) -> str:
    """A short public name of a key (a hash of it): tells "signed by another key" from
    "changed since it was signed" without revealing the key."""
    return hashlib.sha256(b"subzero key id\0" + key).hexdigest()[:16]


# -- what is signed ------------------------------------------------------------------------
def run_record(catalog: Catalog, run_id: int, payload: bytes | None, status: str) -> dict[str, Any]:
    """The signed record of a run: its catalog fields that steer traces and code loads,
    and the sha256 of its workflow pickle (``payload``; None when it has none).
    ``status`` is the run's status (signing happens just before it turns complete)."""
    row = catalog.get_run(run_id)
    return {
        "format": _FORMAT,
        "run": {"id": row.id, "workflow": row.workflow, "source": row.source,
                "params": row.params, "inputs": row.inputs, "engine": row.engine,
                "status": status},
        "ops": [{"name": o["name"], "class": o["class"], "inputs": o["inputs"],
                 "strategies": o["strategies"], "shape": o["shape"]} for o in catalog.ops(run_id)],
        "arrays": [{"name": n, "kind": a["kind"], "shape": list(a["shape"]), "dtype": a["dtype"]}
                   for n, a in catalog.arrays(run_id).items()],
        "payload_sha256": None if payload is None else hashlib.sha256(payload).hexdigest(),
    }


def canonical(record: dict[str, Any]) -> bytes:
    """One byte string per record (sorted keys, no spaces): what the HMAC covers."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode()


def signature_of(key: bytes, record: dict[str, Any]) -> str:
    return hmac.new(key, canonical(record), hashlib.sha256).hexdigest()


def read_payload(folder: Path) -> bytes | None:
    """The run's workflow pickle, None when it has none.  Raises
    :class:`~subzero.errors.UnsafeFile` when it is a link, not a regular file or
    larger than :data:`~subzero.tuning.PICKLE_BYTES`."""
    try:
        return read_regular(Path(folder) / PICKLE_FILE, PICKLE_BYTES, "the workflow pickle",
                            limit_name="PICKLE_BYTES")
    except FileNotFoundError:
        return None


def write_signature(folder: Path, key: bytes, record: dict[str, Any]) -> None:
    """Sign ``record`` into ``folder/signature`` (atomically: a reader sees the old
    signature or the new one)."""
    doc = {"format": _FORMAT, "algorithm": _ALGORITHM, "key_id": key_id(key),
           "signature": signature_of(key, record)}
    _write_doc(folder, doc, record["run"]["id"])


def _write_doc(folder: Path, doc: dict[str, Any], run_id: int, durable: bool = False) -> None:
    path = Path(folder) / SIGNATURE_FILE
    tmp = path.with_name(f".{SIGNATURE_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "x") as f:
            f.write(json.dumps(doc) + "\n")
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write the signature of run {run_id} to {path}: "
                         f"{e.strerror or e}") from e


def sign_run(catalog: Catalog, run_id: int, folder: Path, status: str = "complete") -> None:
    """Sign a run made before records by its catalog rows (format 1); creates this
    user's key on first use."""
    key = load_key(create=True)
    assert key is not None
    write_signature(folder, key, run_record(catalog, run_id, read_payload(folder), status))


def sign_record(folder: Path, record: bytes, run_id: int, key: bytes | None = None) -> None:
    """Sign a run's record (its ``run.json`` bytes) into ``folder/signature``, atomically
    and durably; creates this user's key on first use."""
    if key is None:
        key = load_key(create=True)
        assert key is not None
    doc = {"format": _RECORD_FORMAT, "algorithm": _ALGORITHM, "key_id": key_id(key),
           "covers": "run.json", "signature": hmac.new(key, record, hashlib.sha256).hexdigest()}
    _write_doc(folder, doc, run_id, durable=True)


# -- verifying -------------------------------------------------------------------------------
TRUSTED, UNSIGNED, OTHER_KEY, MODIFIED = "trusted", "unsigned", "other key", "modified"
#: its signature or workflow.pkl is not a file that can be read (a link, a FIFO, too big)
DAMAGED = "damaged"

_WHY = {
    UNSIGNED: "it carries no signature (written elsewhere, or by a SubZero before runs were "
              "signed)",
    OTHER_KEY: "it was signed with another user's key (a store from elsewhere)",
    MODIFIED: "its operators or catalog entry changed since it was signed",
    DAMAGED: "its signature or workflow.pkl cannot be read (damaged or replaced)",
}
#: what changed, for a run with a record (format 2)
PICKLE_CHANGED = "its workflow.pkl changed since it was signed"
RECORD_CHANGED = "its record (run.json) changed since it was signed"


@dataclass(frozen=True)
class Verdict:
    """Whether a run's code may be loaded, and the exact pickle bytes that were
    verified (load those, not the file again: it could change in between)."""

    state: str
    payload: bytes | None = field(default=None, repr=False)
    #: the record's bytes when its signature verified with this user's key (what traces
    #: then take their shapes, edges and strategies from); None otherwise
    record: bytes | None = field(default=None, repr=False)
    #: what exactly is wrong or changed, when the state alone does not say
    detail: str = ""
    #: the signature verifies, but over the record of another run or another store's run:
    #: the run's folder was taken from elsewhere (trusting it again cannot make it this run)
    misplaced: bool = False
    #: the verified pickle's SHA-256, when the run is trusted by its record (runs whose
    #: pickles have one digest have the same operators)
    payload_sha256: str | None = None

    @property
    def trusted(self) -> bool:
        return self.state == TRUSTED

    @property
    def why(self) -> str:
        """Why the run is not trusted, in a user's words ("" when it is)."""
        return self.detail or _WHY.get(self.state, "")


class Checks:
    """What the trust checks of one query over many runs share: this user's key,
    loaded once, and the workflow pickles already verified, by digest.  A run's
    pickle that is byte for byte one verified has that digest (one comparison
    instead of a SHA-256), and runs whose pickles are equal may share the operators
    loaded from them (``loaded``).  Every run's signature is still checked; nothing
    is kept beyond the query."""

    def __init__(self, vouchers: Mapping[int, Voucher] | None = None) -> None:
        #: a Spark task's: the driver's check of each run's signature (no key here)
        self.vouchers = vouchers
        self._key: bytes | None = None
        self._key_loaded = False
        self._payloads: dict[str, bytes] = {}
        #: operators loaded from a verified pickle, by its digest (the store's to fill)
        self.loaded: dict[str, Any] = {}

    def key(self) -> bytes | None:
        if not self._key_loaded:
            self._key, self._key_loaded = load_key(create=False), True
        return self._key

    def digest(self, payload: bytes, expected: str | None) -> str:
        """The SHA-256 of ``payload``, known without hashing when it equals the pickle
        verified with digest ``expected``."""
        if expected is not None and self._payloads.get(expected) == payload:
            return expected
        d = hashlib.sha256(payload).hexdigest()
        if d == expected:
            self._payloads[d] = payload
        return d


def verify_run(catalog: Catalog, row: RunRow, folder: Path, record: bytes | None = None,
               checks: Checks | None = None) -> Verdict:
    """Check a run's signature against this user's key (never creates the key).
    ``record``: the bytes of the run's record (``run.json``) when it has one.  A
    signature or pickle that is a link, not a regular file or too big is
    :data:`DAMAGED` (nothing more of it is read).  ``checks``: what a query over many
    runs verified already (:class:`Checks`); with vouchers (a Spark task), the
    driver's check of each signature stands in for the key."""
    try:
        payload = read_payload(folder)
    except UnsafeFile as e:
        return Verdict(DAMAGED, None, detail=f"{e} (damaged or replaced)")
    if checks is not None and checks.vouchers is not None:
        return _vouched(checks.vouchers.get(row.id), payload, record, checks)
    signed = _signature(catalog, row, folder, record,
                        checks.key if checks is not None else lambda: load_key(create=False),
                        lambda: payload)
    if signed is not None:
        return dataclasses.replace(signed, payload=payload)
    assert record is not None
    return _with_pickle(record, payload, checks)


def _signature(catalog: Catalog, row: RunRow, folder: Path, record: bytes | None,
               key_of: Callable[[], bytes | None], payload_of: Callable[[], bytes | None]) -> Verdict | None:
    """The check of a run's signature with the key: None when it signs the run's record
    (format 2) and the record is of this place; else the verdict (without the pickle's
    bytes).  ``payload_of`` gives the pickle a format-1 signature covers."""
    try:
        raw = read_regular(Path(folder) / SIGNATURE_FILE, SIGNATURE_BYTES, "the signature file",
                           limit_name="SIGNATURE_BYTES")
    except UnsafeFile as e:
        return Verdict(DAMAGED, None, detail=f"{e} (damaged or replaced)")
    except OSError:
        return Verdict(UNSIGNED)
    try:
        doc = json.loads(raw)
        sig, kid = str(doc["signature"]), str(doc["key_id"])
        if doc.get("algorithm") != _ALGORITHM:
            return Verdict(UNSIGNED)
    except (ValueError, KeyError, TypeError):
        return Verdict(UNSIGNED)
    key = key_of()
    if key is None or not hmac.compare_digest(kid, key_id(key)):
        return Verdict(OTHER_KEY)
    if doc.get("format") == _RECORD_FORMAT:
        if record is None:
            return Verdict(MODIFIED, detail="its record (run.json) is missing")
        want = hmac.new(key, record, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(sig, want):
            return Verdict(MODIFIED, detail=RECORD_CHANGED)
        elsewhere = _misplaced(record, catalog, row)
        if elsewhere:
            return Verdict(MODIFIED, detail=elsewhere, misplaced=True)
        return None
    want = signature_of(key, run_record(catalog, row.id, payload_of(), row.status))
    return Verdict(TRUSTED if hmac.compare_digest(sig, want) else MODIFIED)


def _with_pickle(record: bytes, payload: bytes | None, checks: Checks | None) -> Verdict:
    """The verdict of a run whose record verified: trusted when its pickle is the one
    the record names."""
    expected = _payload_digest(record)
    if payload is None:
        digest = None
    elif checks is not None:
        digest = checks.digest(payload, expected)
    else:
        digest = hashlib.sha256(payload).hexdigest()
    if expected != digest:
        return Verdict(MODIFIED, payload, record=record, detail=PICKLE_CHANGED)
    return Verdict(TRUSTED, payload, record=record, payload_sha256=digest)


@dataclass(frozen=True)
class Voucher:
    """A driver's check of one run's signature, for the executors of a query that
    never see the user's key: the SHA-256 of the record whose signature verified
    (an executor reads the record itself, and trusts it only if it is that one), or
    why it did not verify.  Everything else (the pickle the record names) the
    executor checks itself."""

    #: None: the record's signature verified with the key
    state: str | None
    record_sha256: str | None = None
    detail: str = ""
    misplaced: bool = False
    #: a run signed before records (format 1) that verified: its pickle's SHA-256
    payload_sha256: str | None = None


def vouch(catalog: Catalog, row: RunRow, folder: Path, record: bytes | None, checks: Checks) -> Voucher:
    """The driver's half of :func:`verify_run`: the signature checked with the key
    (the pickle is read only for a run signed before records)."""
    held: list[bytes | None] = []

    def payload_of() -> bytes | None:
        held.append(read_payload(folder))
        return held[-1]
    try:
        v = _signature(catalog, row, folder, record, checks.key, payload_of)
    except UnsafeFile as e:
        return Voucher(DAMAGED, detail=f"{e} (damaged or replaced)")
    if v is None:
        assert record is not None
        return Voucher(None, hashlib.sha256(record).hexdigest())
    if v.state == TRUSTED:
        p = held[-1] if held else None
        return Voucher(TRUSTED, payload_sha256=None if p is None else hashlib.sha256(p).hexdigest())
    return Voucher(v.state, detail=v.detail, misplaced=v.misplaced)


def _vouched(vo: Voucher | None, payload: bytes | None, record: bytes | None, checks: Checks) -> Verdict:
    """An executor's verdict: its driver's voucher for the signature, and its own check
    that the record and pickle it read are the ones vouched for."""
    if vo is None:
        return Verdict(MODIFIED, payload, detail="its signature was not checked by the query's driver")
    if vo.state is None:
        if record is None or hashlib.sha256(record).hexdigest() != vo.record_sha256:
            return Verdict(MODIFIED, payload, detail=RECORD_CHANGED)
        return _with_pickle(record, payload, checks)
    if vo.state == TRUSTED:
        digest = None if payload is None else hashlib.sha256(payload).hexdigest()
        return Verdict(TRUSTED if digest == vo.payload_sha256 else MODIFIED, payload)
    return Verdict(vo.state, payload, detail=vo.detail, misplaced=vo.misplaced)


def _misplaced(record: bytes, catalog: Catalog, row: RunRow) -> str:
    """Why a record whose signature verifies is not this run's: it names another run id,
    or another store than the catalog's ("" when it is this run's).  A run folder copied
    from another run, or from another store of the same user (the same key signed both),
    carries a valid signature over a record that is not of its place; the record's
    uid would then bind the run to that other run's arrays and lineage."""
    try:
        rec = json.loads(record)
        rid, store = rec["run"]["id"], rec.get("store")
    except (ValueError, KeyError, TypeError):
        return ""                  # not a record of this format: parsing it says so later
    ours = catalog.meta("store_uid")
    if rid != row.id or (store is not None and ours is not None and store != ours):
        return (f"its record names run {rid} of store {store}, not run {row.id} of this store "
                f"({ours}): the run's folder was taken from elsewhere")
    return ""


def _payload_digest(record: bytes) -> str | None:
    try:
        got = json.loads(record).get("payload_sha256")
    except (ValueError, AttributeError):
        return "(unreadable)"
    return None if got is None else str(got)


def untrusted_message(store: Path, run_id: int, verdict: Verdict) -> str:
    """What to tell a user whose step needs the code of an untrusted run: why it is not
    trusted and the one command that trusts it."""
    return (f"run {run_id} of store {store} is not trusted: {verdict.why}, so SubZero will not "
            f"load its code; look at what it runs and trust it with "
            f"`subzero trust {store} --run {run_id}`")


def code_report(catalog: Catalog, row: RunRow, verdict: Verdict) -> dict[str, Any]:
    """What code a run would load, read without loading it: its operators (names and
    classes, from the catalog), the modules and names its ``workflow.pkl`` looks up,
    the functions and classes whose code travels inside it, and the workflow module
    re-imported when the pickle fails or to rebuild the arrays it leaves out
    (``constants``: how many places name one).  Plain data (for ``subzero trust --json``);
    ``payload_sha256`` names the pickle shown, for :func:`sign_runs`."""
    payload = verdict.payload
    code = pickle_code(payload) if payload is not None else PickleCode()
    return {"run_id": row.id, "workflow": row.workflow, "status": row.status,
            "trust": verdict.state, "why": verdict.why, "source": row.source,
            "operators": [{"name": o["name"], "class": o["class"]} for o in catalog.ops(row.id)],
            "pickle": payload is not None,
            "payload_sha256": hashlib.sha256(payload).hexdigest() if payload is not None else None,
            "modules": code.modules(), "functions": code.functions, "classes": code.classes,
            "unreadable": code.unreadable, "constants": code.constants}


def sign_runs(catalog: Catalog, runs_dir: Path, rows: list[RunRow],
              payloads: Mapping[int, str | None] | None = None,
              records: Mapping[int, bytes] | None = None) -> list[int]:
    """Sign each run of ``rows`` with this user's key (made when there is none); returns
    the ids signed.  ``payloads`` (run id -> ``payload_sha256`` of what the user was
    shown) makes sure the pickles signed are the ones looked at.  ``records`` (run id
    -> the bytes of its ``run.json``, naming that pickle) are signed for runs that have
    one; the others are signed by their catalog rows (format 1)."""
    key = load_key(create=True)
    assert key is not None
    signed = []
    for row in rows:
        folder = runs_dir / str(row.id)
        if not folder.is_dir():
            raise StoreError(f"run {row.id} is in the catalog but its folder {folder} is missing")
        payload = read_payload(folder)
        digest = hashlib.sha256(payload).hexdigest() if payload is not None else None
        if payloads is not None and payloads.get(row.id, digest) != digest:
            raise StoreError(f"the workflow.pkl of run {row.id} changed after it was shown; "
                             f"nothing was trusted for it: look again and trust it again")
        rec = (records or {}).get(row.id)
        if rec is not None:
            sign_record(folder, rec, row.id, key)
        else:
            write_signature(folder, key, run_record(catalog, row.id, payload, row.status))
        signed.append(row.id)
    return signed
