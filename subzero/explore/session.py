"""One run as the explorer sees it: its workflow DAG, its arrays as views, and traces
from one array to every array reachable in a direction.

A trace here is the executor's own walk (the executor ``subzero trace`` uses, with
its open lineage readers, caches and planner), widened from "every path to one
target" to "every path to every array reachable": each edge of the DAG below (or
above) the start array runs once, so the answer for each array is exactly what
``run.trace(start, cells, to=array)`` gives, for the cost of one trace.

Neither the executor nor the store's catalog (SQLite) may be used from several
threads: the session opens its own store and run (``open_store(path).get(run)``)
in one worker thread of its own, and every use of the run runs there, one at a
time (the web server calls in from its thread pool).  Recent answers are kept
(:data:`subzero.tuning.KEEP_TRACES` of them: cell sets, whose cost follows the answers)
so that a zoom redraws an overlay without tracing again.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from subzero.errors import QueryError, UnknownArray
from subzero.explore.render import View, Window, image_png, overlay_mask, overlay_png, window
from subzero.model.cellset import CellSet
from subzero.query.planner import StepStat
from subzero.tuning import KEEP_TRACES


@dataclass
class Answer:
    """One explorer trace: the cells reached in every array, and how."""

    id: int
    start: str
    direction: str
    cells_in: int
    sets: dict[str, CellSet]
    steps: list[StepStat]
    seconds: float
    #: per array, the cells reached without a step through an all-to-all input
    direct: dict[str, CellSet] | None = None


class Session:
    """The explorer's access to one run (see the module docstring)."""

    def __init__(self, store_path, run_ref: int | str = "latest", shortcut: bool = True):
        self.shortcut = shortcut
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="subzero-explore-run")
        self._answers: OrderedDict[int, Answer] = OrderedDict()
        self._kept = threading.Lock()
        self._ids = itertools.count(1)
        self.run = self._do(_open, store_path, run_ref)
        self._shapes = self._do(self.run.shapes)
        self._ops = {o["name"]: o for o in self._do(self.run.ops)}
        self._worker.submit(_warm, self.run)    # while the page loads: the first click is not cold

    def _do(self, fn: Callable, *args):
        """``fn(*args)`` on the run's thread."""
        return self._worker.submit(fn, *args).result()

    def close(self) -> None:
        try:
            self._do(self.run.store.close)
        finally:
            self._worker.shutdown(wait=True)

    # -- the run ------------------------------------------------------------------------
    def check(self, name: str) -> View:
        if name not in self._shapes:
            raise UnknownArray(f"unknown array {name!r} in run {self.run.id}; its arrays are: "
                               f"{', '.join(self._shapes)}")
        return View(tuple(self._shapes[name]))

    def describe(self) -> dict:
        """The run and its workflow DAG as plain data (``/api/run``)."""
        return self._do(self._describe)

    def _describe(self) -> dict:
        rerun = self.run.rerun_info()
        made = (rerun or {}).get("ops", {})
        arrays = []
        for name, shape in self._shapes.items():
            _, dtype, dims = self.run.array_info(name)
            op = self._ops.get(name)
            view = View(tuple(shape))
            arrays.append({
                "name": name, "shape": list(shape), "dtype": str(dtype), "dims": list(dims),
                "kind": "operator" if op else "input",
                "operator": op["class"] if op else None,
                "inputs": list(op["inputs"]) if op else [],
                "strategies": list(op["strategies"]) if op else [],
                "view": list(view.size), "projection": view.projection,
                "rerun": _made(made.get(name))})
        row = self.run.row
        return {"run_id": self.run.id, "workflow": row.workflow, "arrays": arrays,
                "trusted": self.run.trusted, "rerun": None if rerun is None else {
                    "parent": rerun.get("parent"), "inputs": rerun.get("inputs", []),
                    "tiles": sum(int(v.get("tiles") or 0) for v in made.values() if v.get("kind") != "input"),
                    "recomputed": sum(int(v.get("ran") or 0) for v in made.values()
                                      if v.get("kind") != "input")}}

    def image(self, name: str, region: Sequence[int] | None, size: Sequence[int] | None,
              ) -> tuple[bytes, dict]:
        view = self.check(name)
        win = window(view, region, size, name)
        png, info = self._do(image_png, lambda r: self.run.read_region(name, r), view, win)
        return png, {**info, **win.as_json(), "projection": view.projection}

    def value(self, name: str, cell: Sequence[int]) -> dict:
        """The value at a view cell (for a projection: the maximum along the folded axes,
        as drawn)."""
        view = self.check(name)
        vr, vc = view.size
        if len(cell) != 2:
            raise QueryError(f"bad cell for {name!r}: give row,col")
        r, c = (int(v) for v in cell)
        if not (0 <= r < vr and 0 <= c < vc):
            raise QueryError(f"cell ({r}, {c}) is outside {name!r} (its view is {vr} x {vc})")
        region = view.array_region((r, r + 1), (c, c + 1))
        a = np.asarray(self._do(self.run.read_region, name, region))
        v = a.max() if a.size else None
        return {"array": name, "cell": [r, c], "value": _plain(v),
                "projection": view.projection, **self._do(self._where, name, region)}

    def _where(self, name: str, region: tuple[slice, ...]) -> dict:
        """The cell in the user's terms: its labels, and its sky position (the centre of
        the pixel) when the array has a sky WCS."""
        from subzero.coords import footprint, label_bounds
        g = self.run.grid(name)
        if g is None:
            return {}
        # a projection's folded axes come as slice(None): their whole extent
        bounds = [s.indices(n)[:2] for s, n in zip(region, self.run.shapes()[name])]
        lo, hi = [b[0] for b in bounds], [b[1] for b in bounds]
        out: dict = {}
        labels = {k: v[0] for k, v in label_bounds(g, lo, hi).items()
                  if k in g.dims[-2:]}          # a projection's folded axes have no one label
        if labels:
            out["labels"] = {k: _plain(v) for k, v in labels.items()}
        if g.wcs and len(region) >= 2:
            try:
                out["sky"] = footprint(g, lo, hi, name)["center_hmsdms"]
            except QueryError:
                pass            # cards astropy cannot read: no sky position to show
        return out

    # -- traces -------------------------------------------------------------------------
    def trace(self, start: str, box: Sequence[Sequence[int]] | None, backward: bool,
              locate: str | None = None) -> Answer:
        """Trace the cells under a view box ``((row0, row1), (col0, col1))`` (half-open)
        of ``start``, or the cells ``locate`` names in the user's terms (see
        :func:`locate_query`), to every array reachable backward (upstream) or forward."""
        view = self.check(start)
        if locate is not None:
            cells = self._do(_located, self.run, start, locate)
        else:
            assert box is not None
            (r0, r1), (c0, c1) = (tuple(int(v) for v in b) for b in box)
            vr, vc = view.size
            if not (0 <= r0 < r1 <= vr and 0 <= c0 < c1 <= vc):
                raise QueryError(f"box rows {r0}:{r1}, cols {c0}:{c1} is not inside {start!r} "
                                 f"(its view is {vr} x {vc})")
            cells = view.cells_of_box((r0, r1), (c0, c1))
        direct: dict[str, CellSet] = {}
        sets, steps, seconds = self._do(trace_all, self.run, start, cells, backward, self.shortcut,
                                        direct)
        with self._kept:
            ans = Answer(next(self._ids), start, "backward" if backward else "forward",
                         len(cells), sets, steps, seconds, direct)
            self._answers[ans.id] = ans
            while len(self._answers) > KEEP_TRACES:
                self._answers.popitem(last=False)
        return ans

    def answer(self, trace_id: int) -> Answer:
        with self._kept:
            ans = self._answers.get(trace_id)
        if ans is None:
            raise QueryError(f"trace {trace_id} is no longer kept (the explorer keeps the last "
                             f"{KEEP_TRACES}); click again")
        return ans

    def overlay(self, ans: Answer, name: str, region: Sequence[int] | None,
                size: Sequence[int] | None) -> tuple[bytes, Window]:
        view = self.check(name)
        if name not in ans.sets:
            raise QueryError(f"trace {ans.id} from {ans.start!r} does not reach {name!r} "
                             f"({ans.direction})")
        win = window(view, region, size, name)
        return overlay_png(overlay_mask(ans.sets[name], view, win)), win

    def summary(self, ans: Answer, name: str) -> dict:
        cs = ans.sets[name]
        box = cs.bounds()
        d = (ans.direct or {}).get(name)
        return {"count": len(cs), "entire": cs.is_entire,
                "bounds": None if box is None else [list(box[0]), list(box[1])],
                # how many came only through steps that read an input all-to-all
                "all_to_all_only": 0 if d is None else len(cs) - len(d)}


def locate_query(text: str) -> dict:
    """What the page's *go to* field names, as ``Run.cells_at`` keywords: label
    selections (``time=2020-01-03, lat=10:20``) when it holds ``=``, else a sky
    position with an optional radius after a space (``357.34,-2.75 1arcsec``,
    ``23:49:21.56,-2:44:58.9``)."""
    from subzero.coords import parse_sel
    text = text.strip()
    if not text:
        raise QueryError("type a sky position (RA,Dec [radius]) or labels (name=label, ...)")
    if "=" in text:
        return {"sel": parse_sel(p for p in re.split(r"[,;\s]+", text) if p)}
    parts = text.split()
    if len(parts) > 1 and re.search(r"[a-z\"']$", parts[-1], re.I):
        return {"sky": " ".join(parts[:-1]).replace(" ", ""), "radius": parts[-1]}
    return {"sky": text.replace(" ", "")}


def _located(run, start: str, text: str) -> np.ndarray:
    return run.cells_at(start, **locate_query(text))


def trace_all(run, start: str, cells: np.ndarray, backward: bool, shortcut: bool = True,
              direct: dict[str, CellSet] | None = None,
              ) -> tuple[dict[str, CellSet], list[StepStat], float]:
    """The cells of every array reachable from ``cells`` of ``start``: the executor's
    own walk (:meth:`subzero.api.Run.trace_reach`), on the run's thread; ``direct`` gets
    each array's cells reached without an all-to-all step."""
    return run.trace_reach(start, cells, "backward" if backward else "forward", shortcut,
                           direct)


def _warm(run) -> None:
    """Open the run's executor and load its operators (what a first trace would wait for)."""
    run.executor().warm()


def _open(store_path, run_ref):
    from subzero.api import open_store
    return open_store(store_path, create=False).get(run_ref)


def _plain(v):
    if v is None:
        return None
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if np.isfinite(f) else str(f)
    if isinstance(v, (np.integer, int, np.bool_, bool)):
        return v.item() if hasattr(v, "item") else v
    return str(v)


def _made(op: dict | None) -> dict | None:
    """How a re-run made one array (None: the run is no re-run): kept from its parent,
    some tiles run, or run whole; and the chunks where it differs from the parent's."""
    if op is None:
        return None
    return {"how": op.get("kind"), "tiles": op.get("tiles"), "recomputed": op.get("ran"),
            "changed_chunks": (op.get("changed") or {}).get("chunks")}
