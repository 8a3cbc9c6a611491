"""The database peer: what a data engineer would build instead of SubZero.

The run's complete cell-level lineage -- every operator's pairs as an all-FULL
strategy writes them -- in an embedded analytical database (DuckDB), traced
with joins step by step along the same DAG paths SubZero follows.

The pairs come from SubZero itself: every operator runs through the capture
runner (:func:`subzero.capture.runner.run_operator`) with the ``full``
strategy, which returns its region pairs in CSR form.  A region pair relates m
output cells to n cells of each input; stored as m x n edge rows it would
explode (a 64x64 background block is 16.7 M rows), so the engineer normalises
it, as one would: per operator a table ``<op>__out(pair, cell)`` and per
operator input a table ``<op>__in<i>(pair, cell)``, cells as packed (C-order)
int64 ids, every table written sorted by ``cell`` so DuckDB's zone maps (min/max
per row group) let a join skip what the current set cannot touch.  A backward
step is ``SELECT DISTINCT i.cell FROM cur JOIN out ON out.cell = cur.cell JOIN
in_i ON in_i.pair = out.pair``; a forward step the reverse.

    .venv/bin/python benchmarks/peer.py [--megapixels 1]    # load, trace, check against SubZero
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from subzero.capture.runner import run_operator
from subzero.model.cells import pack, unpack
from subzero.model.workflow import Workflow
from subzero.runs.launch import resolve_strategies


@dataclass
class Captured:
    """One operator's complete lineage: its pairs (CSR, packed cells) and shapes."""

    inputs: tuple[str, ...]
    out_shape: tuple[int, ...]
    in_shapes: list[tuple[int, ...]]
    out: np.ndarray
    out_off: np.ndarray
    ins: list[np.ndarray]
    in_offs: list[np.ndarray]


def capture_full(wf: Workflow, inputs: dict,
                 sink: Callable[[str, Captured], None] | None = None) -> tuple[dict[str, Captured], float]:
    """Run every operator of ``wf`` with the full strategy through the capture runner,
    in memory; returns each operator's pairs and the seconds it took (not counting
    ``sink``).  With ``sink``, each operator's pairs go to ``sink(name, pairs)`` as
    soon as it has run and are not kept (the returned dict is empty): memory holds
    one operator's pairs at a time.  An array is dropped after its last consumer."""
    strat = resolve_strategies(wf, {name: "full" for name in wf.steps})
    order = wf.order()
    last: dict[str, int] = {}
    for k, name in enumerate(order):
        for a in wf.steps[name].inputs:
            last[a] = k
    values = {k: np.asarray(v) for k, v in inputs.items()}
    out: dict[str, Captured] = {}
    t0, in_sink = time.perf_counter(), 0.0
    for k, name in enumerate(order):
        step = wf.steps[name]
        ins = [values[a] for a in step.inputs]
        value, full, pay, _ = run_operator(name, step.operator, ins, strat[name])
        if pay is not None and pay.n:
            raise SystemExit(f"peer: operator {name!r} wrote payload pairs under the full strategy")
        shape = tuple(np.shape(value)) or (1,)
        in_shapes = [tuple(np.shape(x)) or (1,) for x in ins]
        if full is None:       # no pairs at all (e.g. an empty image): nothing depends on anything
            z, off = np.zeros(0, np.int64), np.zeros(1, np.int64)
            c = Captured(step.inputs, shape, in_shapes, z, off, [z] * len(ins), [off] * len(ins))
        else:
            c = Captured(step.inputs, shape, in_shapes, full.out, full.out_off, full.ins, full.in_offs)
        del full, ins
        values[name] = np.asarray(value)
        for a in step.inputs:
            if last[a] == k:
                values.pop(a, None)
        if sink is None:
            out[name] = c
        else:
            t1 = time.perf_counter()
            sink(name, c)
            in_sink += time.perf_counter() - t1
        del c
    return out, time.perf_counter() - t0 - in_sink


def _rows(cells: np.ndarray, off: np.ndarray) -> dict[str, np.ndarray]:
    """(pair, cell) rows of one side of the pairs, sorted by cell (then pair)."""
    pair = np.repeat(np.arange(len(off) - 1, dtype=np.int64), np.diff(off))
    order = np.lexsort((pair, cells))
    return {"pair": pair[order], "cell": np.ascontiguousarray(cells[order], dtype=np.int64)}


def _table(op: str, side: str) -> str:
    return '"' + f"{op}__{side}".replace('"', '""') + '"'


class Peer:
    """The DuckDB database of a run's complete lineage, and traces over it."""

    def __init__(self, path: str | os.PathLike):
        import duckdb
        self.path = Path(path)
        self.con = duckdb.connect(str(self.path))
        self.ops: dict[str, Captured] = {}

    def close(self) -> None:
        self.con.close()

    def add(self, op: str, c: Captured) -> None:
        """Write one operator's pairs: its output side and one table per input."""
        sides = [("out", c.out, c.out_off)] + [(f"in{i}", c.ins[i], c.in_offs[i]) for i in range(len(c.ins))]
        for side, cells, off in sides:
            self.con.register("_rows", _rows(cells, off))
            self.con.execute(f"CREATE TABLE {_table(op, side)} AS SELECT pair, cell FROM _rows")
            self.con.unregister("_rows")
        self.ops[op] = Captured(c.inputs, c.out_shape, c.in_shapes, np.zeros(0, np.int64),
                                np.zeros(1, np.int64), [], [])   # shapes only: the data is in DuckDB

    def checkpoint(self) -> None:
        """Everything written to the database file."""
        self.con.execute("CHECKPOINT")

    def load(self, captured: dict[str, Captured]) -> float:
        """Write every operator's pairs; returns the seconds it took (to disk, checkpointed)."""
        t0 = time.perf_counter()
        for op, c in captured.items():
            self.add(op, c)
        self.checkpoint()
        return time.perf_counter() - t0

    def bytes_on_disk(self) -> int:
        wal = self.path.with_name(self.path.name + ".wal")
        return self.path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

    # -- tracing ------------------------------------------------------------------------------
    def shape_of(self, array: str) -> tuple[int, ...]:
        if array in self.ops:
            return self.ops[array].out_shape
        for c in self.ops.values():
            for a, s in zip(c.inputs, c.in_shapes):
                if a == array:
                    return s
        raise KeyError(array)

    def _edges(self) -> list[tuple[str, int, str]]:
        """(consumer operator, input index, producer array) for every edge of the DAG."""
        return [(op, i, a) for op, c in self.ops.items() for i, a in enumerate(c.inputs)]

    def trace(self, start: str, cells, to: str) -> np.ndarray:
        """Cells (N, ndim) of ``to`` reached from ``cells`` of ``start`` along every DAG path
        (results united), backward when ``to`` is upstream of ``start``, else forward."""
        edges = self._edges()
        up: dict[str, set[str]] = {n: set() for e in edges for n in (e[0], e[2])}
        for op, _, a in edges:
            up[op].add(a)
        if start not in up or to not in up:
            raise ValueError(f"peer: unknown array {start if start not in up else to!r}")
        if to in _ancestors(up, start):
            backward, nodes = True, _between(up, to, start)
        elif start in _ancestors(up, to):
            backward, nodes = False, _between(up, start, to)
        else:
            raise ValueError(f"peer: {to!r} is neither upstream nor downstream of {start!r}")
        order = [n for n in _topo(up) if n in nodes]
        if backward:
            order.reverse()
        first = np.unique(pack(np.asarray(cells, np.int64).reshape(-1, len(self.shape_of(start))),
                               self.shape_of(start)))
        self.con.register("_start", {"cell": first})
        table = {start: "_start"}
        parts: dict[str, list[str]] = {}
        try:
            for k, n in enumerate(order):
                if n != start:      # the union of what every step into n brought
                    table[n] = f"_s{k}"
                    self.con.execute(f"CREATE OR REPLACE TEMP TABLE _s{k} AS SELECT DISTINCT cell FROM ("
                                     + " UNION ALL ".join(parts.pop(n)) + ")")
                if n == to:
                    break
                src = table[n]
                if backward:        # the current set of n's output -> cells of each input on a path
                    for op, i, a in edges:
                        if op == n and a in nodes:
                            parts.setdefault(a, []).append(
                                f"SELECT t.cell FROM {src} c JOIN {_table(op, 'out')} o ON o.cell = c.cell "
                                f"JOIN {_table(op, f'in{i}')} t ON t.pair = o.pair")
                else:               # the current set of input n -> cells of each consumer on a path
                    for op, i, a in edges:
                        if a == n and op in nodes:
                            parts.setdefault(op, []).append(
                                f"SELECT o.cell FROM {src} c JOIN {_table(op, f'in{i}')} t ON t.cell = c.cell "
                                f"JOIN {_table(op, 'out')} o ON o.pair = t.pair")
            res = self.con.execute(f"SELECT cell FROM {table[to]} ORDER BY cell").fetchnumpy()["cell"]
        finally:
            for name in table.values():
                if name != "_start":
                    self.con.execute(f"DROP TABLE IF EXISTS {name}")
            self.con.unregister("_start")
        return unpack(np.asarray(res, np.int64), self.shape_of(to))


def _topo(up: dict[str, set[str]]) -> list[str]:
    """Arrays in a topological order (producers first)."""
    out: list[str] = []
    done: set[str] = set()

    def visit(n: str) -> None:
        if n not in done:
            done.add(n)
            for p in sorted(up[n]):
                visit(p)
            out.append(n)
    for n in sorted(up):
        visit(n)
    return out

def _ancestors(up: dict[str, set[str]], n: str) -> set[str]:
    out: set[str] = set()
    stack = list(up[n])
    while stack:
        p = stack.pop()
        if p not in out:
            out.add(p)
            stack.extend(up[p])
    return out


def _between(up: dict[str, set[str]], lo: str, hi: str) -> set[str]:
    """Arrays on some path lo -> ... -> hi (lo upstream of hi)."""
    return {n for n in _ancestors(up, hi) | {hi} if n == lo or lo in _ancestors(up, n)}


def same_cells(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as sets of cells."""
    a = np.unique(np.asarray(a, np.int64).reshape(len(a), -1), axis=0)
    b = np.unique(np.asarray(b, np.int64).reshape(len(b), -1), axis=0)
    return a.shape == b.shape and bool(np.array_equal(a, b))


def main() -> None:
    import subzero
    from subzero.workflows import astronomy

    ap = argparse.ArgumentParser(description="the DuckDB peer on the astronomy workflow, checked against SubZero")
    ap.add_argument("--megapixels", type=float, default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sz-peer-"))
    wf = astronomy.workflow(megapixels=a.megapixels)
    st = subzero.open_store(work / "store")
    run = st.run(wf, progress=False)
    values = {n: np.asarray(run.array(n).values) for n in wf.inputs}
    captured, cap_s = capture_full(wf, values)
    peer = Peer(work / "peer.duckdb")
    load_s = peer.load(captured)
    del captured
    print(f"capture {cap_s:.2f} s, load {load_s:.2f} s, {peer.bytes_on_disk() / 1e6:.1f} MB on disk "
          f"(SubZero lineage {run.lineage_bytes() / 1e6:.2f} MB)")
    stars = run.array("stars").values
    cell = np.argwhere(stars == stars.max())[0]
    for start, cells, to in (("stars", [tuple(cell)], "raw_1"), ("raw_1", [(1000, 200)], "stars")):
        t0 = time.perf_counter()
        got = peer.trace(start, cells, to)
        sec = time.perf_counter() - t0
        want = run.trace(start, cells, to=to, record=False).cells
        if not same_cells(got, want):
            raise SystemExit(f"MISMATCH: the peer answers {start} -> {to} with {len(got)} cells, SubZero {len(want)}")
        print(f"{start} -> {to}: {len(got)} cells in {sec * 1000:.1f} ms (equal to SubZero's)")
    peer.close()
    st.close()


if __name__ == "__main__":
    sys.exit(main())
