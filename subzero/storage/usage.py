"""Where a store's bytes go: per run (its arrays, one by one; its lineage; its pickles;
its statistics; the rest of its folder), the inputs stored once (``inputs/``), the
catalog with its trace log and plans, and the total.

**Every file once.**  A re-run hard-links its parent's unchanged chunks, and a shared
input is a folder of hard links made from the first run's copy, so one file can sit
under many names.  Files are counted by inode, as ``du -b`` does: the store's total is
what its disk holds, each file (and folder) once, at its apparent size.  A part's
bytes are its files, each once; of them it *owns alone* those whose every link is
inside it (``st_nlink`` says how many there are), and *shares* the rest -- with another
run, the store's inputs, or a name outside the store.  Removing a run frees only what
it owns alone.

Reading only (``lstat`` and the catalog's page statistics; no file is opened for
writing, no lock is taken), so a read-only store answers too.  A file that changes
while it is counted is counted as it was seen.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from subzero.errors import UnsafeFile
from subzero.storage.chunks import SUMS, read_metadata
from subzero.storage.shared import INPUTS, REF, shared_key

#: a run's files, by kind (its folder's entries; ``arrays`` holds one entry per array)
KINDS = ("arrays", "lineage", "pickles", "statistics", "other")
#: suffixes of an array's entries in a run's ``arrays/`` folder, longest first
_ARRAY_SUFFIXES = (SUMS, REF, ".zarr")
#: the catalog's files (SQLite keeps a write-ahead log and its index beside it)
_CATALOG_FILES = ("catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm",
                  "catalog.sqlite-journal")
#: catalog tables whose pages are shown apart: the trace log (the optimizer's workload)
#: and saved plans
TRACE_TABLES = ("traces", "trace_steps")
PLAN_TABLES = ("plans",)


@dataclass
class Part:
    """The bytes of one part of a store: its files (and folders), each counted once,
    and of them those it owns alone (every link to the file is inside the part)."""

    bytes: int = 0
    own: int = 0
    files: int = 0

    @property
    def shared(self) -> int:
        """Bytes of files also linked from elsewhere (another run, the store's inputs)."""
        return self.bytes - self.own

    def as_dict(self) -> dict[str, int]:
        return {"bytes": self.bytes, "own": self.own, "shared": self.shared, "files": self.files}


@dataclass
class RunUsage:
    """One run's folder(s) by kind, its arrays one by one, and the store's copies of the
    inputs it reads (``inputs``: input name -> bytes of the shared copy, which the
    run does not hold: see :attr:`DiskUsage.inputs`)."""

    run: int
    folders: list[str] = field(default_factory=list)
    total: Part = field(default_factory=Part)
    kinds: dict[str, Part] = field(default_factory=lambda: {k: Part() for k in KINDS})
    arrays: dict[str, Part] = field(default_factory=dict)
    inputs: dict[str, int] = field(default_factory=dict)
    status: str | None = None
    workflow: str | None = None
    #: arrays the run did not keep (its ``--keep`` policy): made again when read
    not_kept: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "status": self.status, "workflow": self.workflow,
                "folders": self.folders, **self.total.as_dict(), "not_kept": self.not_kept,
                "kinds": {k: v.as_dict() for k, v in self.kinds.items()},
                "arrays": {k: v.as_dict() for k, v in sorted(self.arrays.items())},
                "inputs_read": dict(sorted(self.inputs.items()))}


@dataclass
class DiskUsage:
    """A whole store's bytes.  ``total`` is every file under the store once (what ``du
    -sb`` says); it equals the runs' bytes owned alone, plus ``shared`` (files linked
    from more than one part, each once), plus the store's inputs, catalog and ``other``
    parts' own bytes."""

    path: str
    runs: list[RunUsage]
    inputs: Part
    catalog: Part
    trace_log: int            # of the catalog's bytes: its trace log's pages
    plans: int                # and its saved plans' pages
    other: Part               # store.json, quarantine/, the store's own folders, strays
    shared: int               # files linked from more than one part (each counted once)
    total: int

    def as_dict(self) -> dict[str, Any]:
        return {"store": self.path, "total": self.total, "shared": self.shared,
                "runs": [r.as_dict() for r in self.runs], "inputs": self.inputs.as_dict(),
                "catalog": {**self.catalog.as_dict(), "trace_log": self.trace_log,
                            "plans": self.plans},
                "other": self.other.as_dict()}


@dataclass(frozen=True)
class _Entry:
    part: tuple[Any, ...]     # ("run", id, kind, array) / ("inputs",) / ("catalog",) / ("other",)
    inode: tuple[int, int]
    size: int
    links: int                # st_nlink of a file; 1 for a folder (folders have no hard links)


def _walk(path: Path, deep: bool = True) -> Iterator[tuple[Path, os.stat_result]]:
    """``path`` and (``deep``) everything under it, never following a link."""
    try:
        st = path.lstat()
    except FileNotFoundError:       # removed while counted
        return
    yield path, st
    if not deep or not stat.S_ISDIR(st.st_mode):
        return
    try:
        with os.scandir(path) as it:
            children = sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for child in children:
        yield from _walk(Path(child.path))


def _entries(top: Path, part_of: Any, deep: bool = True) -> Iterator[_Entry]:
    """``top`` and (``deep``) every file and folder under it, with the part
    ``part_of(parts of the path below top)`` says it belongs to."""
    for p, st in _walk(top, deep):
        rel = p.relative_to(top).parts
        links = 1 if stat.S_ISDIR(st.st_mode) else st.st_nlink   # folders have no hard links
        yield _Entry(part_of(rel), (st.st_dev, st.st_ino), st.st_size, links)


def _array_name(entry: str) -> str | None:
    """The array an entry of a run's ``arrays/`` folder belongs to (``x.zarr``,
    ``x.sums.json``, ``x.input.json``, a task attempt's ``.x.attempt-2.zarr``)."""
    for suffix in _ARRAY_SUFFIXES:
        if entry.endswith(suffix) and len(entry) > len(suffix):
            name = entry[:-len(suffix)]
            if name.startswith(".") and ".attempt-" in name:
                name = name[1:name.rindex(".attempt-")]
            return name
    return None


def run_kind(rel: tuple[str, ...]) -> tuple[str, str | None]:
    """(kind, array) of a path inside a run's folder (``rel``: its parts)."""
    if not rel:
        return "other", None
    head = rel[0]
    if head == "arrays":
        return "arrays", _array_name(rel[1]) if len(rel) > 1 else None
    if head == "lineage":
        return "lineage", None
    if head == "statistics":
        return "statistics", None
    if len(rel) == 1 and head.endswith(".pkl"):
        return "pickles", None
    return "other", None


def _run_id(name: str) -> int | None:
    """The run an entry of ``runs/`` belongs to: ``7``, ``7.partial``, ``7.heartbeat``..."""
    head = name.partition(".")[0]
    return int(head) if head.isdigit() else None


def _store_entries(root: Path, only: int | None = None) -> Iterator[_Entry]:
    """Every file and folder of the store, by part (``only``: that run's entries of
    ``runs/`` alone)."""
    runs = root / "runs"
    if only is None:
        yield from _entries_top(root)
    if runs.is_dir() and not runs.is_symlink():
        for child in sorted(runs.iterdir()):
            rid = _run_id(child.name)
            if only is not None and rid != only:
                continue
            if rid is None:
                yield from _entries(child, lambda rel: ("other",))
                continue
            in_folder = child.is_dir() and not child.is_symlink()
            yield from _entries(child, lambda rel, rid=rid, d=in_folder:
                                ("run", rid, *(run_kind(rel) if d else ("other", None))))
    inputs = root / INPUTS
    if only is None and inputs.is_dir() and not inputs.is_symlink():
        for child in sorted(inputs.iterdir()):
            yield from _entries(child, lambda rel, name=child.name: ("inputs", name))


def _entries_top(root: Path) -> Iterator[_Entry]:
    """The store's folder, the ``runs/`` and ``inputs/`` folders themselves (their
    entries are walked apart), the catalog's files and everything else."""
    for p in (root, root / "runs", root / INPUTS):
        if p == root or (p.is_dir() and not p.is_symlink()):
            yield from _entries(p, lambda rel: ("other",), deep=False)
    for child in sorted(root.iterdir()):
        if child.name in ("runs", INPUTS) and child.is_dir() and not child.is_symlink():
            continue
        part = ("catalog",) if child.name in _CATALOG_FILES else ("other",)
        yield from _entries(child, lambda rel, part=part: part)


def _unit(part: tuple[Any, ...]) -> tuple[Any, ...]:
    """The unit whose links make a file owned alone: a run (any of its kinds), the
    store's inputs, the catalog, the rest."""
    return part[:2] if part[0] == "run" else part[:1]


def _account(entries: list[_Entry]) -> tuple[dict[tuple[int, int], set], dict[tuple[int, int], int]]:
    """Per inode: the units linking it, and how many of its links were seen."""
    units: dict[tuple[int, int], set] = {}
    seen: dict[tuple[int, int], int] = {}
    for e in entries:
        units.setdefault(e.inode, set()).add(_unit(e.part))
        seen[e.inode] = seen.get(e.inode, 0) + 1
    return units, seen


def _add(part: Part, e: _Entry, alone: bool, counted: set) -> None:
    key = (id(part), e.inode)
    if key in counted:
        return
    counted.add(key)
    part.bytes += e.size
    part.files += 1
    if alone:
        part.own += e.size


def _runs(entries: list[_Entry], units: Mapping, seen: Mapping,
          rows: Mapping[int, tuple[str, str]], root: Path) -> dict[int, RunUsage]:
    """Each run's usage from the entries of its folders."""
    out: dict[int, RunUsage] = {}
    counted: set = set()
    for e in entries:
        if e.part[0] != "run":
            continue
        rid, kind, array = e.part[1], e.part[2], e.part[3]
        ru = out.get(rid)
        if ru is None:
            ru = out[rid] = RunUsage(rid)
            ru.status, ru.workflow = rows.get(rid, (None, None))
        alone = units[e.inode] == {("run", rid)} and seen[e.inode] >= e.links
        _add(ru.total, e, alone, counted)
        _add(ru.kinds[kind], e, alone, counted)
        if kind == "arrays" and array is not None:
            _add(ru.arrays.setdefault(array, Part()), e, alone, counted)
    for ru in out.values():
        ru.folders = sorted(p.name for p in (root / "runs").iterdir() if _run_id(p.name) == ru.run)
    return out


def _inputs_read(root: Path, rid: int, copy_bytes: Any) -> dict[str, int]:
    """The inputs run ``rid`` reads from the store's copies, with the bytes of each copy
    (``copy_bytes(key)``).  References are read as JSON, without the checks a read of
    the input makes: one that cannot be read names no copy here."""
    out: dict[str, int] = {}
    for folder in (root / "runs" / str(rid), root / "runs" / f"{rid}.partial"):
        arrays = folder / "arrays"
        if not arrays.is_dir() or arrays.is_symlink():
            continue
        for f in sorted(arrays.glob(f"*{REF}")):
            try:
                body = json.loads(f.read_bytes())
                key = shared_key(str(body["input"]), str(body["form"]))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            out[f.name[:-len(REF)]] = copy_bytes(key)
    return out


def _copy_bytes(root: Path, key: str) -> int:
    """The bytes of the store's copy ``key`` of an input (its folder and its sidecar)."""
    sums = root / INPUTS / f"{key}{SUMS}"
    return (sum(e.size for e in _entries(root / INPUTS / f"{key}.zarr", lambda rel: ("inputs",)))
            + sum(e.size for e in _entries(sums, lambda rel: ("inputs",))))


def disk_usage(root: str | os.PathLike[str], rows: Mapping[int, tuple[str, str]],
               table_bytes: Mapping[str, int], run: int | None = None) -> DiskUsage:
    """The store at ``root``'s bytes (see the module's docstring).  ``rows``: the
    catalog's runs (id -> (status, workflow)); ``table_bytes``: the catalog's bytes
    per table (empty when SQLite cannot say); ``run``: list that run alone (the whole
    store is still read: what a run shares is known only from every link)."""
    root = Path(root)
    entries = list(_store_entries(root))
    units, seen = _account(entries)
    runs = _runs(entries, units, seen, rows, root)
    counted: set = set()
    tops = {k: Part() for k in ("inputs", "catalog", "other")}
    copies: dict[str, int] = {}
    shared, total, once = 0, 0, set()
    for e in entries:
        alone = len(units[e.inode]) == 1 and seen[e.inode] >= e.links
        if e.inode not in once:
            once.add(e.inode)
            total += e.size
            shared += 0 if alone else e.size
        if e.part[0] != "run":
            _add(tops[e.part[0]], e, alone, counted)
        if e.part[0] == "inputs" and e.part[1] is not None:
            copies[e.part[1]] = copies.get(e.part[1], 0) + e.size
    for ru in runs.values():
        ru.inputs = _inputs_read(root, ru.run, lambda key: copies.get(f"{key}.zarr", 0)
                                 + copies.get(f"{key}{SUMS}", 0))
        ru.not_kept = not_kept(root, ru.folders)
    cat = tops["catalog"]
    trace = min(sum(table_bytes.get(t, 0) for t in TRACE_TABLES), cat.bytes)
    plans = min(sum(table_bytes.get(t, 0) for t in PLAN_TABLES), cat.bytes - trace)
    listed = [runs[k] for k in sorted(runs) if run is None or k == run]
    if run is not None and not listed:
        listed = [RunUsage(run, status=rows.get(run, (None, None))[0],
                           workflow=rows.get(run, (None, None))[1])]
    return DiskUsage(str(root), listed, tops["inputs"], cat, trace, plans, tops["other"], shared,
                     total)


def run_usage(root: str | os.PathLike[str], run: int) -> RunUsage:
    """One run's bytes, reading its own folder(s) and the store's copies of its inputs
    alone (cheap, for ``subzero run`` and ``show``): a file counts as owned alone when
    every one of its links is in the run's folder."""
    root = Path(root)
    entries = list(_store_entries(root, only=run))
    units, seen = _account(entries)
    runs = _runs(entries, units, seen, {}, root)
    ru = runs.get(run, RunUsage(run))
    ru.inputs = _inputs_read(root, run, lambda key: _copy_bytes(root, key))
    ru.not_kept = not_kept(root, ru.folders)
    return ru


def not_kept(root: Path, folders: list[str]) -> list[str]:
    """The arrays of a run's folders that the run did not keep, as their sidecars say
    (read as every metadata file is, not verified: what ``du`` shows, not what a read
    trusts)."""
    out = []
    for folder in folders:
        arrays = root / "runs" / folder / "arrays"
        if not arrays.is_dir():
            continue
        for f in sorted(arrays.iterdir()):
            if not f.name.endswith(SUMS) or f.name.startswith("."):
                continue
            try:
                if "dropped" in json.loads(read_metadata(f)):
                    out.append(f.name[:-len(SUMS)])
            except (OSError, ValueError, UnsafeFile):
                continue
    return out
