"""The trace log: every query a user traces, kept in the store's catalog, from which
the optimizer derives the workload it optimizes for."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

import numpy as np

from subzero.model.cells import unique_rows
from subzero.query.trace import TraceResult
from subzero.storage.catalog import Catalog


def trace_signature(start: str, cells: Any, to: str | None, path: list[tuple[str, int]] | None,
                    shortcut: bool) -> tuple[str, int]:
    """A query's identity in the trace log (same start, cells, target or path, short-cut),
    and its number of distinct start cells: repeated queries are recognised by it."""
    c = unique_rows(np.atleast_2d(np.asarray(cells, dtype=np.int64)))
    h = hashlib.sha1(json.dumps([start, to, path and [list(p) for p in path], bool(shortcut)])
                     .encode())
    h.update(c.tobytes())
    return h.hexdigest()[:16], int(len(c))


def record_trace(catalog: Catalog, run_id: int, start: str, cells: Any, to: str | None,
                 path: list[tuple[str, int]] | None, shortcut: bool, res: TraceResult) -> None:
    """Add one traced query, and each of its steps, to the catalog's trace log."""
    tid = uuid.uuid4().hex[:12]
    now = time.time()
    catalog.add_trace_steps([
        (tid, run_id, s.op, s.input, s.direction, s.method, s.cells_in, s.cells_out,
         s.seconds, now, s.blocks_in, s.runs_in, s.cpu, s.abandoned, s.abandoned_s, s.done,
         int(s.cold))
        for s in res.steps])
    sig, n_in = trace_signature(start, cells, to, path, shortcut)
    catalog.add_trace(tid, run_id, start, res.target, res.direction, sig,
                      {"to": to, "path": path, "shortcut": shortcut}, n_in, len(res), res.seconds)
