"""Checking a whole store, and repairing what can be proven.

``subzero fsck`` (:func:`fsck`) looks at the store's identity, its catalog and
every run folder, and says what is wrong:

* a missing catalog is rebuilt from the runs' records (:mod:`subzero.runs.record`):
  every run folder whose record names this store is added back, complete;
* a committed run the catalog still calls running (its driver died between the
  rename and the catalog) is recorded; a complete run of this store the catalog
  does not know (an older catalog restored) is added;
* catalog rows that differ from a run's signed record are rewritten from it;
* a folder that proves nothing (no record, another store's record) is moved to
  ``quarantine/``, never deleted;
* what it cannot repair is reported: a complete run whose folder is gone, a run
  whose record no longer verifies, an array whose checksum file is not the one
  its record signed, damage found by ``deep`` (every chunk and every stored
  lineage block read and checked);
* the store's copies of inputs stored once (``inputs/``): each must be bound to
  this store, and with ``deep`` hold the content its name says (digested again,
  once per copy however many runs read it); copies no run refers to any more are
  reported for ``subzero clean``.

Unfinished runs are left to ``subzero run --resume`` and ``subzero clean``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from subzero.capture.tiles import tiles_for
from subzero.errors import CorruptArray, CorruptLineage, StoreError
from subzero.model.strategy import parse
from subzero.runs import record
from subzero.runs.clean import apply, plan
from subzero.storage.arrays import ArrayStore
from subzero.storage.catalog import Catalog, RunRow
from subzero.storage.lineage import LineageStore
from subzero.storage.place import new_uid, read_store_uid, write_store_uid
from subzero.storage.trust import MODIFIED, OTHER_KEY, TRUSTED, verify_run


@dataclass(frozen=True)
class Finding:
    """One thing found: where, what is wrong, and what was (or would be) done."""

    run: int | None
    path: str
    problem: str
    #: "rebuilt", "recovered", "adopted", "repaired", "quarantined"; "noted" for what is
    #: not fsck's to do (an unfinished run: resume or clean it); "" for a problem left
    #: unresolved (nothing can be proven)
    action: str = ""

    @property
    def unresolved(self) -> bool:
        return not self.action

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "unresolved": self.unresolved}


def fsck(root: str | Path, deep: bool = False, dry_run: bool = False) -> list[Finding]:
    """Check the store at ``root`` and repair what can be proven (nothing with
    ``dry_run``); the findings, in the order found."""
    root = Path(root)
    runs_dir = root / "runs"
    if not runs_dir.is_dir():
        raise StoreError(f"no SubZero store at {root} (it has no runs folder)")
    found: list[Finding] = []
    cat_path = root / "catalog.sqlite"
    if not cat_path.exists():
        found += _rebuild(root, runs_dir, dry_run)
        if dry_run:
            return found
    catalog = Catalog(cat_path)
    try:
        other_store = _identity(root, catalog)
        if other_store:      # nothing can be proven against another store's catalog: its rows
            return found + other_store   # are not of these runs, and these runs not its own
        found += _folders(catalog, runs_dir, dry_run)
        seen: set[Path] = set()          # shared copies read once, however many runs read them
        for row in catalog.runs():
            found += _run(catalog, runs_dir, row, deep, dry_run, seen)
        found += _shared(root, catalog, deep)
    finally:
        catalog.close()
    return found


def _rebuild(root: Path, runs_dir: Path, dry_run: bool) -> list[Finding]:
    """A new catalog for a store whose catalog is missing, with every run whose record
    names the store (its ``store.json``; without one, the store most records name)."""
    records = {}
    for p in sorted(runs_dir.iterdir()):
        if p.name.isdigit() and p.is_dir() and not p.is_symlink():
            try:
                rec = record.read(p)
            except StoreError:
                rec = None
            if rec is not None and rec["run"]["id"] == int(p.name):
                records[int(p.name)] = rec
    uid = read_store_uid(root)
    if uid is None and records:
        uid = Counter(r.get("store") for r in records.values()).most_common(1)[0][0]
    ours = {rid: rec for rid, rec in records.items() if uid is not None and rec.get("store") == uid}
    out = [Finding(None, str(root / "catalog.sqlite"), f"the catalog is missing; {len(ours)} run(s) "
                   f"of this store have records", "" if dry_run else "rebuilt")]
    if dry_run:
        return out
    catalog = Catalog(root / "catalog.sqlite")
    try:
        uid = uid or new_uid()
        catalog.set_meta("store_uid", uid)
        if read_store_uid(root) is None:
            write_store_uid(root, uid)
        for rid, rec in sorted(ours.items()):
            with catalog.tx():
                record.insert_rows(catalog, rec)
            out.append(Finding(rid, str(runs_dir / str(rid)), "not in the (new) catalog", "adopted"))
    finally:
        catalog.close()
    return out


def _identity(root: Path, catalog: Catalog) -> list[Finding]:
    in_file, in_catalog = read_store_uid(root), catalog.meta("store_uid")
    if in_file and in_catalog and in_file != in_catalog:
        return [Finding(None, str(catalog.path), f"the catalog belongs to another store (store uid "
                        f"{in_catalog}; store.json says {in_file}): put the store's own catalog "
                        f"back, or move this one away and run fsck again to rebuild it")]
    return []


def _folders(catalog: Catalog, runs_dir: Path, dry_run: bool) -> list[Finding]:
    """Entries of ``runs/`` the catalog does not account for (as ``clean`` sees them):
    committed runs recorded, this store's runs adopted, the rest quarantined; what
    ``clean`` would remove is only reported."""
    out = []
    for item in plan(catalog, runs_dir):
        if item.action == "remove":
            out.append(Finding(item.run, str(item.path), f"{item.why}; `subzero clean` removes it",
                               "noted"))
            continue
        done = {"recover": "recovered", "adopt": "adopted", "quarantine": "quarantined"}[item.action]
        out.append(Finding(item.run, str(item.path), item.why, "" if dry_run else done))
        if not dry_run:
            apply(catalog, runs_dir, item)
    return out


def _run(catalog: Catalog, runs_dir: Path, row: RunRow, deep: bool, dry_run: bool,
         seen: set[Path]) -> list[Finding]:
    """One catalog row against its folder and record."""
    folder = runs_dir / str(row.id)
    if row.status == "interrupted":
        return [Finding(row.id, str(folder), f"interrupted; finish it with `subzero run --resume "
                        f"{row.id}`, or remove it with `subzero clean`", "noted")]
    if row.status != "complete":
        return []
    if not folder.is_dir() or folder.is_symlink():
        return [Finding(row.id, str(folder), "a complete run whose folder is missing (or a link); "
                        "restore it from a backup")]
    out = []
    try:
        data = record.read_bytes(folder)
    except StoreError as e:
        return [Finding(row.id, str(folder), str(e))]
    verdict = verify_run(catalog, row, folder, data)
    rec = record.parse(data, folder) if data is not None else None
    if verdict.state == MODIFIED:
        out.append(Finding(row.id, str(folder), f"{verdict.why}; restore it, or look at it and "
                           f"trust it again (`subzero trust`)"))
    if rec is not None:
        differ = record.differences(rec, catalog, row.id)
        if differ and verdict.record is not None:
            out.append(Finding(row.id, str(folder), f"the catalog differs from the run's signed record "
                               f"({', '.join(differ[:4])})", "" if dry_run else "repaired"))
            if not dry_run:
                with catalog.tx():
                    record.insert_rows(catalog, rec)
        elif differ:
            out.append(Finding(row.id, str(folder), f"the catalog differs from the run's record "
                               f"({', '.join(differ[:4])}), and the record is not signed with your "
                               f"key ({verdict.state}): nothing can be proven"))
        out += _sidecars(row, folder, rec, trusted=verdict.state in (TRUSTED, OTHER_KEY) or
                         verdict.record is not None)
    if deep:
        out += _deep(row, folder, rec, catalog, seen)
    return out


def _sidecars(row: RunRow, folder: Path, rec: record.Record, trusted: bool) -> list[Finding]:
    """Each array's checksum file against the digest its record lists."""
    unreadable: dict[str, str] = {}
    arrays = ArrayStore(folder, run_uid=row.uid)
    have = arrays.sidecar_digests(unreadable)
    out = []
    for a in rec["arrays"]:
        if a["kind"] != "input" or a["name"] in unreadable:
            continue
        try:
            place = arrays.path(a["name"]) if arrays.is_shared(a["name"]) else None
        except CorruptArray as e:
            out.append(Finding(row.id, str(folder / "arrays"), str(e)))
            continue
        if place is not None and not place.is_dir():
            out.append(Finding(row.id, str(place), f"input {a['name']!r} is read from the store's "
                               f"copy {place.name}, which is missing; restore the store's inputs/ "
                               f"folder from a backup"))
    for a in rec["arrays"]:
        want = a.get("sidecar")
        if want is not None and a["name"] in unreadable:
            out.append(Finding(row.id, str(folder / "arrays" / f"{a['name']}.zarr"),
                               f"the checksum file of array {a['name']!r} cannot be read: "
                               f"{unreadable[a['name']]}"))
        elif want is not None and have.get(a["name"]) != want:
            out.append(Finding(row.id, str(folder / "arrays" / f"{a['name']}.zarr"),
                               f"array {a['name']!r}'s checksum file is not the one its record "
                               f"lists (replaced, or from another run)"))
    return out


def _deep(row: RunRow, folder: Path, rec: record.Record | None, catalog: Catalog,
          seen: set[Path]) -> list[Finding]:
    """Read every chunk of every array and every stored lineage block, checking each
    (the store's copy of an input once, not once per run: ``seen``)."""
    out = []
    if rec is not None:
        ops, arrays = record.steering(rec)
    else:
        ops, arrays = catalog.ops(row.id), catalog.arrays(row.id)
    store = ArrayStore(folder, run_uid=row.uid)
    for name, a in arrays.items():
        try:
            if store.is_shared(name):
                if store.path(name) in seen:
                    continue
                seen.add(store.path(name))
            elif not store.kept(name):
                continue          # not kept: its sidecar (checked) is all there is to read
            for t in tiles_for(tuple(a["shape"]), store.tile):
                store.read_region(name, t.core_slices())
        except CorruptArray as e:
            out.append(Finding(row.id, str(store.path(name)), str(e)))
    lineage_dir = folder / "lineage"
    if not lineage_dir.is_dir():
        return out
    lin = LineageStore(lineage_dir, readonly=True, run_uid=row.uid)
    try:
        for o in ops:
            for s in parse("+".join(o["strategies"])):
                if not s.stored:
                    continue
                try:
                    reader = lin.reader(o["name"], s)
                    for space in reader.spaces():
                        reader.all_pairs(space)
                except CorruptLineage as e:
                    out.append(Finding(row.id, str(lineage_dir), str(e)))
    finally:
        lin.close()
    return out


def _shared(root: Path, catalog: Catalog, deep: bool) -> list[Finding]:
    """The store's copies of inputs (see the module's docstring)."""
    from subzero.model import content
    from subzero.storage import shared
    from subzero.storage.chunks import SUMS, open_nodes
    pool = shared.SharedInputs(root)
    copies = pool.copies()
    if not copies:
        return []
    used, unreadable = shared.references(root)
    keep = catalog.digests_in_use()
    store_uid = catalog.meta("store_uid")
    out = []
    for name, p in sorted(copies.items()):
        key = name.removesuffix(".zarr").removesuffix(SUMS)
        named = f"{content.PREFIX}{key.rsplit('-', 1)[0]}" in keep
        if name.startswith(".") or (key not in used and not named):
            if not unreadable:
                why = "left by a publication a crash cut short" if name.startswith(".") else \
                    "a stored input no run refers to any more"
                out.append(Finding(None, str(p), f"{why}; `subzero clean` removes it", "noted"))
            continue
        if not name.endswith(".zarr"):
            continue
        hexd, _, form = key.rpartition("-")
        digest = f"{content.PREFIX}{hexd}"
        label = f"the store's copy of input {digest}"
        try:
            open_nodes(p, label, store_uid, shared.owner_name(digest, form), "store")
            if deep and used.get(key):   # read through one run that refers to it, as it reads it
                run_dir, ref = used[key][0]
                got = ArrayStore(run_dir, run_uid=ref.run).content_digest(ref.array)
                if got != digest:
                    out.append(Finding(None, str(p), f"{label} does not hold that content (it "
                                       f"digests to {got}): damaged or replaced"))
        except (CorruptArray, StoreError) as e:
            out.append(Finding(None, str(p), str(e)))
    return out


def report(findings: list[Finding]) -> str:
    """The findings as JSON lines (for scripts)."""
    return "\n".join(json.dumps(f.as_dict()) for f in findings)
