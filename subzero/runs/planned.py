"""A budget run made from the profiling run its plan was just chosen on.

``run --max-disk`` (``Store.run(max_disk=...)``) without a saved profile runs the
workflow twice: once to profile it (a complete run storing each operator's
defaults) and once with the plan.  The second run computes nothing the first did
not: the same workflow, parameters and inputs.  So it is made from the first with
the incremental engine (:mod:`subzero.engines.incremental`), no input changed:
every operator's output is the profiling run's, its chunks linked from there
(the profiling run keeps every array for it), its strategies that the plan keeps
are copies of the profiling run's (``Parent.copies``), and the plan's others are
the profiling run's pairs, read back from the strategies it stored and written
with the plan's.  A lineage mode the plan needs and the profiling run did not store (Pay
pairs where it kept Full ones), its profiler captured when it re-ran the operator
to time that mode: those pairs are kept in memory (up to
``PROFILE_KEEP_PAIRS_BYTES``, of operators whose lineage is the same on every run)
and stored; without them the operator runs again.

The result is the run a full run with the plan makes -- every array, and the
relation its lineage stores -- made like any other run (a run transaction, its
journal, its signed record, committed atomically, its disk budget and the plan's
arrays kept or dropped), and it resumes as a plain run does.  Its record gives,
for an operator taken from the profiling run, the profiling run's own times
(``run_s``, ``lwrite_s``): what running the operator costs, as the query planner
prices re-executing it, not the milliseconds taking it over took.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from subzero.capture.buffer import Pairs
from subzero.engines.choice import Choice
from subzero.engines.incremental import IncrementalEngine
from subzero.engines.stats import RunStats
from subzero.errors import StoreError, UntrustedRun, UsageError
from subzero.forked import cores
from subzero.model.workflow import Workflow
from subzero.runs.ahead import EncodedAhead
from subzero.runs.journal import Journal
from subzero.runs.keep import check_policy
from subzero.runs.launch import execute, plan_strategies, resolve_strategies
from subzero.runs.options import RunOptions
from subzero.runs.rerun import Run, parent_plan
from subzero.runs.transaction import RunTransaction
from subzero.storage.arrays import ArrayStore
from subzero.storage.catalog import Catalog
from subzero.tuning import DEFAULT_TILE


def can_make_from(opts: RunOptions) -> bool:
    """Whether a run with ``opts`` can be made from its profiling run (which ran in this
    process with the default tiles): it stores lineage, runs in this process (no Spark
    asked for) and with the default tiles."""
    spark = opts.engine == "spark" or opts.master or opts.conf or opts.spark is not None
    return bool(opts.capture and not spark and opts.tile_size == DEFAULT_TILE
                and not opts.strategies)


def make_from(catalog: Catalog, runs_dir: Path, parent: Run, opts: RunOptions,
              pairs: Mapping[tuple[str, str], Pairs] | None = None,
              sums: Mapping[str, Mapping[int, bytes]] | None = None) -> tuple[int, Workflow] | None:
    """Make the run ``opts.plan`` describes from ``parent``, the complete, trusted run
    of the same workflow, parameters and inputs its plan was profiled on; returns the
    new run's id and its workflow.  ``pairs``: (operator, mode) -> pairs of lineage
    modes the parent did not store, as its profiler captured them (those operators are
    not run again), and of modes it stored, as its steps captured them (not read back).
    ``sums``: array -> its chunks' SHA-256 as the parent's run wrote them in this process
    (its profiler's): arrays this run links from the parent and then does not keep are
    dropped without reading their chunks back.
    None, before anything is begun, when the parent cannot be made from (not complete,
    not trusted, its record not naming every operator's strategies): the caller runs
    the plan in full."""
    if opts.plan is None:
        raise UsageError("a run made from its profiling run needs the plan chosen on it")
    try:
        wf, pp = parent_plan(parent)
    except (StoreError, UntrustedRun):
        return None
    check_policy(opts.keep, opts.pins, wf)
    times = {o["name"]: (float(o.get("run_s") or 0.0), float(o.get("lwrite_s") or 0.0))
             for o in parent.ops()}        # an operator taken over keeps its real times
    strategies, budget = plan_strategies(catalog, opts.plan, wf, None, opts.max_disk)
    strat = resolve_strategies(wf, strategies)
    opts = RunOptions.of(opts, tile=pp.tile, capture=True, engine="local")
    if opts.announce is not None:
        opts.announce(f"making the run from profiling run {pp.run_id} (same inputs): its "
                      f"arrays and lineage pairs are taken from there, not computed again")
    handle = pp.open(wf)          # the arrays the parent did not keep: made again, checked
    handle.side = dict(pairs or {})
    handle.arrays.vouch_sums(sums or {})
    ahead = None
    try:
        # half the lineage to encode from the profiler's pairs, encoded in a child meanwhile
        ahead = handle.ahead = EncodedAhead.start(handle, wf, strat, cores())
        choice = Choice("local", asked=True, fallback=False,
                        reason="a run made from its profiling run runs in this process")
        described = dict(pp.described)
        with RunTransaction.begin(catalog, runs_dir, wf, described, "local") as tx:
            journal = Journal(tx.folder)
            journal.begin(tx.run_id, wf, described, "local", strat, True, pp.tile, budget,
                          keep={"policy": opts.keep, "pins": list(opts.pins)})
            arrays = ArrayStore(tx.folder, tile=pp.tile, run_uid=tx.uid)
            pp.share_unchanged(handle, arrays, list(wf.inputs), {})
            values = pp.inputs(handle, list(wf.inputs), {})
            engine = IncrementalEngine(arrays, handle, [])

            def annotate(stats: RunStats) -> None:
                for o in stats.ops:
                    if engine.report.get(o.name, {}).get("kind") == "kept" and o.name in times:
                        o.run_s, o.lwrite_s = times[o.name]

            execute(tx, wf, values, strat, budget, choice, None, opts, journal, arrays=arrays,
                    engine=engine, annotate=annotate, keep_every=False)
    finally:
        if ahead is not None:
            ahead.close()
        if handle.lineage is not None:
            handle.lineage.close()
    return tx.run_id, wf

