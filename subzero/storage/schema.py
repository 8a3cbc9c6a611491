"""The catalog's SQLite schema, versioned, and the migrations between versions.

The version is SQLite's ``PRAGMA user_version``: 0 for a new file and for stores
made before the catalog was versioned (their tables are then those of version 1,
perhaps without the tables added since, perhaps with ``blocks_in`` already: the
migrations take both).  Migration *n* brings a catalog from version *n* to
*n + 1*; opening a catalog runs the ones it lacks, all in one transaction, so a
crash leaves the old version intact and two processes opening one store at once
migrate it once.  A catalog of a newer version than this SubZero knows is
refused with one line: its tables may mean something this code would get wrong.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from subzero.errors import StoreError

#: Tables of catalog version 1 (what SubZero created before versions existed).
TABLES_V1 = (
    """CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, workflow TEXT, source TEXT, params TEXT,
  status TEXT, started REAL, ended REAL, error TEXT, inputs TEXT, pid INTEGER,
  host TEXT, engine TEXT)""",
    """CREATE TABLE IF NOT EXISTS arrays (
  run_id INTEGER, name TEXT, kind TEXT, shape TEXT, dtype TEXT, nbytes INTEGER,
  PRIMARY KEY (run_id, name))""",
    """CREATE TABLE IF NOT EXISTS ops (
  run_id INTEGER, name TEXT, cls TEXT, inputs TEXT, strategies TEXT, shape TEXT,
  run_s REAL, lwrite_s REAL, lineage_s REAL, pairs INTEGER, lineage_bytes INTEGER,
  seq INTEGER, PRIMARY KEY (run_id, name))""",
    """CREATE TABLE IF NOT EXISTS strategy_stats (
  run_id INTEGER, op TEXT, strategy TEXT, bytes INTEGER, write_s REAL, pairs INTEGER,
  PRIMARY KEY (run_id, op, strategy))""",
    """CREATE TABLE IF NOT EXISTS trace_steps (
  id INTEGER PRIMARY KEY AUTOINCREMENT, trace_id TEXT, run_id INTEGER, op TEXT,
  input_idx INTEGER, direction TEXT, method TEXT, cells_in INTEGER, cells_out INTEGER,
  seconds REAL, ts REAL)""",
    """CREATE TABLE IF NOT EXISTS traces (
  trace_id TEXT PRIMARY KEY, run_id INTEGER, start TEXT, target TEXT, direction TEXT,
  signature TEXT, spec TEXT, cells_in INTEGER, cells_out INTEGER, seconds REAL, ts REAL)""",
    """CREATE TABLE IF NOT EXISTS strategy_spaces (
  run_id INTEGER, op TEXT, strategy TEXT, data TEXT, PRIMARY KEY (run_id, op, strategy))""",
    """CREATE TABLE IF NOT EXISTS profiles (
  run_id INTEGER PRIMARY KEY, workflow TEXT, params TEXT, base_s REAL, data TEXT, created REAL)""",
    """CREATE TABLE IF NOT EXISTS calibrations (
  id INTEGER PRIMARY KEY AUTOINCREMENT, host TEXT, created REAL, seconds REAL, data TEXT)""",
    """CREATE TABLE IF NOT EXISTS plans (
  name TEXT PRIMARY KEY, workflow TEXT, created REAL, data TEXT)""",
    """CREATE TABLE IF NOT EXISTS downgrades (
  run_id INTEGER, op TEXT, strategy TEXT, predicted_bytes INTEGER, needed_bytes INTEGER,
  reason TEXT, ts REAL)""",
)


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def _create_tables(db: sqlite3.Connection) -> None:
    # IF NOT EXISTS: an unversioned store already has some or all of them
    for stmt in TABLES_V1:
        db.execute(stmt)


def _add_blocks_in(db: sqlite3.Connection) -> None:
    # unversioned stores may have it already (it used to be added on open)
    if "blocks_in" not in _columns(db, "trace_steps"):
        db.execute("ALTER TABLE trace_steps ADD COLUMN blocks_in INTEGER DEFAULT 0")


def _add_identity(db: sqlite3.Connection) -> None:
    # a run's random uid (what its stored bytes are bound to) and the store's own
    if "uid" not in _columns(db, "runs"):
        db.execute("ALTER TABLE runs ADD COLUMN uid TEXT")
    db.execute("CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value TEXT)")


def _add_runs_in(db: sqlite3.Connection) -> None:
    # idempotent like every step: a catalog whose version was rolled back may have it
    if "runs_in" not in _columns(db, "trace_steps"):
        db.execute("ALTER TABLE trace_steps ADD COLUMN runs_in INTEGER DEFAULT 0")


def _add_digests(db: sqlite3.Connection) -> None:
    # an input's content digest (subzero.model.content), indexed: "which runs used this flat?"
    if "digest" not in _columns(db, "arrays"):
        db.execute("ALTER TABLE arrays ADD COLUMN digest TEXT")
    db.execute("CREATE INDEX IF NOT EXISTS arrays_digest ON arrays (digest)")


def _add_reruns(db: sqlite3.Connection) -> None:
    # a re-run's parent and what it recomputed (the run's record holds the same, signed)
    db.execute("CREATE TABLE IF NOT EXISTS reruns (run_id INTEGER PRIMARY KEY, parent INTEGER,"
               " summary TEXT)")
    db.execute("CREATE INDEX IF NOT EXISTS reruns_parent ON reruns (parent)")


def _add_step_work(db: sqlite3.Connection) -> None:
    # a step's own CPU time and the stored read it gave up (query-time planner)
    have = _columns(db, "trace_steps")
    for col, decl in (("cpu_s", "REAL DEFAULT 0"), ("abandoned", "TEXT DEFAULT ''"),
                      ("abandoned_s", "REAL DEFAULT 0"), ("done", "REAL DEFAULT 0")):
        if col not in have:
            db.execute(f"ALTER TABLE trace_steps ADD COLUMN {col} {decl}")


def _add_tags(db: sqlite3.Connection) -> None:
    # names people give runs (`subzero tag`); a run deleted by `subzero gc` keeps its row,
    # status 'deleted', so its id is never given again and its re-runs still name it
    db.execute("CREATE TABLE IF NOT EXISTS tags (name TEXT PRIMARY KEY, run_id INTEGER,"
               " created REAL)")
    db.execute("CREATE INDEX IF NOT EXISTS tags_run ON tags (run_id)")


def _add_cold(db: sqlite3.Connection) -> None:
    # a step that met cold caches (its first use of the lineage store, a reader or an
    # array): the cost model does not learn from it
    if "cold" not in _columns(db, "trace_steps"):
        db.execute("ALTER TABLE trace_steps ADD COLUMN cold INTEGER DEFAULT 0")


@dataclass(frozen=True)
class Migration:
    """Brings a catalog from version ``to - 1`` to ``to``."""

    to: int
    what: str
    apply: Callable[[sqlite3.Connection], None]


#: In order; the last one's version is the version this SubZero writes.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "the tables of runs, arrays, operators, statistics, traces and plans",
              _create_tables),
    Migration(2, "trace_steps.blocks_in: key blocks a step's query spanned (query-time planner)",
              _add_blocks_in),
    Migration(3, "trace_steps.runs_in: runs of consecutive cells a step's query held (R-tree "
                 "probes, query-time planner)", _add_runs_in),
    Migration(4, "runs.uid and store_meta: the random identities a run's stored bytes and the "
                 "store's runs are bound to (older runs have none: they read as unbound)",
              _add_identity),
    Migration(5, "arrays.digest: each input's content digest, indexed (older runs have none "
                 "until it is computed)", _add_digests),
    Migration(6, "reruns: each re-run's parent run and what it recomputed", _add_reruns),
    Migration(7, "trace_steps.cpu_s, abandoned, abandoned_s, done: a step's own CPU time and "
                 "the stored read it gave up for re-execution (query-time planner; older "
                 "steps have none)", _add_step_work),
    Migration(8, "tags: names given to runs (`subzero tag`), which `subzero gc` keeps",
              _add_tags),
    Migration(9, "trace_steps.cold: a step that met cold caches, which the cost model does not "
                 "learn from (older steps read as warm)", _add_cold),
)
SCHEMA_VERSION = MIGRATIONS[-1].to
assert [m.to for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


def version_of(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _check_known(version: int, path: Path) -> None:
    if version > SCHEMA_VERSION:
        raise StoreError(f"store catalog {path} was written by a newer SubZero (catalog version "
                         f"{version}; this one knows up to {SCHEMA_VERSION}); upgrade SubZero to open it")


def migrate(db: sqlite3.Connection, path: Path) -> int:
    """Bring the catalog at ``path`` (open as ``db``, autocommit mode) to
    :data:`SCHEMA_VERSION`; returns the version it had.  Raises StoreError for a
    newer catalog."""
    found = version_of(db)
    _check_known(found, path)
    if found == SCHEMA_VERSION:
        return found
    db.execute("BEGIN IMMEDIATE")       # re-read under the write lock: another process may have
    try:                                # migrated meanwhile
        found = version_of(db)
        _check_known(found, path)
        for m in MIGRATIONS[found:]:
            m.apply(db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return found
