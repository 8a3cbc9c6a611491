"""Catalog: runs, operator instances, strategies and statistics (SQLite).

SQLite gives the durable, atomic bookkeeping runs need: a run row is
``running`` until the engine has moved the run's folder into place and then
flips it to ``complete`` in one transaction; a crash leaves it ``running``
with a dead pid, which is reported as ``interrupted``, never as complete.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import QueryError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, workflow TEXT, source TEXT, params TEXT,
  status TEXT, started REAL, ended REAL, error TEXT, inputs TEXT, pid INTEGER,
  host TEXT, engine TEXT);
CREATE TABLE IF NOT EXISTS arrays (
  run_id INTEGER, name TEXT, kind TEXT, shape TEXT, dtype TEXT, nbytes INTEGER,
  PRIMARY KEY (run_id, name));
CREATE TABLE IF NOT EXISTS ops (
  run_id INTEGER, name TEXT, cls TEXT, inputs TEXT, strategies TEXT, shape TEXT,
  run_s REAL, lwrite_s REAL, lineage_s REAL, pairs INTEGER, lineage_bytes INTEGER,
  seq INTEGER, PRIMARY KEY (run_id, name));
CREATE TABLE IF NOT EXISTS strategy_stats (
  run_id INTEGER, op TEXT, strategy TEXT, bytes INTEGER, write_s REAL, pairs INTEGER,
  PRIMARY KEY (run_id, op, strategy));
CREATE TABLE IF NOT EXISTS trace_steps (
  id INTEGER PRIMARY KEY AUTOINCREMENT, trace_id TEXT, run_id INTEGER, op TEXT,
  input_idx INTEGER, direction TEXT, method TEXT, cells_in INTEGER, cells_out INTEGER,
  seconds REAL, ts REAL);
"""


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


class Catalog:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def tx(self):
        return _Tx(self.db)

    # -- runs -----------------------------------------------------------------------
    def begin_run(self, workflow: str, source: str | None, params: dict, inputs: dict,
                  engine: str) -> int:
        cur = self.db.execute(
            "INSERT INTO runs (workflow, source, params, status, started, inputs, pid, host, engine)"
            " VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?)",
            (workflow, source, json.dumps(params, default=str), time.time(),
             json.dumps(inputs, default=str), os.getpid(), os.uname().nodename, engine))
        return int(cur.lastrowid)

    def finish_run(self, run_id: int, status: str, error: str | None = None) -> None:
        self.db.execute("UPDATE runs SET status=?, ended=?, error=? WHERE id=?",
                        (status, time.time(), error, run_id))

    def runs(self) -> list[RunRow]:
        rows = self.db.execute("SELECT id, workflow, source, params, status, started, ended, error,"
                               " inputs, pid, host, engine FROM runs ORDER BY id").fetchall()
        return [self._row(r) for r in rows]

    def _row(self, r) -> RunRow:
        status = r[4]
        if status == "running" and not _alive(r[9], r[10]):
            status = "interrupted"
        return RunRow(r[0], r[1], r[2], json.loads(r[3] or "{}"), status, r[5], r[6], r[7],
                      json.loads(r[8] or "{}"), r[11])

    def get_run(self, ref: str | int) -> RunRow:
        if isinstance(ref, str) and ref.strip().lower() == "latest":
            r = self.db.execute("SELECT id, workflow, source, params, status, started, ended, error,"
                                " inputs, pid, host, engine FROM runs WHERE status='complete'"
                                " ORDER BY id DESC LIMIT 1").fetchone()
            if r is None:
                raise QueryError("there is no complete run in this store yet; run `subzero run` first")
            return self._row(r)
        try:
            rid = int(ref)
        except (TypeError, ValueError):
            raise QueryError(f"unknown run {ref!r}; give a run id (see `subzero runs`) or 'latest'") from None
        r = self.db.execute("SELECT id, workflow, source, params, status, started, ended, error,"
                            " inputs, pid, host, engine FROM runs WHERE id=?", (rid,)).fetchone()
        if r is None:
            raise QueryError(f"unknown run {ref!r}; see `subzero runs` for the runs in this store")
        return self._row(r)

    # -- arrays and operators ------------------------------------------------------------
    def add_array(self, run_id, name, kind, shape, dtype, nbytes) -> None:
        self.db.execute("INSERT INTO arrays VALUES (?, ?, ?, ?, ?, ?)",
                        (run_id, name, kind, json.dumps(list(shape)), str(dtype), int(nbytes)))

    def arrays(self, run_id: int) -> dict[str, dict[str, Any]]:
        rows = self.db.execute("SELECT name, kind, shape, dtype, nbytes FROM arrays WHERE run_id=? ORDER BY rowid",
                               (run_id,)).fetchall()
        return {r[0]: {"kind": r[1], "shape": tuple(json.loads(r[2])), "dtype": r[3], "nbytes": r[4]}
                for r in rows}

    def add_op(self, run_id, seq, name, cls, inputs, strategies, shape, run_s, lwrite_s,
               lineage_s, pairs, lineage_bytes) -> None:
        self.db.execute("INSERT INTO ops VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (run_id, name, cls, json.dumps(list(inputs)), json.dumps(strategies),
                         json.dumps(list(shape)), run_s, lwrite_s, lineage_s, pairs,
                         lineage_bytes, seq))

    def ops(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT name, cls, inputs, strategies, shape, run_s, lwrite_s,"
                               " lineage_s, pairs, lineage_bytes FROM ops WHERE run_id=? ORDER BY seq",
                               (run_id,)).fetchall()
        return [{"name": r[0], "class": r[1], "inputs": json.loads(r[2]),
                 "strategies": json.loads(r[3]), "shape": json.loads(r[4]), "run_s": r[5],
                 "lwrite_s": r[6], "lineage_s": r[7], "pairs": r[8], "lineage_bytes": r[9]}
                for r in rows]

    def add_strategy_stat(self, run_id, op, strategy, nbytes, write_s, pairs) -> None:
        self.db.execute("INSERT OR REPLACE INTO strategy_stats VALUES (?, ?, ?, ?, ?, ?)",
                        (run_id, op, strategy, int(nbytes), write_s, int(pairs)))

    def strategy_stats(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT op, strategy, bytes, write_s, pairs FROM strategy_stats"
                               " WHERE run_id=?", (run_id,)).fetchall()
        return [{"op": r[0], "strategy": r[1], "bytes": r[2], "write_s": r[3], "pairs": r[4]}
                for r in rows]

    def add_trace_steps(self, steps: list[tuple]) -> None:
        with self.tx():
            self.db.executemany(
                "INSERT INTO trace_steps (trace_id, run_id, op, input_idx, direction, method,"
                " cells_in, cells_out, seconds, ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", steps)

    def trace_steps(self, run_id: int | None = None) -> list[dict[str, Any]]:
        q = ("SELECT trace_id, run_id, op, input_idx, direction, method, cells_in, cells_out,"
             " seconds FROM trace_steps")
        rows = self.db.execute(q + (" WHERE run_id=?" if run_id is not None else "") + " ORDER BY id",
                               (() if run_id is None else (run_id,))).fetchall()
        keys = ("trace_id", "run_id", "op", "input", "direction", "method", "cells_in",
                "cells_out", "seconds")
        return [dict(zip(keys, r)) for r in rows]


class _Tx:
    def __init__(self, db):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, et, ev, tb):
        self.db.execute("ROLLBACK" if et else "COMMIT")
        return False


def _alive(pid: int | None, host: str | None) -> bool:
    if pid is None or host != os.uname().nodename:
        return True   # cannot tell for another host; keep 'running'
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
