"""Deleting complete runs by a retention policy (``subzero gc``) without losing any
other run's data, and without a moment in which a run is half there.

What is chosen (:func:`choose`): the runs named, or the complete runs a policy
selects -- older than an age, beyond the newest N of their workflow, or both --
minus those kept whatever the policy says: tagged runs (``subzero tag``) unless
asked, and runs a run still going reads (the parent of a running re-run).
Runs running, interrupted or failed are ``clean``'s business, never gc's.

What a kept run needs stays: a re-run's kept chunks are hard links to its
parent's files (its own names of the same bytes, so deleting the parent frees
only what the re-run does not share) and its lineage is its own; inputs are the
store's copies (:mod:`subzero.storage.shared`), swept afterwards only when no
run left refers to them, under the store's input lock.

How one run is deleted (:func:`delete`), each step durable before the next:

1. under the input lock, its folder is renamed ``runs/<id>`` -> ``runs/<id>.deleted``;
2. the catalog marks it ``deleted`` (one transaction, its tags dropped): the commit
   point.  A crash before it leaves the run complete, its folder where ``clean``
   (and the next gc) puts it back; after it, the run is deleted and what is left of
   the folder is removed by ``clean`` or the next gc;
3. the folder is removed.

A trace already reading the run when it goes either finishes with the right cells
(files open stay readable) or fails with an error naming what it could not read;
a trace started after step 2 is told the run was deleted.  The row stays, so the
id is never given again and re-runs still name their parent.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from subzero.errors import QueryError, StoreError, UsageError
from subzero.storage import shared
from subzero.storage.catalog import Catalog, RunRow
from subzero.storage.files import fsync_dir

#: the suffix of a run folder being deleted (``runs/<id>.deleted``)
DELETED = "deleted"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_age(text: str | float | int) -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` (or a number of seconds) -> seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"`older_than` must be 0 or more seconds, not {text}")
        return float(text)
    m = _AGE.match(str(text))
    if m is None:
        raise UsageError(f"`older_than` {text!r} is not an age; write a number and a unit: "
                         f"30d, 12h, 90m, 2w or 45s")
    return float(m.group(1)) * _UNITS[m.group(2)]


_TAG = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")


def check_tag(name: str) -> None:
    """A tag is a letter then up to 63 letters, digits, ``.``, ``_`` or ``-`` (never a
    run id, never ``latest``)."""
    if not isinstance(name, str) or not _TAG.match(name) or name.lower() == "latest":
        raise UsageError(f"tag {name!r} is not a valid name: a letter, then up to 63 letters, "
                         f"digits, '.', '_' or '-' (not 'latest')")


@dataclass(frozen=True)
class Policy:
    """Which complete runs to delete: ``runs`` (ids or tags) exactly, or every run that
    is older than ``older_than_s`` *and* not among the newest ``keep_last`` of its
    workflow (either alone when the other is None), of ``workflow`` only when given.
    Tagged runs are kept unless ``keep_tagged`` is False."""

    runs: tuple[str, ...] = ()
    keep_last: int | None = None
    older_than_s: float | None = None
    workflow: str | None = None
    keep_tagged: bool = True

    def check(self) -> None:
        if not self.runs and self.keep_last is None and self.older_than_s is None:
            raise UsageError("say which runs to delete: run ids or tags, `keep_last` N (the "
                             "newest N runs of each workflow are kept) or `older_than` an age")
        if self.runs and (self.keep_last is not None or self.older_than_s is not None):
            raise UsageError("give either runs to delete or a policy (`keep_last`, "
                             "`older_than`), not both")
        if self.keep_last is not None and self.keep_last < 0:
            raise UsageError(f"`keep_last` must be 0 or more, not {self.keep_last}")


@dataclass
class Decision:
    """What becomes of one complete run."""

    run: int
    workflow: str
    started: float
    action: str                 # "delete" or "keep"
    why: str
    tags: list[str] = field(default_factory=list)
    #: bytes deleting it frees (files no other name outside the deleted runs links to)
    bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "workflow": self.workflow, "started": self.started,
                "action": self.action, "why": self.why, "tags": self.tags, "bytes": self.bytes}


def _running_parents(catalog: Catalog, runs_dir: Path) -> dict[int, int]:
    """Parent run -> the running re-run reading it (from the re-runs' journals)."""
    from subzero.runs.journal import read_journal
    out: dict[int, int] = {}
    for row in catalog.runs():
        if row.status != "running":
            continue
        try:
            begun = read_journal(runs_dir / f"{row.id}.partial", row.id).begun
        except (StoreError, OSError):
            continue
        parent = (begun.get("rerun") or {}).get("parent") or {}
        if isinstance(parent, dict) and isinstance(parent.get("run_id"), int):
            out[parent["run_id"]] = row.id
    return out


def choose(catalog: Catalog, runs_dir: Path, policy: Policy,
           now: float | None = None) -> list[Decision]:
    """What ``gc`` would do with each complete run concerned (nothing is changed)."""
    policy.check()
    now = time.time() if now is None else now
    tags: dict[int, list[str]] = {}
    for name, rid in catalog.tags().items():
        tags.setdefault(rid, []).append(name)
    rows = [r for r in catalog.runs() if r.status == "complete"
            and (policy.workflow is None or r.workflow == policy.workflow)]
    reading = _running_parents(catalog, runs_dir)
    out: list[Decision] = []
    if policy.runs:
        named: dict[int, RunRow] = {}
        for ref in policy.runs:
            row = catalog.get_run(ref)
            if row.status != "complete":
                raise QueryError(f"run {row.id} is {row.status}; gc deletes complete runs only "
                                 f"(`subzero clean` removes what other runs left)")
            named[row.id] = row
        chosen = {rid: "named" for rid in named}
        rows = list(named.values())
    else:
        chosen = {}
        newest: dict[str, list[RunRow]] = {}
        for r in sorted(rows, key=lambda r: (r.started, r.id), reverse=True):
            newest.setdefault(r.workflow, []).append(r)
        for wf_rows in newest.values():
            for rank, r in enumerate(wf_rows):
                if policy.keep_last is not None and rank < policy.keep_last:
                    continue
                if policy.older_than_s is not None and now - r.started < policy.older_than_s:
                    continue
                parts = [f"{_fmt_age(now - r.started)} old"] if policy.older_than_s is not None else []
                if policy.keep_last is not None:
                    parts.append(f"not among the newest {policy.keep_last} of {r.workflow}")
                why = ", ".join(parts)
                chosen[r.id] = why
    for r in sorted(rows, key=lambda r: r.id):
        if r.id not in chosen:
            continue
        d = Decision(r.id, r.workflow, r.started, "delete", chosen[r.id], sorted(tags.get(r.id, [])))
        if d.tags and policy.keep_tagged:
            d.action, d.why = "keep", f"tagged {', '.join(d.tags)}"
        elif r.id in reading:
            d.action, d.why = "keep", f"the running re-run {reading[r.id]} reads it"
        out.append(d)
    _freed(runs_dir, out)
    return out


def _fmt_age(s: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.1f}{unit}"
    return f"{s:.0f}s"


def _freed(runs_dir: Path, decisions: Sequence[Decision]) -> None:
    """Set each deletion's ``bytes``: its files whose every hard link is in the runs
    deleted (a chunk a kept re-run links to stays on disk, and is not counted)."""
    links: dict[tuple[int, int], int] = {}
    files: dict[int, list[tuple[tuple[int, int], int, int]]] = {}
    for d in decisions:
        if d.action != "delete":
            continue
        mine = files[d.run] = []
        for st, folder in _stats(runs_dir / str(d.run)):
            key = (st.st_dev, st.st_ino)
            links[key] = links.get(key, 0) + 1
            # a folder is the run's own whatever its link count (its sub-folders' "..")
            mine.append((key, 1 if folder else st.st_nlink, st.st_size))
    for d in decisions:
        seen: set[tuple[int, int]] = set()
        for key, nlink, size in files.get(d.run, []):
            if links[key] >= nlink and key not in seen:
                seen.add(key)
                d.bytes += size
        for key, _, _ in files.get(d.run, []):      # counted once, by the first run that has it
            if key in seen:
                links[key] = -1


def _stats(folder: Path) -> Iterable[tuple[os.stat_result, bool]]:
    """(stat, is a folder) of ``folder`` and everything under it, links not followed:
    sizes as ``du -b`` (and ``subzero du``) count them."""
    for base, dirs, names in os.walk(folder, followlinks=False):
        try:
            yield os.lstat(base), True
        except OSError:
            continue
        for n in names + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            try:
                yield os.lstat(os.path.join(base, n)), False
            except OSError:
                continue


def gc(catalog: Catalog, runs_dir: Path, policy: Policy, dry_run: bool = False,
       now: float | None = None) -> list[dict[str, Any]]:
    """Delete the runs :func:`choose` picks (with ``dry_run``: say what it would), then
    the store's copies of inputs no run refers to any more.  Returns one dict per run
    concerned (``action`` ``delete`` or ``keep``, ``why``, ``bytes`` freed) and per
    input copy removed (``run`` None)."""
    finish(catalog, runs_dir)
    decisions = choose(catalog, runs_dir, policy, now)
    out = [d.as_dict() for d in decisions]
    gone = [d for d in decisions if d.action == "delete"]
    if dry_run:
        leaving = {str(runs_dir / str(d.run)) for d in gone}
        return out + shared.sweep(runs_dir.parent, dry_run=True, ignoring=leaving,
                                  keep=_in_use_after(catalog, {d.run for d in gone}))
    for d, item in zip(decisions, out):
        if d.action == "delete" and not delete(catalog, runs_dir, d.run, f"deleted by subzero gc "
                                               f"on {time.strftime('%Y-%m-%d %H:%M')} ({d.why})"):
            item["action"], item["why"], item["bytes"] = "keep", "no longer complete", 0
    return out + shared.sweep(runs_dir.parent, keep=catalog.digests_in_use())


def _in_use_after(catalog: Catalog, deleting: set[int]) -> set[str]:
    """The input digests the runs left after deleting ``deleting`` name."""
    keep: set[str] = set()
    for r in catalog.runs():
        if r.id not in deleting and r.status not in ("failed", "deleted"):
            keep.update(d for d in catalog.input_digests(r.id).values() if d)
    return keep


def delete(catalog: Catalog, runs_dir: Path, run_id: int, why: str) -> bool:
    """Delete one complete run (the steps of the module's docstring); False when it is
    no longer complete or its folder is already gone (another gc got there)."""
    folder, doomed = runs_dir / str(run_id), runs_dir / f"{run_id}.{DELETED}"
    with shared.SharedInputs(runs_dir.parent).lock():
        row = catalog.get_run(run_id)
        if row.status != "complete" or not folder.is_dir() or folder.is_symlink():
            return False
        try:
            os.rename(folder, doomed)
        except OSError as e:
            raise StoreError(f"cannot delete run {run_id}: renaming {folder} failed: "
                             f"{e.strerror or e}") from e
        _fsync_dir(runs_dir)
        try:
            marked = catalog.mark_deleted(run_id, why)
        except BaseException:
            os.rename(doomed, folder)       # not deleted: put it back as it was
            raise
        if not marked:
            os.rename(doomed, folder)
            return False
    _remove(doomed)
    return True


def _fsync_dir(path: Path) -> None:
    """Make the rename durable before the catalog says deleted (a crash point of its own)."""
    fsync_dir(path)


def _remove(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True)


def finish(catalog: Catalog, runs_dir: Path) -> list[tuple[Path, str]]:
    """Settle what a gc cut short: a ``runs/<id>.deleted`` folder of a run the catalog
    still calls complete goes back (the deletion never committed), one of a deleted
    run is removed.  Returns (folder, what was done).  Anything else is ``clean``'s."""
    done: list[tuple[Path, str]] = []
    doomed = sorted(runs_dir.glob(f"*.{DELETED}"))
    if not doomed:
        return done
    with shared.SharedInputs(runs_dir.parent).lock():
        for p in doomed:
            action = settle(catalog, runs_dir, p)
            if action is not None:
                done.append((p, action))
    return done


def settle(catalog: Catalog, runs_dir: Path, p: Path) -> str | None:
    """What becomes of one ``<id>.deleted`` folder, done: ``restored``, ``removed`` or
    None (not gc's: ``clean`` quarantines it).  The caller holds the input lock."""
    head = p.name.removesuffix(f".{DELETED}")
    if not head.isdigit() or p.is_symlink() or not p.is_dir():
        return None
    try:
        row = catalog.get_run(int(head))
    except QueryError:
        return None
    if row.status == "deleted":
        _remove(p)
        return "removed"
    target = runs_dir / head
    if row.status == "complete" and not target.exists():
        os.rename(p, target)
        fsync_dir(runs_dir)
        return "restored"
    return None
