r"""Which arrays a run keeps: its ``--keep`` policy and ``--pin``\ s.

A run's intermediate arrays are most of what it keeps on disk (lineage is a small
part), and most of them are never read again: a trace whose steps answer from
stored lineage or mapping functions reads no array, only the values it prints
(of the arrays it starts and ends at).  So an intermediate array need not be
kept when its values can be made again, exactly: its operator run again on its
inputs (kept, or made again in turn), checked chunk by chunk against the SHA-256
of its values recorded as it was dropped (:meth:`~subzero.storage.arrays.ArrayStore.drop`).

The policies:

* ``all``: every array is kept (what SubZero did before ``--keep``);
* ``outputs``: the workflow's inputs and outputs (arrays no operator reads) are
  kept, intermediates are not;
* ``auto`` (the default): as ``outputs``, and also every array a trace reads:
  the inputs of an operator whose traces re-execute it (it stores no lineage and
  has no mapping functions), the arrays the workflow's workload starts at, ends
  at or picks its cells by (its ``WORKFLOW_workload.json`` beside the module, and
  the traces logged on the store's earlier runs of the workflow: their values are
  what a trace prints), an array whose dropping would free less than
  :data:`~subzero.tuning.KEEP_MIN_SAVING`, and an array that would take more than
  :data:`~subzero.tuning.KEEP_RECOMPUTE_S` to make again (its operator's run time,
  with that of the arrays it would have to make again first).

Always kept, whatever the policy: pinned arrays, and the output of an operator
that is not deterministic or whose statistic the engine merged over tiles (no
re-run could prove itself on them).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from subzero.engines.stats import OpStats
from subzero.errors import BudgetError, SubZeroError, UsageError
from subzero.model.strategy import Strategy, reexecuted
from subzero.model.workflow import Workflow
from subzero.storage.files import read_regular
from subzero.tuning import (
    DEFAULT_KEEP,
    KEEP_MIN_SAVING,
    KEEP_POLICIES,
    KEEP_RECOMPUTE_S,
    METADATA_BYTES,
)

if TYPE_CHECKING:
    from subzero.storage.arrays import ArrayStore
    from subzero.storage.budget import DiskBudget

#: the policies
POLICIES = KEEP_POLICIES
__all__ = ["DEFAULT_KEEP", "POLICIES", "array_bytes", "cheap_to_keep", "check_policy",
           "drop_saving", "droppable", "fit", "not_kept", "preferred", "reserve", "workload_arrays",
           "workload_of"]


def check_policy(keep: str, pins: Iterable[str], wf: Workflow | None = None) -> None:
    """A policy that is one of :data:`POLICIES`, and pins that name arrays of ``wf``
    (one line naming the mistake)."""
    if keep not in POLICIES:
        raise UsageError(f"`keep` must be one of {', '.join(POLICIES)}, not {keep!r}")
    if wf is not None:
        for p in pins:
            if p not in wf.steps and p not in wf.inputs:
                raise UsageError(f"`pins` names no array of workflow {wf.name!r}: {p!r}; its "
                                 f"arrays are: {', '.join(wf.arrays())}")


def _must_keep(wf: Workflow, stats: Iterable[OpStats], pins: Iterable[str]) -> set[str]:
    """What no policy and no budget drops: pinned arrays, the workflow's inputs and
    outputs, and the outputs of operators whose values no re-run could prove."""
    by_op = {o.name: o for o in stats}
    must = set(pins) | set(wf.inputs)
    for name, step in wf.steps.items():
        o = by_op.get(name)
        if not step.operator.deterministic or o is None or o.statistic or o.rounds \
                or not wf.consumers(name):
            must.add(name)
    return must


def droppable(wf: Workflow) -> list[str]:
    """The intermediate arrays of ``wf`` a run may drop, in its order: read by an operator,
    made by a deterministic one that declares no whole-array statistic (what
    :func:`reserve` does not count whole)."""
    return [n for n in wf.order() if wf.consumers(n) and wf.steps[n].operator.deterministic
            and wf.steps[n].operator.statistic is None]


def preferred(wf: Workflow, run_s: Mapping[str, float], sizes: Mapping[str, float]) -> set[str]:
    """The arrays among ``sizes`` (name -> bytes dropping it frees) ``auto`` keeps whatever
    the workload: dropping it frees less than :data:`~subzero.tuning.KEEP_MIN_SAVING`,
    or making it again takes more than :data:`~subzero.tuning.KEEP_RECOMPUTE_S` (its
    operator's run, ``run_s``, with that of the inputs it makes again first)."""
    return _slow_to_make_again(wf, sizes, run_s, also=lambda n: sizes[n] < KEEP_MIN_SAVING)


def _slow_to_make_again(wf: Workflow, candidates: Collection[str], run_s: Mapping[str, float],
                        also: Callable[[str], bool] = lambda name: False) -> set[str]:
    """Of ``candidates`` (arrays a run might drop), those ``auto`` keeps because making one
    again would take more than :data:`~subzero.tuning.KEEP_RECOMPUTE_S`: its operator's
    run (``run_s``) and that of the inputs it would make again first (the candidates
    not kept) -- or for which ``also`` says so."""
    out: set[str] = set()
    cost: dict[str, float] = {}
    for name in wf.order():
        if name not in candidates:
            continue
        c = run_s.get(name, 0.0) + sum(cost.get(i, 0.0) for i in wf.steps[name].inputs)
        if also(name) or c > KEEP_RECOMPUTE_S:
            out.add(name)
        else:
            cost[name] = c
    return out


def workload_arrays(wf: Workflow, queries: Iterable[Mapping]) -> set[str]:
    """The arrays of ``wf`` that workload ``queries`` (as a workload file writes them, or
    the trace log's rows: ``start``/``target``) start at, end at, or name in their cell
    selector (``"where": "crmask == 1"``)."""
    names = set(wf.arrays())
    out: set[str] = set()
    for q in queries:
        if not isinstance(q, Mapping):
            continue
        start = q.get("from", q.get("start"))
        for key in ("to", "target"):
            if isinstance(q.get(key), str):
                out.add(q[key])
        path = q.get("path")
        if isinstance(start, str):
            out.add(start)
            if isinstance(path, list) and path and all(isinstance(p, (list, tuple)) and len(p) == 2
                                                      for p in path):
                op, i = path[-1]
                step = wf.steps.get(op)
                if path[0][0] == start and step is not None and isinstance(i, int) \
                        and 0 <= i < len(step.inputs):
                    out.add(step.inputs[i])              # backward: the last step's input
                elif isinstance(op, str):
                    out.add(op)                          # forward: the last step's output
        cells = q.get("cells")
        if isinstance(cells, Mapping) and isinstance(cells.get("where"), str):
            out.update(re.findall(r"[A-Za-z_][\w.-]*", cells["where"]))
    return out & names


def not_kept(wf: Workflow, strategies: Mapping[str, Sequence[Strategy]], stats: Iterable[OpStats],
             keep: str, pins: Iterable[str] = (), read: Iterable[str] = (),
             planned: Iterable[str] | None = None) -> list[str]:
    """The arrays a run drops under policy ``keep``, in the workflow's order; ``read``:
    arrays its workload reads (:func:`workload_arrays`), kept under ``auto``.
    ``planned``: the arrays a disk budget's plan chose to drop (``subzero optimize``
    priced each against the workload); under ``auto`` they are what the run drops, but
    for what no policy drops (pins, outputs, arrays no re-run could prove)."""
    if keep == "all":
        return []
    stats = list(stats)
    by_op = {o.name: o for o in stats}
    must = _must_keep(wf, stats, pins)
    if keep == "auto" and planned is not None:
        chosen = set(planned)
        return [n for n in wf.order() if n in chosen and n not in must]
    if keep == "auto":
        must.update(read)
    for name, step in wf.steps.items():
        if keep == "auto" and reexecuted(strategies.get(name, ())):
            must.update(step.inputs)
    candidates = [n for n in wf.order() if n not in must]
    if keep != "auto":
        return candidates
    slow = _slow_to_make_again(wf, set(candidates), {n: o.run_s for n, o in by_op.items()})
    return [n for n in candidates if n not in slow]


def _bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a folder or a file), as ``du -b`` counts them."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for here, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(here, f)).st_size
            except FileNotFoundError:
                continue
    return total


def array_bytes(arrays: ArrayStore, name: str, dropped: bool = False) -> int:
    """Bytes of a run's own array as the disk budget counts them: its files (chunks,
    metadata, its sidecar), not the folders that hold them.  ``dropped``: what it
    would keep if it were not kept (its metadata, its sidecar and the SHA-256 of each
    chunk that the sidecar would add)."""
    from subzero.storage.chunks import CHUNK_SHA, SUMS_FORMAT, TRAILER, sums_file
    p = arrays.path(name)
    side = _bytes(sums_file(p)) if sums_file(p).exists() else 0
    if not p.exists():
        return side
    if not dropped:
        return _bytes(p) + side
    meta = chunks = 0
    for here, _dirs, files in os.walk(p):
        for f in files:
            if f == "zarr.json":
                meta += os.lstat(os.path.join(here, f)).st_size
            elif os.path.relpath(here, p).split(os.sep)[:2] == ["data", "c"]:
                chunks += 1
    try:                      # the sidecar as drop() would write it: exactly its bytes
        body = json.loads(sums_file(p).read_text())
        if "dropped" not in body:
            n = len((body.get("chunks") or {}).get("data", "")) // (2 * TRAILER) or chunks
            body.update({"format": SUMS_FORMAT, "dropped": {"data": "00" * CHUNK_SHA * n}})
            body["seal"] = "0" * 64
        side = len(json.dumps(body, indent=1, sort_keys=True).encode())
    except (OSError, ValueError, AttributeError, TypeError):
        side += 2 * CHUNK_SHA * chunks + 64
    return meta + side


def drop_saving(arrays: ArrayStore, name: str) -> int:
    """Bytes not keeping array ``name`` frees: its files less what a dropped array keeps
    (:func:`array_bytes`), never below nothing."""
    return max(array_bytes(arrays, name) - array_bytes(arrays, name, dropped=True), 0)


def cheap_to_keep(arrays: ArrayStore, wf: Workflow) -> set[str]:
    """The operators' arrays whose dropping would free less than
    :data:`~subzero.tuning.KEEP_MIN_SAVING` (a scalar such as an overscan mean: made
    again whole, it would rebuild everything above it for nothing)."""
    return {n for n in wf.steps if arrays.kept(n)
            and drop_saving(arrays, n) < KEEP_MIN_SAVING}


def reserve(arrays: ArrayStore | None, wf: Workflow,
            fallback: Callable[[str], int] = lambda name: 0) -> int:
    """Bytes a run of ``wf`` keeps of arrays whatever its ``--keep`` policy, measured on
    a run's arrays (``arrays``; None: none to measure): whole, its outputs (arrays no
    operator reads) and the arrays of operators that are not deterministic or declare
    a whole-array statistic (no policy drops them where the engine merged it over
    tiles); the metadata and checksums of its other intermediates; an array kept
    whole that is not found there counts ``fallback(name)`` (its uncompressed size)."""
    total = 0
    drop = set(droppable(wf))
    for n in wf.steps:
        if n in drop:                  # an intermediate: at least its metadata stays
            total += array_bytes(arrays, n, dropped=True) if arrays is not None else 0
            continue
        got = array_bytes(arrays, n) if arrays is not None else 0
        total += got or fallback(n)
    return int(total)


def fit(arrays: ArrayStore, wf: Workflow, stats: Iterable[OpStats], pins: Iterable[str],
        budget: DiskBudget) -> list[str]:
    """Make the run's arrays and lineage fit its ``--max-disk`` together, once the last
    operator ran: drop more of the intermediate arrays it still keeps until they do --
    first those its plan says the workload would miss least per byte
    (``budget.spare``), then the largest -- and return what was dropped (what the budget asks for, not a
    misprediction: no warning; ``subzero du`` names every array not kept).
    The workflow's inputs are stored once for the store and are not the run's to
    count.  When the arrays no budget drops (outputs, pins) and the lineage do not fit,
    :class:`~subzero.errors.BudgetError`: the run fails, nothing of it is kept.

    Lineage counts as the budget counted it while it was written (its encoded bytes,
    what ``run.lineage_bytes()`` says), arrays by :func:`array_bytes`."""
    stats = list(stats)
    must = _must_keep(wf, stats, pins)
    sizes = {n: array_bytes(arrays, n) for n in wf.steps}      # not kept: their metadata
    lineage = budget.used
    total = sum(sizes.values()) + lineage
    out: list[str] = []
    rank = {n: k for k, n in enumerate(budget.spare)}
    for name in sorted((n for n in sizes if n not in must and arrays.kept(n)),
                       key=lambda n: (rank.get(n, len(rank)), -sizes[n], n)):
        if total <= budget.max_bytes:
            break
        arrays.drop(name)
        total -= sizes[name] - array_bytes(arrays, name)
        out.append(name)
    if total > budget.max_bytes:
        kept = sum(b for n, b in sizes.items() if arrays.kept(n))
        rest = sum(array_bytes(arrays, n) for n in sizes if not arrays.kept(n))
        raise BudgetError(f"the run does not fit its disk budget of {budget.max_bytes} bytes: the "
                          f"arrays it must keep (its outputs and pinned arrays) take {kept} bytes, "
                          f"the metadata and checksums of those it does not keep {rest}, and its "
                          f"lineage {lineage}; give a larger --max-disk")
    return out


def workload_of(wf: Workflow, logged: Iterable[Mapping]) -> list[Mapping]:
    """The queries ``auto`` keeps arrays for: the workload file shipped beside the
    workflow's module (``WORKFLOW_workload.json``; one that cannot be read counts for
    nothing: a run never fails on it) and the trace log's rows ``logged`` (earlier
    runs' traces of the same workflow)."""
    out: list[Mapping] = list(logged)
    src = wf.source
    if src and src.endswith(".py"):
        f = Path(src).with_name(Path(src).stem + "_workload.json")
        try:
            data = json.loads(read_regular(f, METADATA_BYTES, "workload file")) \
                if f.is_file() else None
        except (SubZeroError, OSError, ValueError):
            data = None
        items = data.get("queries") if isinstance(data, dict) else data
        if isinstance(items, list):
            out.extend(q for q in items if isinstance(q, Mapping))
    return out
