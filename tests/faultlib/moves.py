"""Faults that move pieces rather than damage bytes (issue 28, item 9).

Three families of target kinds, drawn like the others (uniform over the kinds a
fixture has, then a target of that kind, then what is done to it):

* ``place:*`` -- intact pieces in the wrong place: two chunks of one array swapped
  (``chunk-swap``), a file of run 1 replaced by the same file of run 2 (the same
  workflow on another sky, ``from-run``), a whole array folder of run 2, with or
  without its checksum sidecar (``array-from-run``), run 2's ``lineage/`` folder or
  ``data.mdb`` (``lineage-from-run``), a file of the *twin* store (another store
  whose run 1 is the same workflow on the other sky: same run id, same paths) in
  place of this store's (``from-store``, the catalog and ``store.json`` included),
  and the twin's whole ``runs/1`` folder (``run-from-store``); two lineage shards of
  the run (Spark fixture: one per operator, strategy and tile) swapped
  (``shard-swap``);
* ``link:*`` -- a file (or the ``lineage`` folder) replaced by a symbolic link to
  run 2's (for the catalog and ``store.json``: the twin's), to ``/dev/zero``, to a
  missing path, or by a FIFO; by what the file is (a chunk, array metadata and
  sidecars, lineage, the run's record, signature, pickle and journal, the store's
  catalog and identity);
* ``catalog:*`` -- the catalog edited through SQL: fields that steer traces
  updated (array shapes, operators' inputs, strategies and shapes, strategy rows,
  the run's source, uid, status, parameters, inputs), rows deleted, or the whole
  catalog deleted or replaced by the copy taken before run 2.

Each case then also checks that nothing is lost: after the traces, ``store.runs()``,
``store.clean()`` and ``subzero.fsck()`` run on the damaged copy, and every entry
the copy's ``runs/`` folder held before must still be there (or, for what is not a
run folder, in ``quarantine/``); a run folder moved or removed, or a file gone, is
the outcome ``data lost``; so is a run folder that the catalog does not list as a
complete run after an fsck that left nothing unresolved.  For catalog cases the queries are traced again after
``fsck`` (which rebuilds or repairs the catalog from the runs' signed records).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from faultlib.damage import Damage, Target, file_kind
from subzero.storage.shared import INPUTS, REF

PLACE_KINDS = ("place:chunk-swap", "place:from-run", "place:array-from-run",
               "place:lineage-from-run", "place:run-from-run", "place:from-store",
               "place:run-from-store", "place:shard-swap")
LINK_KINDS = ("link:chunk", "link:array-meta", "link:lineage", "link:run-file", "link:store-file")
CATALOG_KINDS = ("catalog:update", "catalog:delete-rows", "catalog:whole")
MOVE_KINDS = (*PLACE_KINDS, *LINK_KINDS, *CATALOG_KINDS)
#: what a move does (``Damage.kind``)
LINKS = ("symlink-run", "symlink-dev-zero", "symlink-missing", "fifo")
MOVES = ("swap-chunks", "swap-shards", "copy-from-run", "array-from-run", "array+sidecar-from-run",
         "copy-from-store", *LINKS, "sql", "delete-catalog", "older-catalog")
#: kinds whose damage cannot change an array's values (see cases.checks_values)
LINEAGE_MOVES = ("place:lineage-from-run", "link:lineage", "place:shard-swap")

RUN = "runs/1"
OTHER = "runs/2"
OPS = ("calib", "smooth", "clean", "stars")
ARRAYS = ("raw", "flat", "calib", "smooth", "clean", "stars")

#: catalog edits: fields that steer traces, and the run's identity and state
UPDATES = (
    "UPDATE arrays SET shape = '[32, 96]' WHERE run_id = 1 AND name = '{array}'",
    "UPDATE arrays SET shape = '[64, 97]' WHERE run_id = 1 AND name = '{array}'",
    "UPDATE arrays SET shape = '[96, 64]' WHERE run_id = 1 AND name = '{array}'",
    "UPDATE arrays SET dtype = 'int8' WHERE run_id = 1 AND name = '{array}'",
    "UPDATE arrays SET kind = 'input' WHERE run_id = 1 AND name = '{array}'",
    "UPDATE ops SET inputs = '[\"flat\"]' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET inputs = '[\"raw\", \"flat\"]' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET inputs = '[\"{op2}\"]' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET inputs = '[]' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET strategies = '[\"full:fullone:backward\", \"full:fullone:forward\"]' "
    "WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET strategies = '[\"pay:paymany:backward\"]' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET strategies = '[\"map\"]' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET strategies = '[\"blackbox\"]' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET strategies = (SELECT strategies FROM ops WHERE run_id = 1 AND name = '{op2}') "
    "WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET shape = '[32, 32]' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET cls = 'BoxBlur' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE ops SET name = '{op2}x' WHERE run_id = 1 AND name = '{op}'",
    "UPDATE strategy_spaces SET data = '{{}}' WHERE run_id = 1 AND op = '{op}'",
    "UPDATE OR REPLACE strategy_spaces SET strategy = 'full:fullmany:backward' WHERE run_id = 1 AND op = '{op}'",
    "UPDATE OR REPLACE strategy_stats SET strategy = 'full:fullmany:forward' WHERE run_id = 1 AND op = '{op}'",
    "UPDATE runs SET source = '{other_source}' WHERE id = 1",
    "UPDATE runs SET source = '/nonexistent/example.py' WHERE id = 1",
    "UPDATE runs SET workflow = 'other' WHERE id = 1",
    "UPDATE runs SET params = '{{\"radius\": 3}}' WHERE id = 1",
    "UPDATE runs SET inputs = (SELECT inputs FROM runs WHERE id = 2) WHERE id = 1",
    "UPDATE runs SET uid = (SELECT uid FROM runs WHERE id = 2) WHERE id = 1",
    "UPDATE runs SET uid = '00000000000000000000000000000000' WHERE id = 1",
    "UPDATE runs SET uid = NULL WHERE id = 1",
    "UPDATE runs SET status = '{status}' WHERE id = 1",
    "UPDATE runs SET engine = 'spark' WHERE id = 1",
    # the rows of runs 1 and 2 swapped (through negative ids: keys stay unique)
    "UPDATE runs SET id = -id WHERE id IN (1, 2); UPDATE runs SET id = 3 + id WHERE id < 0",
    "UPDATE ops SET run_id = -run_id WHERE run_id IN (1, 2); "
    "UPDATE ops SET run_id = 3 + run_id WHERE run_id < 0",
    "UPDATE arrays SET run_id = -run_id WHERE run_id IN (1, 2); "
    "UPDATE arrays SET run_id = 3 + run_id WHERE run_id < 0",
    "UPDATE store_meta SET value = '00000000000000000000000000000000' WHERE key = 'store_uid'",
)
DELETES = (
    "DELETE FROM runs WHERE id = 1",
    "DELETE FROM runs",
    "DELETE FROM ops WHERE run_id = 1 AND name = '{op}'",
    "DELETE FROM ops WHERE run_id = 1",
    "DELETE FROM arrays WHERE run_id = 1 AND name = '{array}'",
    "DELETE FROM arrays WHERE run_id = 1",
    "DELETE FROM strategy_spaces WHERE run_id = 1",
    "DELETE FROM strategy_stats WHERE run_id = 1 AND op = '{op}'",
    "DELETE FROM store_meta",
)
STATUSES = ("failed", "running", "interrupted", "recovered")
#: another workflow module for ``runs.source``
OTHER_SOURCE = str(Path(__file__).resolve().parents[2] / "workflows" / "astronomy.py")


def family(kind: str) -> str:
    """``place``, ``link``, ``catalog`` (the moves) or ``damage`` (bytes changed)."""
    head, sep, _ = kind.partition(":")
    return head if sep and head in ("place", "link", "catalog") else "damage"


# -- what a fixture offers ----------------------------------------------------------------
def _copies(store: Path, run: str, by_name: bool = False) -> dict[str, str]:
    """The store's copies of a run's inputs (``inputs/<key>.zarr``, relative to the store), by
    the run's input name, as its references name them."""
    import json
    out = {}
    for ref in sorted((store / run / "arrays").glob(f"*{REF}")):
        try:
            body = json.loads(ref.read_text())
            key = f"{body['input'].split(':', 1)[1]}-{body['form']}"
        except (OSError, ValueError, KeyError, IndexError, AttributeError):
            continue
        out[ref.name[:-len(REF)]] = f"{INPUTS}/{key}.zarr"
    return out


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and not p.is_symlink())


def _link_kind(rel: str) -> str | None:
    """The ``link:*`` kind of a store path (relative to the store)."""
    if rel in ("catalog.sqlite", "store.json"):
        return "link:store-file"
    if rel.startswith(f"{INPUTS}/"):
        kind = file_kind(rel)
        if kind == "zarr-chunk":
            return "link:chunk"
        return "link:array-meta" if kind == "zarr-meta" or rel.endswith(".sums.json") else None
    if not rel.startswith(RUN + "/"):
        return None
    inner = rel[len(RUN) + 1:]
    if inner == "lineage" or inner.startswith("lineage/"):
        return "link:lineage"
    if inner in ("run.json", "signature", "workflow.pkl", "journal.jsonl"):
        return "link:run-file"
    kind = file_kind(inner)
    if kind == "zarr-chunk":
        return "link:chunk"
    if kind == "zarr-meta" or inner.endswith(".sums.json"):
        return "link:array-meta"
    return None


def list_moves(fx) -> list[Target]:
    """Every target of the moving kinds the fixture offers, in a stable order."""
    store, twin = fx.store, fx.twin
    out: list[Target] = []
    mine = [r for r in _files(store) if r.startswith(RUN + "/")]
    # the store's copies of the inputs run 1 reads (shared with run 2 where the content is)
    copies = [r for r in _files(store) if r.startswith(tuple(f"{c}/" for c in _copies(store, RUN)))]
    other = set(_files(store / OTHER))
    for rel in copies:
        if file_kind(rel) == "zarr-chunk":
            out.append(Target("place:chunk-swap", rel, 0))
    for name, path in sorted(_copies(store, RUN).items(), key=lambda kv: kv[1]):
        theirs = _copies(store, OTHER, by_name=True).get(name)
        if theirs is not None and theirs != path:
            out.append(Target("place:array-from-run", path, 0))
    for rel in mine:
        inner = rel[len(RUN) + 1:]
        if file_kind(inner) == "zarr-chunk":
            out.append(Target("place:chunk-swap", rel, 0))
        if rel.endswith(".szs") and len([r for r in mine if r.endswith(".szs")]) > 1:
            out.append(Target("place:shard-swap", rel, 0))
        if inner in other:
            out.append(Target("place:from-run", rel, 0))
    for a in sorted((store / RUN / "arrays").glob("*.zarr")):
        out.append(Target("place:array-from-run", a.relative_to(store).as_posix(), 0))
    for rel in (f"{RUN}/lineage", f"{RUN}/lineage/data.mdb"):
        if (store / rel).exists() and (store / OTHER / rel[len(RUN) + 1:]).exists():
            out.append(Target("place:lineage-from-run", rel, 0))
    out.append(Target("place:run-from-run", RUN, 0))
    if twin is not None:
        theirs = set(_files(twin))
        for rel in [*mine, *copies, "catalog.sqlite", "store.json"]:
            if rel in theirs:
                out.append(Target("place:from-store", rel, 0))
        out.append(Target("place:run-from-store", RUN, 0))
    for rel in [*mine, *copies, "catalog.sqlite", "store.json", f"{RUN}/lineage"]:
        kind = _link_kind(rel)
        if kind is not None and (store / rel).exists():
            out.append(Target(kind, rel, 0))
    if fx.old_catalog is not None:
        out += [Target("catalog:update", "catalog.sqlite", 0),
                Target("catalog:delete-rows", "catalog.sqlite", 0),
                Target("catalog:whole", "catalog.sqlite", 0)]
    return out


# -- drawing ---------------------------------------------------------------------------------
def _pick(rng: np.random.Generator, xs):
    return xs[int(rng.integers(len(xs)))]


def draw_move(rng: np.random.Generator, fx, t: Target, kind: str | None = None) -> Damage:
    """What is done to a target of a moving kind (``kind``: force the ``Damage.kind``)."""
    inner = t.path[len(RUN) + 1:] if t.path.startswith(RUN + "/") else t.path
    if t.kind == "place:chunk-swap":
        folder = t.path.split(".zarr/", 1)[0] + ".zarr/"
        peers = [x.path for x in fx.targets if x.kind == t.kind and x.path.startswith(folder)
                 and x.path != t.path]
        return Damage("swap-chunks", other=_pick(rng, peers))
    if t.kind == "place:shard-swap":
        peers = [x.path for x in fx.targets if x.kind == t.kind and x.path != t.path]
        return Damage("swap-shards", other=_pick(rng, peers))
    if t.kind == "place:run-from-run":
        return Damage("copy-from-run", other=OTHER)
    if t.kind in ("place:from-run", "place:lineage-from-run"):
        return Damage("copy-from-run", other=f"{OTHER}/{inner}")
    if t.kind == "place:array-from-run":
        if t.path.startswith(f"{INPUTS}/"):       # the store's copy of run 2's input of that name
            name = next(n for n, p in _copies(fx.store, RUN).items() if p == t.path)
            theirs = _copies(fx.store, OTHER, by_name=True)[name]
            return Damage(kind or _pick(rng, ("array-from-run", "array+sidecar-from-run")),
                          other=theirs)
        return Damage(kind or _pick(rng, ("array-from-run", "array+sidecar-from-run")),
                      other=f"{OTHER}/{inner}")
    if t.kind in ("place:from-store", "place:run-from-store"):
        return Damage("copy-from-store", other=f"twin:{t.path}")
    if t.kind.startswith("link:"):
        k = kind or _pick(rng, LINKS)
        if k == "symlink-run":
            other = f"twin:{t.path}" if t.kind == "link:store-file" else f"{OTHER}/{inner}"
        elif k == "symlink-dev-zero":
            other = "/dev/zero"
        elif k == "symlink-missing":
            other = f"{t.path}.missing"
        else:
            other = ""
        return Damage(k, other=other)
    if t.kind in ("catalog:update", "catalog:delete-rows"):
        template = _pick(rng, UPDATES if t.kind == "catalog:update" else DELETES)
        op = _pick(rng, OPS)
        sql = template.format(array=_pick(rng, ARRAYS), op=op,
                              op2=_pick(rng, [o for o in OPS if o != op]),
                              status=_pick(rng, STATUSES),
                              other_source=OTHER_SOURCE)
        return Damage("sql", other=sql)
    if t.kind == "catalog:whole":
        return Damage(kind or _pick(rng, ("delete-catalog", "older-catalog")))
    raise ValueError(f"not a moving kind: {t.kind!r}")


# -- applying ---------------------------------------------------------------------------------
def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def _copy(src: Path, dst: Path) -> None:
    _remove(dst)
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copyfile(src, dst)


def _source(store: Path, other: str, fx) -> Path:
    if other.startswith("twin:"):
        assert fx is not None and fx.twin is not None
        return Path(fx.twin) / other[len("twin:"):]
    return store / other


def move(store: Path, t: Target, d: Damage, fx) -> None:
    """Do move ``d`` to target ``t`` of the store copy at ``store``."""
    path = store / t.path
    if d.kind in ("swap-chunks", "swap-shards"):
        other = store / d.other
        tmp = path.with_name(path.name + ".swap")
        path.rename(tmp)
        other.rename(path)
        tmp.rename(other)
    elif d.kind in ("copy-from-run", "copy-from-store"):
        _copy(_source(store, d.other, fx), path)
    elif d.kind in ("array-from-run", "array+sidecar-from-run"):
        src = store / d.other
        _copy(src, path)
        if d.kind == "array+sidecar-from-run":
            side = src.with_name(src.name[:-len(".zarr")] + ".sums.json")
            _copy(side, path.with_name(path.name[:-len(".zarr")] + ".sums.json"))
    elif d.kind in LINKS:
        _remove(path)
        if d.kind == "fifo":
            os.mkfifo(path)
            return
        if d.kind == "symlink-run" and d.other.startswith("twin:"):
            # a copy of the twin's file inside the case's folder: what is written through
            # the link must not reach the shared twin fixture
            src = _source(store, d.other, fx)
            target = store / "elsewhere" / src.name
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, target)
        elif d.kind == "symlink-run":
            target = store / d.other
        elif d.kind == "symlink-missing":
            target = store / d.other
        else:
            target = Path(d.other)
        path.symlink_to(target)
    elif d.kind == "sql":
        import sqlite3
        con = sqlite3.connect(path)
        try:
            con.executescript(d.other)
            con.commit()
        finally:
            con.close()
    elif d.kind == "delete-catalog":
        path.unlink()
    elif d.kind == "older-catalog":
        assert fx is not None and fx.old_catalog is not None
        shutil.copyfile(fx.old_catalog, path)
    else:
        raise ValueError(f"unknown move {d.kind!r}")


# -- nothing lost ------------------------------------------------------------------------------
def inventory(store: Path) -> set[str]:
    """Every entry under ``runs/`` (links not followed), relative to it, and the store's
    copies of inputs (``../inputs/<name>``)."""
    runs = store / "runs"
    out = set()
    for top, dirs, files in os.walk(runs):
        for n in (*dirs, *files):
            out.add(os.path.relpath(os.path.join(top, n), runs))
    if (store / INPUTS).is_dir():
        out |= {f"../{INPUTS}/{p.name}" for p in (store / INPUTS).iterdir()
                if not p.name.startswith(".")}
    return out


def quarantined(store: Path) -> set[str]:
    """Entries moved to ``quarantine/``, named as they were under ``runs/``."""
    q = store / "quarantine"
    out: set[str] = set()
    if not q.is_dir():
        return out
    for entry in q.iterdir():
        name = entry.name.rsplit(".", 1)[0]
        out.add(name)
        if entry.is_dir() and not entry.is_symlink():
            for top, dirs, files in os.walk(entry):
                for n in (*dirs, *files):
                    out.add(os.path.join(name, os.path.relpath(os.path.join(top, n), entry)))
    return out


def lost(before: set[str], store: Path) -> str:
    """What of ``before`` (an :func:`inventory`) is gone: a run folder no longer in
    ``runs/``, or any entry neither in ``runs/`` nor in ``quarantine/``; "" if nothing."""
    now = inventory(store)
    folders = sorted(x for x in before if x.isdigit() and x not in now)
    if folders:
        return f"run folder(s) {', '.join('runs/' + f for f in folders)} no longer in runs/"
    gone = sorted(before - now - quarantined(store))
    copies = [g for g in gone if g.startswith(f"../{INPUTS}/")]
    if copies:
        return f"{len(copies)} of the store's input copies gone: {', '.join(copies[:3])}"
    if gone:
        return f"{len(gone)} entr(ies) of runs/ gone: {', '.join(gone[:3])}"
    return ""


def unlisted(store: Path) -> str:
    """After an fsck that left nothing unresolved, every run folder must be a complete run
    of the catalog (fsck gets the runs of a deleted or older catalog back); "" if so."""
    import subzero
    try:
        with subzero.open_store(store, create=False) as st:
            rows = {r.id: r.status for r in st.runs()}
    except Exception as e:
        return f"the store does not open after an fsck that found nothing unresolved: {e}"
    folders = sorted(int(p.name) for p in (store / "runs").iterdir() if p.name.isdigit())
    missing = [f"run {i} ({rows.get(i, 'not in the catalog')})" for i in folders
               if rows.get(i) != "complete"]
    return ("after fsck (nothing unresolved) the catalog does not list " + ", ".join(missing)
            + " as complete") if missing else ""


def after_checks(store: Path, fx, queries, values: bool, retrace: bool) -> list[tuple[str, str, str]]:
    """``store.runs()``, ``store.clean()``, ``subzero.fsck()`` on the damaged copy, each a
    query-like outcome; ``data lost`` when a run folder or file is gone; with
    ``retrace``, the queries traced again after fsck (labels ``after fsck: ...``)."""
    import subzero
    from faultlib.cases import classify_error, compare
    from faultlib.fixtures import answer_of
    out: list[tuple[str, str, str]] = []
    before = inventory(store)
    try:
        with subzero.open_store(store, create=False) as st:
            st.runs()
            st.clean()
        out.append(("clean", "exact", ""))
    except Exception as e:
        out.append(("clean", *classify_error(e)))
    unresolved = None
    try:
        unresolved = [f for f in subzero.fsck(store) if f.unresolved]
        out.append(("fsck", "exact", ""))
    except Exception as e:
        out.append(("fsck", *classify_error(e)))
    gone = lost(before, store)
    if not gone and unresolved == []:
        gone = unlisted(store)
    out.append(("nothing lost", "data lost", gone) if gone else ("nothing lost", "exact", ""))
    if retrace:
        try:
            st = subzero.open_store(store, create=False)
        except Exception as e:
            out.append(("after fsck: open", *classify_error(e)))
            return out
        try:
            run = st.get(fx.run_id)
            for q in queries:
                try:
                    outcome, detail = compare(answer_of(run, q, values), fx.answers[q.label])
                except Exception as e:
                    outcome, detail = classify_error(e)
                out.append((f"after fsck: {q.label}", outcome, detail))
        except Exception as e:
            out.append(("after fsck: open", *classify_error(e)))
        finally:
            try:
                st.close()
            except Exception as e:
                out.append(("after fsck: close", *classify_error(e)))
    return out
