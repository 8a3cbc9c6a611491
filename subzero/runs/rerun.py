"""Re-runs: a complete run made again with some inputs corrected, recomputing only
what the correction can reach (:mod:`subzero.engines.incremental`).

A re-run is a new run, made like any other (a run transaction, its journal, its
signed record, committed atomically), on the parent's workflow, strategies,
parameters and tile size; its inputs are the corrected ones and, for the
others, the parent's own (read from the parent's verified arrays: an input the
store keeps once stays one copy).  Its record names its parent and, per
operator, what ran again and where the output changed.  A re-run of a run
whose code this user's key does not vouch for is refused: it would run that
code.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from subzero.engines.choice import Choice
from subzero.engines.incremental import IncrementalEngine
from subzero.engines.parent import Parent
from subzero.engines.stats import RunStats
from subzero.errors import StoreError, UntrustedRun, UsageError
from subzero.model.strategy import Strategy, parse
from subzero.model.workflow import Workflow
from subzero.runs.journal import Journal
from subzero.runs.launch import bind_inputs, execute
from subzero.runs.options import RunOptions
from subzero.runs.transaction import RunTransaction
from subzero.storage.arrays import ArrayStore
from subzero.storage.catalog import Catalog
from subzero.storage.lineage import LineageStore
from subzero.tuning import DEFAULT_TILE

if TYPE_CHECKING:
    from subzero.run import Run


class StoredInput:
    """An input of the parent run, read region by region from its verified store (with
    the dims and attributes it was stored with, so the re-run stores it in the same
    form, and shares the store's one copy of it)."""

    def __init__(self, arrays: ArrayStore, name: str):
        self.arrays, self.name = arrays, name
        shape, dtype, _ = arrays.describe(name)
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        dims, _, attrs = arrays.grid_parts(name)
        self.dims, self.attrs = tuple(dims), dict(attrs)

    def read_region(self, region: tuple[slice, ...]) -> np.ndarray:
        return self.arrays.read_region(self.name, region)

    def __repr__(self) -> str:
        return f"StoredInput({self.name!r} of {self.arrays.label(self.name)})"


def parent_tile(arrays: ArrayStore, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The tile size the parent ran with, from the chunks of an array it split (any tile
    at least as large as every array gives the same chunks: the default then)."""
    for name, shape in shapes.items():
        try:
            chunks = arrays.chunk_shape(name)
        except (StoreError, OSError):
            continue
        split = [c for c, n in zip(chunks, shape) if c < n]
        if split:
            return int(max(split))
    return DEFAULT_TILE


def rerun(catalog: Catalog, runs_dir: Path, parent: Run, inputs: Mapping[str, Any],
          opts: RunOptions) -> tuple[int, Workflow, dict[str, Any]]:
    """Make ``parent`` again with ``inputs`` (names to arrays, DataArrays or file paths)
    in place of its own; returns the new run's id, its workflow and what it recomputed."""
    row = parent.row
    if row.status != "complete":
        raise StoreError(f"run {row.id} is {row.status}; only a complete run can be re-run")
    if not parent.trusted:
        v = parent.verdict()
        why = v.state + (f": {v.detail}" if v.detail else "")
        raise UntrustedRun(f"run {row.id} is not trusted ({why}); a re-run runs its code: check "
                           f"it, then `subzero trust {row.id}`")
    if not inputs:
        raise UsageError(f"a re-run of run {row.id} needs at least one corrected input "
                         f"(--input NAME=PATH)")
    wf = parent.workflow
    steer = parent.steering()
    strategies: dict[str, tuple[Strategy, ...]] = {
        o["name"]: parse("+".join(o["strategies"])) for o in steer.ops}
    missing = [n for n in wf.steps if n not in strategies]
    if missing:
        raise StoreError(f"run {row.id} records no strategies for operator {missing[0]!r}; its "
                         f"record does not match its workflow")
    unknown = [k for k in inputs if k not in wf.inputs]
    if unknown:
        raise UsageError(f"workflow {wf.name!r} of run {row.id} has no input {unknown[0]!r}; its "
                         f"inputs: {', '.join(wf.inputs)}")
    p_arrays = parent._arrays
    shapes = {k: tuple(v) for k, v in parent.shapes().items()}
    given, described_given = bind_inputs(wf, {**{n: _placeholder for n in wf.inputs}, **inputs})
    values: dict[str, Any] = {}
    described: dict[str, Any] = {}
    for name in wf.inputs:
        if name in inputs:
            values[name], described[name] = given[name], described_given[name]
        else:
            # the parent's own: a DataArray as a DataArray (its labels), else read by region
            _, _, numpy = p_arrays.describe(name)
            values[name] = StoredInput(p_arrays, name) if numpy else p_arrays.read_value(name)
            described[name] = row.inputs.get(name, f"<input {name!r} of run {row.id}>")
    tile = opts.tile if opts.tile is not None else parent_tile(p_arrays, shapes)
    opts = RunOptions.of(opts, tile=tile, capture=True, engine="local")
    lin_dir = parent.dir / "lineage"
    p_lineage = LineageStore(lin_dir, readonly=True, run_uid=parent.uid) if lin_dir.is_dir() else None
    try:
        handle = Parent(row.id, p_arrays, p_lineage, strategies, shapes,
                        {o["name"]: o["statistic"] for o in steer.ops if o.get("statistic")},
                        {o["name"]: o["rounds"] for o in steer.ops if o.get("rounds")})
        choice = Choice("local", asked=True, fallback=False, reason="a re-run runs in this process")
        with RunTransaction.begin(catalog, runs_dir, wf, described, "local") as tx:
            journal = Journal(tx.folder)
            journal.begin(tx.run_id, wf, described, "local", strategies, True, tile, None)
            arrays = ArrayStore(tx.folder, tile=tile, run_uid=tx.uid)
            for name in wf.inputs:      # the store's copy of an unchanged input: one copy still
                ref = p_arrays.ref(name) if name not in inputs else None
                if ref is not None and ref.store == arrays.store_uid():
                    arrays.refer(name, ref.digest, ref.form, ref.numpy)
            engine = IncrementalEngine(arrays, handle, list(inputs))
            summary: dict[str, Any] = {}

            def annotate(stats: RunStats) -> None:
                summary.update(parent=row.id, parent_uid=parent.uid, inputs=sorted(inputs),
                               ops=engine.report)
                stats.rerun = summary

            execute(tx, wf, values, strategies, None, choice, None, opts, journal,
                    arrays=arrays, engine=engine, annotate=annotate)
    finally:
        if p_lineage is not None:
            p_lineage.close()
    return tx.run_id, wf, summary


_placeholder = np.zeros(1)      # an input bind_inputs need not resolve (the parent's is used)
