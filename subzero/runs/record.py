"""A run's record: ``runs/<id>/run.json``, everything the catalog knows of the run,
kept beside the run's bytes and signed with them.

The catalog is an index; the record is the run's own account of itself.  It is
written (and fsynced) before the run's folder is renamed into place and before
the catalog hears of the run, so that:

* the signature covers it whole — the run's identity (run and store uids), what
  steers a trace (each array's shape and dtype, each operator's inputs and
  strategies), the digests of every array's chunk manifest, the workflow pickle's
  digest — and a trace of a signed run takes what steers it from the record, not
  from catalog rows someone may have edited;
* a run whose catalog rows are lost (a crash between the rename and the catalog
  transaction, a deleted or older catalog) is recovered from it
  (:func:`catalog_rows`), by resume, ``subzero clean`` or ``subzero fsck``;
* nothing that cannot prove itself is ever deleted: a folder whose record names
  another store is quarantined, not removed.

Runs made before records existed have none; they read as before ("unbound").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from subzero.errors import StoreError, UnsafeFile
from subzero.storage.catalog import Catalog, RunRow
from subzero.storage.files import read_regular
from subzero.tuning import RECORD_BYTES

if TYPE_CHECKING:     # what a run reports: the run side's, not a trace's
    from subzero.engines.stats import RunStats

#: the record's file name in a run's folder
FILE = "run.json"
FORMAT = 1

Record = dict[str, Any]


def build(row: RunRow, store_uid: str | None, stats: RunStats, downgrades: Iterable[Mapping[str, Any]],
          payload: bytes | None, sidecars: Mapping[str, str], ended: float,
          contents: Mapping[str, str] | None = None, shared: Mapping[str, str] | None = None
          ) -> Record:
    """The record of a run being committed: its catalog row (``row``, status to be
    complete), the statistics the driver gathered, the disk budget's downgrades,
    the workflow pickle (``payload``), each array's sidecar digest and each input's
    content digest (``contents``, :mod:`subzero.model.content`) and, for each input read
    from the store's copy (:mod:`subzero.storage.shared`), that copy's key."""
    contents, shared = dict(contents or {}), dict(shared or {})
    ops = []
    for seq, st in enumerate(stats.ops):
        ops.append({"seq": seq, "name": st.name, "class": st.cls, "inputs": list(st.inputs),
                    "strategies": list(st.strategies), "shape": list(st.shape),
                    "dtype": st.dtype, "nbytes": int(st.nbytes), "run_s": st.run_s,
                    "lwrite_s": st.lwrite_s, "lineage_s": st.lineage_s, "pairs": int(st.pairs),
                    "lineage_bytes": int(st.lineage_bytes),
                    "per_strategy": [_plain(ps) for ps in st.per_strategy],
                    **({"statistic": st.statistic} if st.statistic is not None else {}),
                    **({"rounds": st.rounds} if st.rounds is not None else {})})
    arrays: list[dict[str, Any]] = [{"name": a.name, "kind": "input", "shape": list(a.shape), "dtype": a.dtype,
               "nbytes": int(a.nbytes), "sidecar": sidecars.get(a.name),
               "digest": contents.get(a.name), "shared": shared.get(a.name)} for a in stats.inputs]
    arrays += [{"name": st.name, "kind": "output", "shape": list(st.shape), "dtype": st.dtype,
                "nbytes": int(st.nbytes), "sidecar": sidecars.get(st.name)} for st in stats.ops]
    extra = {} if stats.rerun is None else {"rerun": _plain(stats.rerun)}
    return {
        **extra,
        "format": FORMAT,
        "store": store_uid,
        "run": {"id": row.id, "uid": row.uid, "workflow": row.workflow, "source": row.source,
                "params": row.params, "inputs": row.inputs, "engine": row.engine,
                "started": row.started, "ended": ended},
        "arrays": arrays,
        "ops": ops,
        "downgrades": [_plain(d) for d in downgrades],
        "payload_sha256": None if payload is None else hashlib.sha256(payload).hexdigest(),
    }


def _plain(d: Mapping[str, Any]) -> dict[str, Any]:
    """JSON's own types (numpy numbers and tuples become int/float and lists)."""
    return json.loads(json.dumps(d, default=_default))


def _default(x: object) -> object:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    if hasattr(x, "item"):
        return x.item()                          # numpy scalars
    return str(x)


def encode(record: Record) -> bytes:
    """The record's bytes as stored (and signed): canonical JSON, sorted keys."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), default=_default).encode()


def write(folder: Path, record: Record) -> bytes:
    """Write the record into ``folder`` atomically and durably; returns its bytes."""
    data = encode(record)
    path = Path(folder) / FILE
    tmp = path.with_name(f".{FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write the record of run {record['run']['id']} to {path}: "
                         f"{e.strerror or e}") from e
    return data


def read_bytes(folder: Path) -> bytes | None:
    """The record's bytes (None when the run has none: made before records).  Read
    without following a link, from a regular file of bounded size: anything else is
    damage, one StoreError naming the file."""
    path = Path(folder) / FILE
    try:
        return read_regular(path, RECORD_BYTES, "the record of a run", limit_name="RECORD_BYTES")
    except FileNotFoundError:
        return None
    except (UnsafeFile, OSError) as e:
        raise StoreError(f"{e} (damaged)" if isinstance(e, UnsafeFile) else
                         f"the record of a run, {path}, cannot be read: {e.strerror or e}") from e


def parse(data: bytes, where: Path) -> Record:
    """A record from its bytes, checked for the fields everything here relies on."""
    try:
        rec = json.loads(data)
        ok = (isinstance(rec, dict) and rec.get("format") == FORMAT and isinstance(rec["run"], dict)
              and isinstance(rec["run"]["id"], int) and isinstance(rec["arrays"], list)
              and isinstance(rec["ops"], list))
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise StoreError(f"the record of a run, {where / FILE}, is damaged or of an unknown format")
    return rec


def read(folder: Path) -> Record | None:
    data = read_bytes(folder)
    return None if data is None else parse(data, Path(folder))


# -- what steers a trace ----------------------------------------------------------------
@dataclass(frozen=True)
class Steering:
    """What steers a run's traces and code loads (:meth:`subzero.store.Store.steering`):
    its operators and arrays as the catalog lists them, its workflow's source and
    parameters, and its record (None for a run made before records)."""

    ops: list[dict[str, Any]]
    arrays: dict[str, dict[str, Any]]
    source: str | None
    params: dict[str, Any]
    record: Record | None
    #: the record's signature verified with this user's key (it then steers, not the catalog)
    verified: bool = False


def steering(rec: Record) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The operators (as ``catalog.ops`` lists them) and arrays (as ``catalog.arrays``)
    of a record."""
    ops = [{"name": o["name"], "class": o["class"], "inputs": list(o["inputs"]),
            "strategies": list(o["strategies"]), "shape": list(o["shape"]), "run_s": o["run_s"],
            "lwrite_s": o["lwrite_s"], "lineage_s": o["lineage_s"], "pairs": o["pairs"],
            "lineage_bytes": o["lineage_bytes"],
            **({"statistic": o["statistic"]} if o.get("statistic") else {}),
            **({"rounds": o["rounds"]} if o.get("rounds") else {})}
           for o in sorted(rec["ops"], key=lambda o: o["seq"])]
    arrays = {a["name"]: {"kind": a["kind"], "shape": tuple(a["shape"]), "dtype": a["dtype"],
                          "nbytes": a["nbytes"]} for a in rec["arrays"]}
    return ops, arrays


def differences(rec: Record, catalog: Catalog, run_id: int) -> list[str]:
    """Where the catalog's rows of a run differ from its record in anything that steers a
    trace or a code load (empty: they agree).  Rows that cannot be read at all (a NULL
    shape, damaged JSON) differ, and say why."""
    try:
        return _differences(rec, catalog, run_id)
    except StoreError as e:
        return [f"rows that cannot be read: {e}"]


def _differences(rec: Record, catalog: Catalog, run_id: int) -> list[str]:
    out = []
    row = catalog.get_run(run_id)
    r = rec["run"]
    for key, have in (("uid", row.uid), ("workflow", row.workflow), ("source", row.source),
                      ("params", row.params), ("inputs", row.inputs), ("engine", row.engine)):
        if _norm(have) != _norm(r.get(key)):
            out.append(f"runs.{key}")
    ops, arrays = steering(rec)
    have_ops = {o["name"]: o for o in catalog.ops(run_id)}
    for o in ops:
        h = have_ops.pop(o["name"], None)
        if h is None:
            out.append(f"operator {o['name']!r} is missing")
            continue
        for key in ("class", "inputs", "strategies", "shape"):
            if _norm(h[key]) != _norm(o[key]):
                out.append(f"ops.{key} of {o['name']!r}")
    out += [f"operator {n!r} is not in the record" for n in have_ops]
    have_arrays = catalog.arrays(run_id)
    for name, a in arrays.items():
        h = have_arrays.pop(name, None)
        if h is None:
            out.append(f"array {name!r} is missing")
            continue
        for key in ("kind", "shape", "dtype"):
            if _norm(h[key]) != _norm(a[key]):
                out.append(f"arrays.{key} of {name!r}")
    out += [f"array {n!r} is not in the record" for n in have_arrays]
    # an input's content digest steers which runs `impact` finds: an edited one would hide
    # the run from the question (records made before digests have none to compare; a
    # catalog made before them has none yet, which contradicts nothing)
    have_digests = catalog.input_digests(run_id)
    for a in rec["arrays"]:
        got = have_digests.get(a["name"])
        if a["kind"] == "input" and a.get("digest") and got is not None and got != a["digest"]:
            out.append(f"arrays.digest of {a['name']!r}")
    return out


def _norm(x: object) -> str:
    return json.dumps(x, sort_keys=True, default=str)


# -- catalog rows from a record -----------------------------------------------------------
def insert_rows(catalog: Catalog, rec: Record, status: str = "complete") -> None:
    """Make the catalog's rows of the run say what its record says, in the caller's
    transaction: the run's row (inserted when the catalog has none, else updated), its
    arrays, operators, strategy statistics and spaces and downgrades (replaced).
    Idempotent: a commit redone after a crash, or a recovery, gives the same rows."""
    r = rec["run"]
    rid = int(r["id"])
    db = catalog.db
    exists = db.execute("SELECT 1 FROM runs WHERE id=?", (rid,)).fetchone() is not None
    fields = (r["workflow"], r["source"], json.dumps(r["params"], default=str), status,
              r["started"], r["ended"], json.dumps(r["inputs"], default=str), r["engine"], r["uid"])
    if exists:
        db.execute("UPDATE runs SET workflow=?, source=?, params=?, status=?, started=?, ended=?,"
                   " error=NULL, inputs=?, engine=?, uid=? WHERE id=?", (*fields, rid))
    else:
        db.execute("INSERT INTO runs (workflow, source, params, status, started, ended, inputs,"
                   " engine, uid, id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (*fields, rid))
    for table in ("arrays", "ops", "strategy_stats", "strategy_spaces", "downgrades"):
        db.execute(f"DELETE FROM {table} WHERE run_id=?", (rid,))
    for a in rec["arrays"]:
        catalog.add_array(rid, a["name"], a["kind"], a["shape"], a["dtype"], a["nbytes"],
                          a.get("digest"))
    for o in sorted(rec["ops"], key=lambda o: o["seq"]):
        catalog.add_op(rid, o["seq"], o["name"], o["class"], o["inputs"], o["strategies"], o["shape"],
                       o["run_s"], o["lwrite_s"], o["lineage_s"], o["pairs"], o["lineage_bytes"])
        for ps in o["per_strategy"]:
            catalog.add_strategy_stat(rid, o["name"], ps["strategy"], ps["bytes"], ps["write_s"],
                                      ps["pairs"])
            if "spaces" in ps:
                catalog.add_strategy_space(rid, o["name"], ps["strategy"], ps["spaces"])
    db.execute("DELETE FROM reruns WHERE run_id=?", (rid,))
    if rec.get("rerun") is not None:
        catalog.add_rerun(rid, rec["rerun"])
    for d in rec["downgrades"]:
        catalog.add_downgrade(rid, d["op"], d["strategy"], d["predicted_bytes"], d["needed_bytes"],
                              d["reason"])
