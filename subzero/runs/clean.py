"""Tidying a store's ``runs/`` folder without ever losing a run.

``clean`` removes only what it can prove is unfinished: the partial folder of
an interrupted run (the run is then recorded failed and can no longer be
resumed), what failed runs left, task attempts' scratch folders and heartbeat
files of runs that are over.  Everything else that the catalog does not account
for is *recovered* when it proves itself — a committed folder whose record
names this run (a crash between the rename and the catalog), or this store (a
catalog restored from an older copy) — and *quarantined* otherwise: moved to
the store's ``quarantine/`` folder, never deleted.  Complete runs and runs still
running are never touched.  Then the store's copies of inputs (:mod:`subzero.storage.shared`)
that no run folder refers to any more -- complete, unfinished or quarantined --
are removed, under the store's input lock, so a run taking a copy meanwhile
never loses it.  A deletion by ``subzero gc`` cut short (:mod:`subzero.runs.gc`) is
settled: finished when the catalog says the run is deleted, undone when it does not.
:mod:`subzero.runs.fsck` checks and repairs the rest.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from subzero.errors import StoreError
from subzero.runs import record
from subzero.runs.gc import DELETED, settle
from subzero.runs.transaction import recover
from subzero.storage import shared
from subzero.storage.catalog import Catalog, RunRow

#: the store's folder (beside ``runs/``) that holds what could not be accounted for
QUARANTINE = "quarantine"


@dataclass(frozen=True)
class Item:
    """One entry of ``runs/`` and what becomes of it."""

    path: Path
    run: int | None
    action: str            # "remove", "restore", "recover", "adopt", "quarantine"
    why: str

    def as_dict(self, nbytes: int) -> dict[str, Any]:
        return {"path": str(self.path), "run": self.run, "bytes": nbytes, "why": self.why,
                "action": self.action}


def plan(catalog: Catalog, runs_dir: Path) -> list[Item]:
    """What cleaning would do with each entry of ``runs/`` (nothing is changed)."""
    rows = {r.id: r for r in catalog.runs()}
    store_uid = catalog.meta("store_uid")
    items: list[Item] = []
    for p in sorted(runs_dir.iterdir()):
        head, _, tail = p.name.partition(".")
        rid = int(head) if head.isdigit() else None
        row = rows.get(rid) if rid is not None else None
        if row is not None and row.status == "running":
            continue                                # alive: never touched
        if rid is None:
            items.append(Item(p, None, "quarantine", "not a run's file or folder"))
        elif tail == "" and p.is_dir() and not p.is_symlink():
            item = _final(p, rid, row, store_uid)
            if item is not None:
                items.append(item)
        elif tail == "heartbeat" and row is not None:
            items.append(Item(p, rid, "remove", f"heartbeat of a {row.status} run"))
        elif tail == "partial" and row is not None:
            why = ("an interrupted run (its driver is gone)" if row.status == "interrupted"
                   else f"left by a {row.status} run")
            items.append(Item(p, rid, "remove", why))
        elif tail == DELETED and row is not None and row.status in ("complete", "deleted") \
                and p.is_dir() and not p.is_symlink():
            items.append(_doomed(p, rid, row, runs_dir))
        elif tail.startswith("partial-a") and row is not None:
            items.append(Item(p, rid, "remove", f"a task attempt of a {row.status} run"))
        elif row is None:
            items.append(Item(p, rid, "quarantine", "left by a run the catalog does not know"))
        else:
            items.append(Item(p, rid, "quarantine", f"not a file of a {row.status} run"))
    return items


def _doomed(p: Path, rid: int, row: RunRow, runs_dir: Path) -> Item:
    """A folder ``subzero gc`` renamed to delete it: removed once the catalog says the run
    is deleted, put back when the deletion never committed."""
    if row.status == "deleted":
        return Item(p, rid, "remove", "what subzero gc left of a deleted run")
    if not (runs_dir / str(rid)).exists():
        return Item(p, rid, "restore", "a complete run whose deletion by subzero gc was cut "
                                       "short before it committed: it was never deleted")
    return Item(p, rid, "quarantine", "a copy of a complete run's folder named as deleted")


def _final(p: Path, rid: int, row: RunRow | None, store_uid: str | None) -> Item | None:
    """A run's final folder: kept when complete, else recovered or quarantined."""
    if row is not None and row.status == "complete":
        return None
    if row is not None and row.status == "deleted":
        return Item(p, rid, "quarantine", f"a folder of run {rid}, which subzero gc deleted "
                                          f"(a restored backup?)")
    try:
        rec = record.read(p)
    except StoreError:
        rec = None
    if rec is None:
        why = "a run folder without a readable record"
        return Item(p, rid, "quarantine", why + (" the catalog does not know" if row is None
                                                  else f" ({row.status} in the catalog)"))
    ours = rec.get("store") is not None and rec.get("store") == store_uid and rec["run"]["id"] == rid
    if row is None:
        return Item(p, rid, "adopt", "a complete run of this store the catalog does not know")\
            if ours else Item(p, rid, "quarantine", "a run of another store")
    if ours and rec["run"].get("uid") == row.uid and row.uid is not None:
        return Item(p, rid, "recover", f"committed, but the catalog still calls it {row.status}")
    if ours and row.status == "failed":      # a stale row of an older catalog: the folder is the run
        return Item(p, rid, "adopt", "a complete run of this store; the catalog's row of its id "
                                     "is a failed run's")
    return Item(p, rid, "quarantine", f"a run folder whose record is not of run {rid} of this store")


def clean(catalog: Catalog, runs_dir: Path, dry_run: bool = False) -> list[dict[str, Any]]:
    """Tidy ``runs/`` (see the module's docstring).  Returns one dict per entry acted on
    (with ``dry_run``: that would be) with ``path``, ``run``, ``bytes``, ``why`` and
    ``action``: ``remove``, ``recover``, ``adopt`` or ``quarantine``."""
    rows = {r.id: r for r in catalog.runs()}
    items = plan(catalog, runs_dir)
    out = [i.as_dict(tree_bytes(i.path)) for i in items]
    if dry_run:
        gone = {str(i.path) for i in items if i.action not in ("recover", "adopt", "restore")}
        return out + _unused_inputs(catalog, runs_dir, dry_run=True, leaving=gone)
    for item in items:
        apply(catalog, runs_dir, item)
    # an interrupted run whose unfinished folder was removed can no longer be resumed
    for rid in {i.run for i in items if i.action == "remove" and i.path.name.endswith(".partial")}:
        row = rows.get(rid) if rid is not None else None
        if row is not None and row.status == "interrupted":
            catalog.finish_run(row.id, "failed", "interrupted; removed by subzero clean")
    return out + _unused_inputs(catalog, runs_dir)


def _unused_inputs(catalog: Catalog, runs_dir: Path, dry_run: bool = False,
                   leaving: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The store's copies of inputs no run refers to and the catalog names for no run
    (with ``dry_run``: also those only the folders ``leaving`` refer to, as they would
    be after cleaning)."""
    return shared.sweep(runs_dir.parent, dry_run=dry_run, ignoring=leaving,
                        keep=catalog.digests_in_use())


def apply(catalog: Catalog, runs_dir: Path, item: Item) -> None:
    """Do what :func:`plan` said of one entry (``clean`` and ``fsck`` both)."""
    if item.action == "remove":
        _remove(item.path)
    elif item.action == "restore":
        with shared.SharedInputs(runs_dir.parent).lock():      # not while a gc deletes it
            settle(catalog, runs_dir, item.path)
    elif item.action == "recover":
        assert item.run is not None
        recover(catalog, runs_dir, item.run)
    elif item.action == "adopt":
        rec = record.read(item.path)
        assert rec is not None
        with catalog.tx():
            record.insert_rows(catalog, rec)
    else:
        quarantine = runs_dir.parent / QUARANTINE
        quarantine.mkdir(exist_ok=True)
        os.replace(item.path, quarantine / f"{item.path.name}.{time.strftime('%Y%m%d-%H%M%S')}")


def _remove(p: Path) -> None:
    """Remove a file or a folder, never through a link (a link itself is removed)."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def tree_bytes(p: Path) -> int:
    """The bytes of a file, or of every file under a folder (links not followed)."""
    if p.is_symlink() or p.is_file():
        return p.lstat().st_size
    return sum(f.lstat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
