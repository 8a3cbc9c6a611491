"""Catalog: runs, operator instances, strategies and statistics (SQLite).

SQLite gives the durable, atomic bookkeeping runs need: a run row is
``running`` until the engine has moved the run's folder into place and then
flips it to ``complete`` in one transaction; a crash leaves it ``running``
whose driver is gone (a dead pid on its host, a stale heartbeat from another:
:mod:`subzero.storage.liveness`), which is reported as ``interrupted``, never as
complete, until ``subzero run --resume`` takes it over.
The tables and their versions are :mod:`subzero.storage.schema`; opening a
catalog migrates an older one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from subzero.errors import DiskFull, QueryError, StoreError
from subzero.storage.liveness import alive, heartbeat_path
from subzero.storage.schema import SCHEMA_VERSION, migrate, version_of
from subzero.storage.space import disk_full, is_full


@dataclass
class RunRow:
    id: int
    workflow: str
    source: str | None
    params: dict
    status: str
    started: float
    ended: float | None
    error: str | None
    inputs: dict
    engine: str
    #: the run's random identity, which its stored bytes are bound to (None: a run made
    #: before runs had one, read as unbound)
    uid: str | None = None


class Catalog:
    """The store's SQLite catalog.  ``readonly`` (default: when this process may not
    write the file or its folder, as in an archived store) opens it for reading
    only: listing, showing and tracing work, anything that would write raises a
    :class:`~subzero.errors.StoreError` naming the file.  Every SQLite failure
    (damaged file, busy, read-only, disk full) is such a one-line StoreError; a full
    disk is :class:`~subzero.errors.DiskFull`, and a catalog that cannot be opened for
    writing because its disk is full is read as an archived one is (``full``)."""

    def __init__(self, path: str | os.PathLike, readonly: bool | None = None):
        self.path = Path(path)
        #: the store's runs folder, where running runs' heartbeat files are
        self.runs_dir = self.path.parent / "runs"
        #: opened for reading only (nothing this process does writes the catalog)
        self.readonly = not writable(self.path) if readonly is None else readonly
        #: The catalog version the store had when opened (0: new or unversioned).
        self.opened_version = 0
        #: Why it could not be opened for writing although it may be written: its disk is
        #: full (then it is read as an archived store is, and writing raises this).
        self.full: DiskFull | None = None
        if not self.readonly:
            try:
                self.db = self._open_rw()
                return
            except DiskFull as e:
                if not self.path.is_file():
                    raise
                self.full = e           # a full disk: list, show and trace still work
            except StoreError:
                if writable(self.path) or not self.path.exists():
                    raise
            self.readonly = True    # lost write access meanwhile: read it as archived
        self.db = self._open_ro()

    def _open_rw(self) -> sqlite3.Connection:
        db = _connect(self.path, str(self.path), uri=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self.opened_version = migrate(db, self.path)
        except sqlite3.DatabaseError as e:
            db.close()
            raise StoreError(f"store catalog {self.path} cannot be opened: {e}") from e
        except BaseException:
            db.close()
            raise
        return db

    def _open_ro(self) -> sqlite3.Connection:
        """Read-only: ``mode=ro``, or ``immutable=1`` when SQLite cannot even make the
        WAL's shared-memory file next to it.  A catalog of an older version is
        migrated in a private in-memory copy (the file is never changed); writes are
        refused (``query_only``)."""
        if not self.path.is_file():
            raise StoreError(f"store catalog {self.path} is missing and its folder is read-only; "
                             f"is {self.path.parent} a SubZero store?")
        uri = "file:" + quote(str(self.path.resolve()))
        db = None
        try:
            try:
                db = _connect(self.path, uri + "?mode=ro", uri=True)
                found = version_of(db)
            except (sqlite3.OperationalError, StoreError):  # no -shm possible: nobody writes it
                if db is not None:
                    db.close()
                db = _connect(self.path, uri + "?immutable=1", uri=True)
                found = version_of(db)
            self.opened_version = found
            if found < SCHEMA_VERSION:
                mem = _connect(self.path, ":memory:", uri=False)
                db.backup(mem)
                db.close()
                db = mem
            migrate(db, self.path)      # checks the version; migrates only the memory copy
            db.execute("PRAGMA query_only=ON")
        except sqlite3.DatabaseError as e:
            if db is not None:
                db.close()
            raise StoreError(f"store catalog {self.path} cannot be opened: {e}") from e
        except BaseException:
            if db is not None:
                db.close()
            raise
        return db

    def close(self) -> None:
        self.db.close()

    def tx(self) -> _Tx:
        """One write transaction: ``with catalog.tx(): ...`` commits, or rolls back on error."""
        return _Tx(self.db)

    # -- runs -----------------------------------------------------------------------
    def begin_run(self, workflow: str, source: str | None, params: dict, inputs: dict,
                  engine: str, uid: str | None = None) -> int:
        cur = self.db.execute(
            "INSERT INTO runs (workflow, source, params, status, started, inputs, pid, host, engine,"
            " uid) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
            (workflow, source, json.dumps(params, default=str), time.time(),
             json.dumps(inputs, default=str), os.getpid(), os.uname().nodename, engine, uid))
        assert cur.lastrowid is not None
        return cur.lastrowid

    # -- the store's identity --------------------------------------------------------
    def meta(self, key: str) -> str | None:
        r = self.db.execute("SELECT value FROM store_meta WHERE key=?", (key,)).fetchone()
        return None if r is None else str(r[0])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO store_meta VALUES (?, ?)", (key, value))

    def table_bytes(self) -> dict[str, int]:
        """Bytes of the catalog's pages per table, its indexes included (SQLite's
        ``dbstat``; empty when this SQLite was built without it).  Reads only."""
        try:
            rows = self.db.execute(
                "SELECT COALESCE(m.tbl_name, d.name), SUM(d.pgsize) FROM dbstat d"
                " LEFT JOIN sqlite_schema m ON m.name = d.name GROUP BY 1").fetchall()
        except sqlite3.DatabaseError:
            return {}
        return {str(r[0]): int(r[1] or 0) for r in rows}

    def max_run_id(self) -> int:
        """The highest run id this catalog has given (0 for none)."""
        r = self.db.execute("SELECT MAX(id) FROM runs").fetchone()
        return int(r[0] or 0)

    def finish_run(self, run_id: int, status: str, error: str | None = None) -> None:
        self.db.execute("UPDATE runs SET status=?, ended=?, error=? WHERE id=?",
                        (status, time.time(), error, run_id))

    def forget_run(self, run_id: int) -> None:
        """Delete the row of a run that never wrote anything (its id was refused)."""
        self.db.execute("DELETE FROM runs WHERE id=?", (run_id,))

    def claim_run(self, run_id: int) -> RunRow:
        """Take over an interrupted run for this process (``--resume``): in one
        transaction, check its driver is gone and make this process its driver, so
        two resumes of one run cannot both proceed."""
        with self.tx():
            row = self.get_run(run_id)
            if row.status != "interrupted":
                why = {"running": "it is still running (its driver is alive)",
                       "complete": "it is complete", "failed": f"it failed ({row.error})"}
                raise StoreError(f"run {row.id} cannot be resumed: "
                                 f"{why.get(row.status, row.status)}")
            self.db.execute("UPDATE runs SET pid=?, host=? WHERE id=?",
                            (os.getpid(), os.uname().nodename, row.id))
        return row

    def runs(self) -> list[RunRow]:
        rows = self.db.execute("SELECT id, workflow, source, params, status, started, ended, error,"
                               " inputs, pid, host, engine, uid FROM runs ORDER BY id").fetchall()
        return [self._row(r) for r in rows]

    def _row(self, r: Sequence[Any]) -> RunRow:
        status = r[4]
        if status == "running" and not alive(r[9], r[10], heartbeat_path(self.runs_dir, r[0])):
            status = "interrupted"
        return RunRow(r[0], r[1], r[2], self._loads(r[3] or "{}"), status, r[5], r[6], r[7],
                      self._loads(r[8] or "{}"), r[11], r[12])

    def get_run(self, ref: str | int) -> RunRow:
        if isinstance(ref, str) and ref.strip().lower() == "latest":
            r = self.db.execute("SELECT id, workflow, source, params, status, started, ended, error,"
                                " inputs, pid, host, engine, uid FROM runs WHERE status='complete'"
                                " ORDER BY id DESC LIMIT 1").fetchone()
            if r is None:
                raise QueryError("there is no complete run in this store yet; run `subzero run` first")
            return self._row(r)
        try:
            rid = int(ref)
        except (TypeError, ValueError) as err:
            tagged = self.tagged(ref) if isinstance(ref, str) else None
            if tagged is None:
                raise QueryError(f"unknown run {ref!r}; give a run id (see `subzero runs`), a tag "
                                 f"(see `subzero tag`) or 'latest'") from err
            rid = tagged
        if not 0 <= rid < 2**63:        # SQLite's integers: a bigger id is no run
            raise QueryError(f"unknown run {ref!r}; see `subzero runs` for the runs in this store")
        r = self.db.execute("SELECT id, workflow, source, params, status, started, ended, error,"
                            " inputs, pid, host, engine, uid FROM runs WHERE id=?", (rid,)).fetchone()
        if r is None:
            raise QueryError(f"unknown run {ref!r}; see `subzero runs` for the runs in this store")
        return self._row(r)

    # -- arrays and operators ------------------------------------------------------------
    def add_array(self, run_id: int, name: str, kind: str, shape: Sequence[int], dtype: object,
                  nbytes: int, digest: str | None = None) -> None:
        self.db.execute("INSERT INTO arrays (run_id, name, kind, shape, dtype, nbytes, digest)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (run_id, name, kind, json.dumps(list(shape)), str(dtype), int(nbytes), digest))

    def input_digests(self, run_id: int) -> dict[str, str | None]:
        """Each input of a run and its content digest (None: not computed yet)."""
        rows = self.db.execute("SELECT name, digest FROM arrays WHERE run_id=? AND kind='input'"
                               " ORDER BY rowid", (run_id,)).fetchall()
        return {r[0]: r[1] for r in rows}

    def set_digest(self, run_id: int, name: str, digest: str) -> None:
        """Record an input's digest computed after the fact (a run made before digests)."""
        with self.tx():
            self.db.execute("UPDATE arrays SET digest=? WHERE run_id=? AND name=?",
                            (digest, run_id, name))

    def runs_with_input(self, digest: str) -> list[tuple[int, str]]:
        """(run id, input name) of every run whose input has this content digest, by
        the index: the cost follows the runs found, not the store's size."""
        return [(int(r[0]), r[1]) for r in self.db.execute(
            "SELECT run_id, name FROM arrays WHERE digest=? AND kind='input' ORDER BY run_id, rowid",
            (digest,))]

    def digests_in_use(self) -> set[str]:
        """The content digests of the inputs of every run not failed nor deleted: what
        ``clean`` and ``gc`` keep
        the store's copies of, whatever a run folder says."""
        return {str(r[0]) for r in self.db.execute(
            "SELECT DISTINCT a.digest FROM arrays a JOIN runs r ON r.id = a.run_id "
            "WHERE a.kind='input' AND a.digest IS NOT NULL AND r.status NOT IN ('failed', 'deleted')")}

    def runs_without_digests(self) -> list[int]:
        """Runs with an input whose digest is not recorded (made before digests)."""
        return [int(r[0]) for r in self.db.execute(
            "SELECT DISTINCT run_id FROM arrays WHERE kind='input' AND digest IS NULL ORDER BY run_id")]

    def arrays(self, run_id: int) -> dict[str, dict[str, Any]]:
        rows = self.db.execute("SELECT name, kind, shape, dtype, nbytes FROM arrays WHERE run_id=? ORDER BY rowid",
                               (run_id,)).fetchall()
        return {r[0]: {"kind": r[1], "shape": self._shape(r[2], run_id, f"array {r[0]!r}"),
                       "dtype": r[3], "nbytes": r[4]} for r in rows}

    def add_op(self, run_id: int, seq: int, name: str, cls: str, inputs: Sequence[str],
               strategies: Sequence[str], shape: Sequence[int], run_s: float, lwrite_s: float,
               lineage_s: float, pairs: int, lineage_bytes: int) -> None:
        self.db.execute("INSERT INTO ops VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (run_id, name, cls, json.dumps(list(inputs)), json.dumps(list(strategies)),
                         json.dumps(list(shape)), run_s, lwrite_s, lineage_s, pairs,
                         lineage_bytes, seq))

    def ops(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT name, cls, inputs, strategies, shape, run_s, lwrite_s,"
                               " lineage_s, pairs, lineage_bytes FROM ops WHERE run_id=? ORDER BY seq",
                               (run_id,)).fetchall()
        return [{"name": r[0], "class": r[1], "inputs": self._loads(r[2]),
                 "strategies": self._loads(r[3]),
                 "shape": list(self._shape(r[4], run_id, f"operator {r[0]!r}")), "run_s": r[5],
                 "lwrite_s": r[6], "lineage_s": r[7], "pairs": r[8], "lineage_bytes": r[9]}
                for r in rows]

    def add_strategy_stat(self, run_id: int, op: str, strategy: str, nbytes: int, write_s: float,
                          pairs: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO strategy_stats VALUES (?, ?, ?, ?, ?, ?)",
                        (run_id, op, strategy, int(nbytes), write_s, int(pairs)))

    def strategy_stats(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT op, strategy, bytes, write_s, pairs FROM strategy_stats"
                               " WHERE run_id=?", (run_id,)).fetchall()
        return [{"op": r[0], "strategy": r[1], "bytes": r[2], "write_s": r[3], "pairs": r[4]}
                for r in rows]

    def add_trace_steps(self, steps: list[tuple]) -> None:
        """Rows of (trace_id, run_id, op, input, direction, method, cells_in, cells_out,
        seconds, ts, blocks_in, runs_in[, cpu_s, abandoned, abandoned_s, done, cold])."""
        rows = [tuple(s) + (0.0, "", 0.0, 0.0, 0)[len(s) - 12:] for s in steps]
        with self.tx():
            self.db.executemany(
                "INSERT INTO trace_steps (trace_id, run_id, op, input_idx, direction, method,"
                " cells_in, cells_out, seconds, ts, blocks_in, runs_in, cpu_s, abandoned,"
                " abandoned_s, done, cold) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " ?, ?)", rows)

    def trace_steps(self, run_id: int | None = None) -> list[dict[str, Any]]:
        q = ("SELECT trace_id, run_id, op, input_idx, direction, method, cells_in, cells_out,"
             " seconds, blocks_in, runs_in, cpu_s, abandoned, abandoned_s, done, cold"
             " FROM trace_steps")
        rows = self.db.execute(q + (" WHERE run_id=?" if run_id is not None else "") + " ORDER BY id",
                               (() if run_id is None else (run_id,))).fetchall()
        keys = ("trace_id", "run_id", "op", "input", "direction", "method", "cells_in",
                "cells_out", "seconds", "blocks_in", "runs_in", "cpu_s", "abandoned",
                "abandoned_s", "done", "cold")
        return [dict(zip(keys, r)) for r in rows]

    # -- optimizer bookkeeping: traces, lineage sizes, profiles, calibrations, plans ---------
    def add_trace(self, trace_id: str, run_id: int, start: str, target: str, direction: str,
                  signature: str, spec: Mapping[str, Any], cells_in: int, cells_out: int,
                  seconds: float) -> None:
        """One row per query (its steps are in trace_steps): the workload feedback loop."""
        self.db.execute("INSERT OR REPLACE INTO traces VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (trace_id, run_id, start, target, direction, signature,
                         json.dumps(spec), cells_in, cells_out, seconds, time.time()))

    def traces(self, workflow: str | None = None, signature: str | None = None) -> list[dict]:
        q = ("SELECT t.trace_id, t.run_id, t.start, t.target, t.direction, t.signature, t.spec,"
             " t.cells_in, t.cells_out, t.seconds, r.workflow, r.params FROM traces t"
             " JOIN runs r ON r.id = t.run_id WHERE 1=1")
        args: list = []
        if workflow is not None:
            q += " AND r.workflow=?"
            args.append(workflow)
        if signature is not None:
            q += " AND t.signature=?"
            args.append(signature)
        keys = ("trace_id", "run_id", "start", "target", "direction", "signature", "spec",
                "cells_in", "cells_out", "seconds", "workflow", "params")
        out = []
        for r in self.db.execute(q + " ORDER BY t.ts", args).fetchall():
            d = dict(zip(keys, r))
            d["spec"], d["params"] = self._loads(d["spec"] or "{}"), self._loads(d["params"] or "{}")
            out.append(d)
        return out

    def steps_of(self, trace_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT op, input_idx, direction, method, cells_in, cells_out, seconds,"
                               " blocks_in, runs_in FROM trace_steps WHERE trace_id=? ORDER BY id",
                               (trace_id,)).fetchall()
        keys = ("op", "input", "direction", "method", "cells_in", "cells_out", "seconds", "blocks_in",
                "runs_in")
        return [dict(zip(keys, r)) for r in rows]

    def add_strategy_space(self, run_id: int, op: str, strategy: str, data: Mapping[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO strategy_spaces VALUES (?, ?, ?, ?)",
                        (run_id, op, strategy, json.dumps(data)))

    def strategy_spaces(self, run_id: int) -> dict[tuple[str, str], dict]:
        rows = self.db.execute("SELECT op, strategy, data FROM strategy_spaces WHERE run_id=?",
                               (run_id,)).fetchall()
        return {(r[0], r[1]): self._loads(r[2]) for r in rows}

    def add_profile(self, run_id: int, workflow: str, params: Mapping[str, Any], base_s: float,
                    data: Mapping[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO profiles VALUES (?, ?, ?, ?, ?, ?)",
                        (run_id, workflow, json.dumps(params, sort_keys=True, default=str), base_s,
                         json.dumps(data), time.time()))

    def latest_profile(self, workflow: str, params: dict) -> dict | None:
        """The newest profile of ``workflow`` with exactly these parameters (whose run still exists)."""
        r = self.db.execute(
            "SELECT p.run_id, p.base_s, p.data FROM profiles p JOIN runs r ON r.id = p.run_id"
            " WHERE p.workflow=? AND p.params=? AND r.status='complete' ORDER BY p.run_id DESC LIMIT 1",
            (workflow, json.dumps(params, sort_keys=True, default=str))).fetchone()
        return None if r is None else {"run_id": r[0], "base_s": r[1], "ops": self._loads(r[2])}

    def add_calibration(self, host: str, seconds: float, data: dict) -> int:
        cur = self.db.execute("INSERT INTO calibrations (host, created, seconds, data) VALUES (?, ?, ?, ?)",
                              (host, time.time(), seconds, json.dumps(data)))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def latest_calibration(self, host: str) -> dict | None:
        r = self.db.execute("SELECT id, created, seconds, data FROM calibrations WHERE host=?"
                            " ORDER BY id DESC LIMIT 1", (host,)).fetchone()
        return None if r is None else {"id": r[0], "created": r[1], "seconds": r[2],
                                       **self._loads(r[3])}

    def save_plan(self, name: str, workflow: str, data: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO plans VALUES (?, ?, ?, ?)",
                        (name, workflow, time.time(), json.dumps(data)))

    def get_plan(self, name: str) -> dict | None:
        r = self.db.execute("SELECT data FROM plans WHERE name=?", (name,)).fetchone()
        return None if r is None else self._loads(r[0])

    def plan_names(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM plans ORDER BY created").fetchall()]

    def add_downgrade(self, run_id: int, op: str, strategy: str, predicted_bytes: int,
                      needed_bytes: int, reason: str) -> None:
        self.db.execute("INSERT INTO downgrades VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (run_id, op, strategy, predicted_bytes, needed_bytes, reason, time.time()))

    def add_rerun(self, run_id: int, summary: Mapping[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO reruns VALUES (?, ?, ?)",
                        (run_id, int(summary["parent"]), json.dumps(summary, default=str)))

    def rerun_of(self, run_id: int) -> dict[str, Any] | None:
        """A re-run's parent and what it recomputed (None: the run is no re-run)."""
        r = self.db.execute("SELECT summary FROM reruns WHERE run_id=?", (run_id,)).fetchone()
        return None if r is None else json.loads(r[0])

    def reruns(self) -> dict[int, int]:
        """Every re-run's parent: run id -> parent run id."""
        return {int(a): int(b) for a, b in self.db.execute("SELECT run_id, parent FROM reruns")}

    # -- tags and deletion ----------------------------------------------------------------
    def tagged(self, name: str) -> int | None:
        """The run a tag names (None: no such tag)."""
        try:
            r = self.db.execute("SELECT run_id FROM tags WHERE name=?", (name,)).fetchone()
        except sqlite3.OperationalError:      # an older catalog read in place: no tags yet
            return None
        return None if r is None else int(r[0])

    def tags(self) -> dict[str, int]:
        """Every tag and the run it names, by name."""
        return {str(n): int(r) for n, r in
                self.db.execute("SELECT name, run_id FROM tags ORDER BY name")}

    def set_tag(self, name: str, run_id: int) -> int | None:
        """Name run ``run_id`` ``name``; returns the run the tag named before (or None)."""
        with self.tx():
            before = self.tagged(name)
            self.db.execute("INSERT OR REPLACE INTO tags VALUES (?, ?, ?)", (name, run_id, time.time()))
        return before

    def drop_tag(self, name: str) -> bool:
        """Remove a tag; False when there was none."""
        with self.tx():
            return self.db.execute("DELETE FROM tags WHERE name=?", (name,)).rowcount > 0

    def mark_deleted(self, run_id: int, why: str) -> bool:
        """Record a complete run deleted (``subzero gc``) and drop its tags, in one
        transaction; False when it is no longer complete (another process got there)."""
        with self.tx():
            done = self.db.execute("UPDATE runs SET status='deleted', error=? WHERE id=? AND "
                                   "status='complete'", (why, run_id)).rowcount > 0
            if done:
                self.db.execute("DELETE FROM tags WHERE run_id=?", (run_id,))
        return done

    def downgrades(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT op, strategy, predicted_bytes, needed_bytes, reason FROM"
                               " downgrades WHERE run_id=? ORDER BY rowid", (run_id,)).fetchall()
        keys = ("op", "strategy", "predicted_bytes", "needed_bytes", "reason")
        return [dict(zip(keys, r)) for r in rows]

    def _shape(self, text: str | None, run_id: int, what: str) -> tuple[int, ...]:
        """A shape column: a list of whole numbers of 0 or more, else one line naming the
        run, the array or operator and the catalog (an edited or damaged row)."""
        shape = self._loads(text) if isinstance(text, str) else text
        if isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape):
            return tuple(shape)
        raise StoreError(f"run {run_id}: the catalog {self.path} holds no valid shape for "
                         f"{what} ({'NULL' if text is None else repr(text)[:60]}); the row was "
                         f"edited or damaged: restore the catalog from a backup")

    def _loads(self, text: str) -> Any:
        """A JSON column: damaged text is one line naming the catalog, not a JSONDecodeError."""
        try:
            return json.loads(text)
        except ValueError as e:
            raise _damaged(self.path, f"a record does not parse: {e}") from e


class _Tx:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.db.execute("ROLLBACK" if et else "COMMIT")


def writable(path: Path) -> bool:
    """Whether this process may write the catalog at ``path`` and the WAL files next
    to it (root may write anything but an immutable or read-only-mounted file)."""
    if path.exists() and not os.access(path, os.W_OK):
        return False
    return os.access(path.parent, os.W_OK)


class _Connection(sqlite3.Connection):
    """A connection whose failures name the catalog file in the user's terms."""

    catalog_path: Path

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        with _named_errors(self.catalog_path):
            return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        with _named_errors(self.catalog_path):
            return super().executemany(sql, parameters)


@contextlib.contextmanager
def _named_errors(path: Path) -> Iterator[None]:
    """SQLite failures as one line naming the catalog (see :func:`_store_error`)."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        raise _store_error(e, path) from e
    except UnicodeDecodeError as e:     # SQLite's message quotes damaged schema text
        raise _damaged(path, f"its schema is not UTF-8: {e}") from e


def _connect(path: Path, target: str, uri: bool) -> sqlite3.Connection:
    try:
        db = sqlite3.connect(target, timeout=30, isolation_level=None, uri=uri,
                             factory=_Connection)
    except sqlite3.DatabaseError as e:
        raise _store_error(e, path) from e
    db.catalog_path = path

    def text(raw: bytes) -> str:            # damaged text columns: one line, not UnicodeDecodeError
        try:
            return raw.decode()
        except UnicodeDecodeError as e:
            raise _damaged(path, f"a text column is not UTF-8: {e}") from e
    db.text_factory = text
    return db


def _damaged(path: Path, why: str) -> StoreError:
    why = " ".join(why.split())
    return StoreError(f"store catalog {path} cannot be opened: it is damaged or not a SubZero "
                      f"catalog ({why}); restore it from a backup")


def _store_error(e: sqlite3.DatabaseError, path: Path) -> Exception:
    """A catalog failure as one line naming the file; a programming error stays as it is."""
    msg = " ".join(str(e).split())     # SQLite may quote schema text, newlines included
    low = msg.lower()
    if "readonly" in low or "read-only" in low:
        return StoreError(f"store catalog {path} is read-only, and this needs to write it (a run, "
                          f"optimize, a plan); use a writable copy of the store or fix its "
                          f"permissions")
    if ("disk i/o" in low or "full" in low) and is_full(e, path.parent):
        return disk_full(path.parent, f"the store's catalog {path.name}")
    # our SQL is fixed, so a table or column it names that is missing is a damaged schema
    schema = ("no such column" in low or "no such table" in low or "has no column named" in low)
    if "not a database" in low or "malformed" in low or "disk i/o" in low or schema:
        return _damaged(path, msg)
    if "locked" in low or "busy" in low:
        return StoreError(f"store catalog {path} is busy ({msg}): another process holds it; "
                          f"try again when it is done")
    if "unable to open" in low:
        return StoreError(f"store catalog {path} cannot be opened ({msg}); check the permissions "
                          f"of it and its folder")
    if "full" in low:
        return StoreError(f"store catalog {path} cannot grow: {msg}")
    return e
