"""The impact of an input region across every run that read it (issue 29).

"A column of tonight's flat was bad: which cells of which runs did it touch?"
The store knows each run's inputs by content (:mod:`subzero.model.content`), so
the runs that read the flat come from the catalog's index, whatever file or path
each run was given; each is then traced forward from its input (under whatever
name that run gave it) to the arrays asked for, or to the workflow's outputs.
The cost follows the runs found and the cells affected, not the store's size.

An untrusted run (made elsewhere, not trusted here) is answered from its stored
lineage where that needs no code; where it does, the run is listed with the
reason instead of an answer -- never skipped silently.

The runs are answered by :func:`answer`, one run at a time, wherever they are
answered (:mod:`subzero.parallel`: this process, its forks, or a Spark job over
runs); the answer is plain data (:class:`Impact`), which
:mod:`subzero.export.impact` writes as a table, a plot, PROV or OpenLineage.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from subzero.errors import QueryError, SubZeroError


class RunsByInput(Protocol):
    """What an impact query needs of a store (:class:`subzero.store.Store` has it)."""

    def digest_of(self, what: Any, name: str | None = None) -> str: ...

    def runs_using(self, what: Any, name: str | None = None) -> list[tuple[int, str]]: ...

    def get(self, ref: str | int = "latest") -> Any: ...

    def checks_shared(self, vouchers: Mapping[int, Any] | None = None) -> AbstractContextManager[None]: ...

    def vouchers(self, run_ids: Sequence[int]) -> dict[int, Any]: ...

    @property
    def path(self) -> Path: ...


@dataclass(frozen=True)
class TargetImpact:
    """The affected cells of one array of one run."""

    array: str
    cells: np.ndarray = field(repr=False)
    #: inclusive low and exclusive high corner of the cells, None when none
    bounds: tuple[tuple[int, ...], tuple[int, ...]] | None
    #: the cells' region on the sky / in labelled axes, when the array has them
    where: dict[str, Any] = field(default_factory=dict)
    #: the labels of the objects affected: per labelled axis its labels the cells
    #: touch, and ``ids`` of the objects of a label image (its operator declares
    #: ``labels_objects``: 0 = none, k = object k), e.g. star ids
    objects: dict[str, list] = field(default_factory=dict)
    #: the array's shape
    shape: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return int(len(self.cells))

    def as_dict(self) -> dict[str, Any]:
        return {"array": self.array, "count": self.count, "cells": self.cells.tolist(),
                "bounds": None if self.bounds is None else [list(self.bounds[0]), list(self.bounds[1])],
                **self.where, **({"objects": self.objects} if self.objects else {})}


@dataclass(frozen=True)
class RunImpact:
    """One run that read the input: what it affected, or why that cannot be told."""

    run_id: int
    workflow: str
    input: str                           # the input's name in this run
    targets: list[TargetImpact]
    seconds: float
    #: why this run has no answer (an untrusted run whose lineage needs its code...)
    error: str | None = None

    @property
    def count(self) -> int:
        return sum(t.count for t in self.targets)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "workflow": self.workflow, "input": self.input,
                "count": self.count, "seconds": self.seconds, "error": self.error,
                "targets": [t.as_dict() for t in self.targets]}


@dataclass(frozen=True)
class Impact:
    """Every run that read the input, and the cells the region affected in each."""

    digest: str
    cells_in: int
    runs: list[RunImpact]
    #: the input's cells the question names, and the input's shape
    cells: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64), repr=False)
    shape: tuple[int, ...] = ()

    @property
    def touched(self) -> list[RunImpact]:
        """The runs where the region affected at least one cell."""
        return [r for r in self.runs if r.count]

    def by_workflow(self) -> dict[str, list[RunImpact]]:
        out: dict[str, list[RunImpact]] = {}
        for r in self.runs:
            out.setdefault(r.workflow, []).append(r)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "cells_in": self.cells_in,
                "runs": [r.as_dict() for r in self.runs]}

    def to_table(self, path: str | os.PathLike, force: bool = False) -> Path:
        """Write one row per run and array to ``path``: ``.csv``, or ``.parquet`` (with
        pyarrow); see :mod:`subzero.export.impact`."""
        from subzero.export.impact import write_table
        return write_table(self, path, force)

    def plot(self, path: str | os.PathLike, force: bool = False) -> Path:
        """Draw every run's affected regions, grouped by workflow, to ``path`` (.png,
        .pdf or .svg)."""
        from subzero.export.impact import write_plot
        return write_plot(self, path, force)


def outputs(ops: Sequence[Mapping[str, Any]]) -> list[str]:
    """A workflow's outputs: the operators whose array no other operator reads."""
    read = {i for o in ops for i in o["inputs"]}
    return [o["name"] for o in ops if o["name"] not in read]


@dataclass(frozen=True)
class Question:
    """What every run is asked, as plain data (it travels to worker processes and Spark
    tasks): the input's cells, and the arrays to trace to (None: each workflow's
    outputs).  ``strict``: an unknown target is an error (one run), not skipped."""

    cells: np.ndarray
    targets: tuple[str, ...] | None
    strict: bool = False


def impact(store: RunsByInput, what: Any, cells: Any = None, *, name: str | None = None,
           to: str | Sequence[str] | None = None, sky: Any = None, radius: Any = None,
           sel: Mapping[str, Any] | None = None, engine: str | None = None, spark: Any = None,
           master: str | None = None, conf: Mapping[str, str] | None = None,
           progress: Any = None, announce: Callable[[str], None] | None = None) -> Impact:
    """See :meth:`subzero.store.Store.impact`."""
    from subzero.engines.choice import EngineRequest, impact_engine
    from subzero.engines.progress import progress_for
    from subzero.parallel import answer_runs

    request = EngineRequest(engine, master, dict(conf or {}), spark)
    request.check()
    digest = store.digest_of(what, name)
    uses = store.runs_using(digest)
    targets = (to,) if isinstance(to, str) else tuple(to) if to is not None else None
    if not uses:
        return Impact(digest, 0, [])
    first, inp = uses[0]
    with store.get(first) as run:       # the same content everywhere: the same cells in every run
        shape = tuple(run.shapes()[inp])
        spec = np.asarray(run.select(inp, cells, sky=sky, radius=radius, sel=sel),
                          dtype=np.int64).reshape(-1, len(shape))
    question = Question(spec, targets, strict=targets is not None and len(uses) == 1)
    choice = impact_engine(request, len(uses))
    if announce is not None and not choice.asked:
        announce(choice.line(master))
    reporter = progress_for(progress)
    reporter.begin(len(uses), f"impact on {len(uses)} runs", unit="run")
    try:
        found = answer_runs(store, uses, answer, question, choice.engine, reporter, request)
    finally:
        reporter.close()
    return Impact(digest, int(len(spec)), found, spec, shape)


def answer(store: RunsByInput, rid: int, inp: str, q: Question) -> RunImpact:
    """One run's answer: its input's cells traced forward to each target downstream of
    it, or why the run cannot be answered (a :class:`SubZeroError` other than a
    mistake in the question)."""
    import time
    t0 = time.perf_counter()
    run = store.get(rid)
    try:
        wanted = list(q.targets) if q.targets is not None else outputs(run.ops())
        shapes = run.shapes()
        unknown = [t for t in wanted if t not in shapes]
        if unknown and q.strict:
            raise QueryError(f"unknown array {unknown[0]!r} in run {rid}; its arrays are: "
                             f"{', '.join(shapes)}")
        ops = run.ops()
        got = []
        for t in wanted:
            if t not in shapes or not _downstream(ops, inp, t):
                continue
            res = run.trace(inp, q.cells, to=t, record=False)
            got.append(TargetImpact(t, res.cells, res.cellset.bounds(), res.where(), _objects(run, t, res),
                                    tuple(shapes[t])))
        return RunImpact(rid, run.row.workflow, inp, got, time.perf_counter() - t0)
    except QueryError:
        raise
    except SubZeroError as e:
        return RunImpact(rid, run.row.workflow, inp, [], time.perf_counter() - t0, error=str(e))
    finally:
        run.close()


def _objects(run: Any, target: str, res: Any) -> dict[str, list]:
    """The labels of the objects ``res`` touches in array ``target``: its labelled axes'
    labels at the cells, and the ids of a label image's objects (read from the
    answer's bounding box only).  A label image is known by its operator's
    declaration, which is code: an untrusted run lists its labelled axes only."""
    from subzero.coords.labels import labels_of
    if not len(res):
        return {}
    try:
        out = labels_of(res.grid(), res.cells)
    except QueryError:
        out = {}                # where() said why, once
    steps = run.workflow.steps if run.trusted else {}
    if target in steps and getattr(steps[target].operator, "labels_objects", False):
        ids = np.unique(np.asarray(res.values))
        out["ids"] = [v.item() for v in ids[ids != 0]]
    return out


def _downstream(ops: Sequence[Mapping[str, Any]], start: str, target: str) -> bool:
    """Whether array ``target`` is computed (through any path) from array ``start``."""
    seen, todo = {start}, [start]
    while todo:
        a = todo.pop()
        for o in ops:
            if a in o["inputs"] and o["name"] not in seen:
                seen.add(o["name"])
                todo.append(o["name"])
    return target in seen and target != start
