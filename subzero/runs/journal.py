"""A run's journal: what of a running run is already durable, so that a run whose
driver was lost can be resumed from the first unfinished operator.

``runs/<id>.partial/journal.jsonl`` holds one JSON line per event, each written
and fsynced only once what it reports is on disk:

* ``begin``: what the run needs to be continued the same way -- the workflow's
  fingerprint (its pickled operators and the source of their modules), each
  operator's strategies, whether lineage is captured, the tile size, the disk
  budget;
* ``inputs``: the run's inputs are in its array store (their catalog records);
* ``op``: one operator's array and lineage are written (its statistics, the
  disk budget's state after it).

An operator with no ``op`` line is redone on resume: whatever it left (an array,
a task attempt's folder, part of its lineage) is removed first.  A torn last
line -- the driver died while writing it -- counts as not written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from subzero.engines.stats import ArrayInfo, OpStats
from subzero.errors import StoreError
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow
from subzero.storage.budget import DiskBudget

FILE = "journal.jsonl"
VERSION = 1


def fingerprint(wf: Workflow) -> str:
    """What must not change between a run's start and its resume: the workflow's
    operators as pickled (classes by name, parameters and state by value) and the
    source files of the modules their classes come from."""
    h = hashlib.sha256()
    steps = [(n, s.operator, list(s.inputs)) for n, s in wf.steps.items()]
    try:
        h.update(cloudpickle.dumps(steps))
    except Exception:       # operators that cannot be pickled: their classes, parameters' repr
        h.update(repr([(n, type(op).__module__, type(op).__qualname__, sorted(vars(op).items())
                        if hasattr(op, "__dict__") else None, ins)
                       for n, op, ins in steps]).encode())
    files = set()
    for step in wf.steps.values():
        mod = sys.modules.get(type(step.operator).__module__)
        try:
            files.add(inspect.getsourcefile(mod) if mod is not None else None)
        except TypeError:
            pass
    for f in sorted(x for x in files if x):
        try:
            h.update(Path(f).read_bytes())
        except OSError:
            pass
    return h.hexdigest()


@dataclass
class Resumable:
    """What an interrupted run's journal says is done."""

    fingerprint: str
    strategies: dict[str, list[str]]
    capture: bool
    tile: int
    budget: dict | None
    inputs: list[ArrayInfo] | None = None
    ops: list[OpStats] = field(default_factory=list)
    used: int = 0
    downgrades: list[dict] = field(default_factory=list)

    @property
    def done(self) -> list[str]:
        return [o.name for o in self.ops]

    def disk_budget(self) -> DiskBudget | None:
        if self.budget is None:
            return None
        return DiskBudget(int(self.budget["max_bytes"]),
                          {(op, s): int(b) for op, s, b in self.budget["predicted"]},
                          used=self.used, downgrades=list(self.downgrades))


class Journal:
    """Appends a running run's events to its journal (see the module's docstring)."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / FILE

    def _append(self, event: dict) -> None:
        line = json.dumps(event, default=str) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def begin(self, wf: Workflow, strategies: Mapping[str, tuple[Strategy, ...]], capture: bool,
              tile: int, budget: DiskBudget | None) -> None:
        self._append({"event": "begin", "version": VERSION, "fingerprint": fingerprint(wf),
                      "strategies": {n: [str(s) for s in ss] for n, ss in strategies.items()},
                      "capture": capture, "tile": tile,
                      "budget": None if budget is None else {
                          "max_bytes": budget.max_bytes,
                          "predicted": [[op, s, b] for (op, s), b in budget.predicted.items()]}})

    def inputs(self, infos: list[ArrayInfo]) -> None:
        self._append({"event": "inputs", "inputs": [dataclasses.asdict(a) for a in infos]})

    def finished(self, st: OpStats, budget: DiskBudget | None) -> None:
        self._append({"event": "op", "stats": dataclasses.asdict(st),
                      "used": budget.used if budget is not None else 0,
                      "downgrades": budget.downgrades if budget is not None else []})


def read_journal(folder: Path, run_id: int) -> Resumable:
    """The journal of an interrupted run, or a StoreError saying why it cannot resume."""
    path = Path(folder) / FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError as err:
        raise StoreError(f"run {run_id} cannot be resumed: it has no journal ({path}); it was "
                         f"started by an older SubZero or its folder is gone. Remove it with "
                         f"`subzero clean`") from err
    except OSError as e:
        raise StoreError(f"run {run_id} cannot be resumed: cannot read {path}: {e}") from e
    events = []
    for k, text in enumerate(lines):
        try:
            events.append(json.loads(text))
        except ValueError as err:
            if k == len(lines) - 1:
                break           # torn by the crash: not written
            raise StoreError(f"run {run_id} cannot be resumed: its journal {path} is damaged "
                             f"at line {k + 1}") from err
    if not events or events[0].get("event") != "begin" or events[0].get("version") != VERSION:
        raise StoreError(f"run {run_id} cannot be resumed: its journal {path} does not begin "
                         f"with a version-{VERSION} header")
    b = events[0]
    state = Resumable(b["fingerprint"], b["strategies"], bool(b["capture"]), int(b["tile"]),
                      b.get("budget"))
    for ev in events[1:]:
        if ev["event"] == "inputs":
            state.inputs = [ArrayInfo(a["name"], tuple(a["shape"]), a["dtype"], int(a["nbytes"]))
                            for a in ev["inputs"]]
        elif ev["event"] == "op":
            d: dict[str, Any] = dict(ev["stats"])
            d["shape"] = tuple(d["shape"])
            state.ops.append(OpStats(**d))
            state.used = int(ev["used"])
            state.downgrades = list(ev["downgrades"])
    return state
