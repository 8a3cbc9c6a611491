"""A run's journal: what of a running run is already durable, so that a run whose
driver was lost can be resumed from the first unfinished operator.

``runs/<id>.partial/journal.jsonl`` holds one JSON line per event, each written
and fsynced only once what it reports is on disk:

* ``begin``: what the run needs to be continued the same way -- the run's id,
  its workflow's name, module (``source``) and parameters, its inputs and engine
  as the catalog records them, the workflow's fingerprint (its pickled operators
  and the source of their modules), each operator's strategies, whether lineage
  is captured, the tile size, the disk budget -- signed with this user's key
  (HMAC-SHA256, :mod:`subzero.storage.trust`);
* ``inputs``: the run's inputs are in its array store (their catalog records);
* ``op``: one operator's array and lineage are written (its statistics, the
  disk budget's state after it).

An operator with no ``op`` line is redone on resume: whatever it left (an array,
a task attempt's folder, part of its lineage) is removed first.  A torn last
line -- the driver died while writing it -- counts as not written.

Nothing runs before trust: an unfinished run has no run signature yet (runs are
signed as they commit), so resume proves with the ``begin`` line that this user
began the run -- and that the catalog still names the workflow module,
parameters, inputs and engine that were signed -- before it imports any code
(:func:`check_begun`).  A run begun with another key, or whose journal or
catalog entry changed, is refused; ``subzero trust`` does not apply to it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
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
from subzero.errors import StoreError, UnsafeFile, UntrustedRun, warn
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow
from subzero.storage.budget import DiskBudget
from subzero.storage.catalog import RunRow
from subzero.storage.files import read_regular
from subzero.storage.trust import key_id, load_key, signature_of
from subzero.tuning import JOURNAL_BYTES

FILE = "journal.jsonl"
#: 2: the begin line names the run, its workflow, parameters, inputs and engine, signed
VERSION = 2


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
    #: the begin line as written (with its signature): what :func:`check_begun` proves
    begun: dict = field(default_factory=dict, repr=False)
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
                          arrays_reserve=int(self.budget.get("arrays_reserve", 0)),
                          drops=None if self.budget.get("drops") is None
                          else tuple(str(n) for n in self.budget["drops"]),
                          spare=tuple(str(n) for n in self.budget.get("spare") or ()),
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

    def begin(self, run_id: int, wf: Workflow, inputs: Mapping[str, Any], engine: str,
              strategies: Mapping[str, tuple[Strategy, ...]], capture: bool, tile: int,
              budget: DiskBudget | None, rerun: Mapping[str, Any] | None = None,
              keep: Mapping[str, Any] | None = None) -> None:
        """The first line: what resume needs, signed with this user's key (made on first
        use).  Without a usable key the run still runs; it cannot be resumed.  ``rerun``:
        a re-run's parent (:class:`~subzero.engines.parent.ParentPlan` as plain data) and
        the inputs it corrects, so a resumed re-run goes on as one.  ``keep``: the run's
        ``--keep`` policy and pins (``{"policy": ..., "pins": [...]}``), so a resumed
        run keeps what it began to (a journal without it began as ``all``)."""
        event = _plain({
            "event": "begin", "version": VERSION, "run": run_id, "workflow": wf.name,
            "source": wf.source, "params": wf.params, "inputs": dict(inputs), "engine": engine,
            "fingerprint": fingerprint(wf),
            "strategies": {n: [str(s) for s in ss] for n, ss in strategies.items()},
            "capture": capture, "tile": tile,
            "budget": None if budget is None else {
                "max_bytes": budget.max_bytes, "arrays_reserve": budget.arrays_reserve,
                "predicted": [[op, s, b] for (op, s), b in budget.predicted.items()],
                **({"drops": list(budget.drops)} if budget.drops is not None else {}),
                **({"spare": list(budget.spare)} if budget.spare else {})},
            **({"rerun": dict(rerun)} if rerun is not None else {}),
            **({"keep": dict(keep)} if keep is not None else {})})
        try:
            key = load_key(create=True)
        except StoreError as e:
            warn(f"run {run_id} could not sign its journal ({e}); it runs, but cannot be resumed "
                 f"should its driver be lost")
            key = None
        if key is not None:
            event["key_id"] = key_id(key)
            event["signature"] = signature_of(key, event)
        self._append(event)

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
        lines = read_regular(path, JOURNAL_BYTES, "its journal",
                             limit_name="JOURNAL_BYTES").decode("utf-8", "replace").splitlines()
    except UnsafeFile as e:
        raise StoreError(f"run {run_id} cannot be resumed: {e} (damaged or replaced); remove it "
                         f"with `subzero clean`") from e
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
    try:
        state = Resumable(str(b["fingerprint"]), dict(b["strategies"]), bool(b["capture"]),
                          int(b["tile"]), b.get("budget"), begun=b)
    except (KeyError, TypeError, ValueError) as err:
        raise StoreError(f"run {run_id} cannot be resumed: its journal {path} has a damaged "
                         f"header") from err
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


def _plain(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` as it reads back from its JSON line (what the signature covers is what
    resume will read)."""
    out: dict[str, Any] = json.loads(json.dumps(event, default=str))
    return out


#: what the catalog row of a run must still say, as its journal's begin line signed it
_BOUND = (("workflow", "workflow"), ("source", "source"), ("params", "params"),
          ("inputs", "inputs"), ("engine", "engine"))


def check_begun(state: Resumable, row: RunRow, path: Path) -> None:
    """Prove, before any code it names is loaded, that this user began run ``row``:
    its journal's begin line (``path``) verifies with this user's key, names this run,
    and the catalog still names the workflow module, parameters, inputs and engine it
    signed.  Raises :class:`~subzero.errors.UntrustedRun` in one line saying why."""
    b = state.begun
    source = row.source or "a workflow made in Python"
    refuse = (f"run {row.id} cannot be resumed: SubZero will not load the workflow it names "
              f"({source}) because ")
    after = ("; `subzero trust` does not apply to an unfinished run: start the workflow anew "
             "(`subzero run`), and remove this run with `subzero clean`")
    sig, kid = b.get("signature"), b.get("key_id")
    if not isinstance(sig, str) or not isinstance(kid, str):
        raise UntrustedRun(refuse + f"its journal {path} is not signed (written by an older "
                                    f"SubZero, or elsewhere)" + after)
    key = load_key(create=False)
    if key is None or not hmac.compare_digest(kid, key_id(key)):
        raise UntrustedRun(refuse + "it was begun with another user's key (a store from "
                                    "elsewhere)" + after)
    unsigned = {k: v for k, v in b.items() if k != "signature"}
    if not hmac.compare_digest(sig, signature_of(key, unsigned)):
        raise UntrustedRun(refuse + f"its journal {path} changed since the run began (its "
                                    f"signature does not verify)" + after)
    if b.get("run") != row.id:
        raise UntrustedRun(refuse + f"its journal {path} is the journal of run {b.get('run')} "
                                    f"(a folder copied or moved)" + after)
    now = _plain({"workflow": row.workflow, "source": row.source, "params": row.params,
                  "inputs": row.inputs, "engine": row.engine})
    for field_, catalog_field in _BOUND:
        if now[catalog_field] != b.get(field_):
            raise UntrustedRun(refuse + f"its catalog entry changed since the run began (its "
                                        f"{catalog_field} is not what the run's signed journal "
                                        f"says)" + after)
