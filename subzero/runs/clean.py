"""Removing what abandoned runs left in a store's ``runs/`` folder."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from subzero.storage.catalog import Catalog


def clean(catalog: Catalog, runs_dir: Path, dry_run: bool = False) -> list[dict[str, Any]]:
    """Remove the folders of interrupted runs (their driver is gone, on any host; they
    are then recorded failed, so they can no longer be resumed), task attempts'
    folders, heartbeat files and folders no catalog row owns.  Complete runs and runs
    still running are never touched.  Returns what was (with ``dry_run``: would be)
    removed: one dict per path with ``path``, ``run``, ``bytes`` and ``why``."""
    rows = {r.id: r for r in catalog.runs()}
    removed: list[dict[str, Any]] = []
    for p in sorted(runs_dir.iterdir()):
        head = p.name.split(".", 1)[0]
        rid = int(head) if head.isdigit() else None
        row = rows.get(rid) if rid is not None else None
        if row is not None and (row.status == "running" or p.name == str(rid)):
            continue        # alive, or a run's final folder
        if row is None and p.name.isdigit():
            why = "a run folder the catalog does not know"
        elif row is None:
            why = "left by a run the catalog does not know"
        elif row.status == "interrupted":
            why = "an interrupted run (its driver is gone)"
        else:
            why = f"left by a {row.status} run"
        removed.append({"path": str(p), "run": rid, "bytes": tree_bytes(p), "why": why})
    if dry_run:
        return removed
    for item in removed:
        p = Path(item["path"])
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    for rid in {i["run"] for i in removed}:
        row = rows.get(rid)
        if row is not None and row.status == "interrupted":
            catalog.finish_run(row.id, "failed", "interrupted; removed by subzero clean")
    return removed


def tree_bytes(p: Path) -> int:
    """The bytes of a file, or of every file under a folder."""
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
