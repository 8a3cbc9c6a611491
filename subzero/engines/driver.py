"""The driver loop every engine shares: operators in topological order; per
operator the engine's step, its output array bound to its place (its chunk
manifest, :meth:`Engine.bind`), its statistics, its lineage written under the
run's disk budget, its timing, the optimizer's profiling hook, and progress.

A local run, a Spark run and each instance of an instance-parallel run all go
through :func:`run_workflow`; what differs between them is the :class:`Engine`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from subzero.capture.buffer import Pairs
from subzero.engines.base import Engine, StepResult
from subzero.engines.lineage import commit_tile_shards, store_lineage
from subzero.engines.progress import Progress
from subzero.engines.stats import ArrayInfo, OpStats, RunStats
from subzero.errors import SubZeroError
from subzero.model.strategy import BLACKBOX, Strategy, modes_needed
from subzero.model.workflow import Workflow, check_reexecution
from subzero.storage.budget import DiskBudget
from subzero.storage.lineage import LineageStore

if TYPE_CHECKING:
    from subzero.storage.arrays import ArrayStore


@dataclass(frozen=True)
class Captured:
    """What an operator's step captured while it ran, as the profiling hook sees it: the
    lineage modes, their pairs, and the run's seconds with its lwrite time."""

    modes: frozenset
    full: Pairs | None
    pay: Pairs | None
    run_s: float
    lwrite_s: float


#: ``profiler(name, op, inputs, output, run_s, captured, arrays)``: called after each
#: operator runs (``run_s`` without its lineage capture; ``captured`` None when nothing
#: was; ``arrays`` the run's array store, which holds the operator's array as the run
#: wrote it: what keeping it costs is read there, not written a second time)
Profiler = Callable[[str, Any, list, Any, float, "Captured | None", "ArrayStore | None"], None]


class Recorder(Protocol):
    """Where the driver says what of a run is durable as it goes (a run's journal,
    :class:`subzero.runs.journal.Journal`), so a run whose driver is lost can resume."""

    def inputs(self, infos: list[ArrayInfo]) -> None: ...

    def finished(self, st: OpStats, budget: DiskBudget | None) -> None: ...


def run_workflow(engine: Engine, wf: Workflow, inputs: Mapping[str, Any],
                 strategies: Mapping[str, tuple[Strategy, ...]], lineage: LineageStore | None,
                 budget: DiskBudget | None = None, capture: bool = True,
                 progress: Progress | None = None, profiler: Profiler | None = None,
                 journal: Recorder | None = None, done: RunStats | None = None) -> RunStats:
    """Run every operator of ``wf`` on ``engine``; write lineage to ``lineage`` (none when
    it is None or ``capture`` is off) within ``budget``; return the run's statistics.

    ``profiler``, when given, is called after each operator with its input and output
    values (the optimizer's profiling mode measures lineage there); only a local engine
    made with ``profiling=True`` hands them over (it then runs every operator whole).
    Nothing of a step is kept once it is committed: the engine holds only the arrays
    a later operator still reads whole.

    ``journal`` is told what is durable as the run goes (inputs stored, each
    operator's array and lineage written).  ``done`` resumes a run: the statistics of
    its inputs and of the operators that finished, whose arrays are already in the
    engine's store (``inputs`` unused); the run continues from the first other one."""
    check_reexecution(wf, strategies)
    progress = progress if progress is not None else Progress()
    if done is not None:
        finished = [o.name for o in done.ops]
        engine.resume(wf, [a.name for a in done.inputs] + finished)
        stats = RunStats(inputs=list(done.inputs), ops=list(done.ops))
        for name in finished:
            progress.finished(name)
    else:
        engine.load_inputs(wf, inputs)
        engine.bind(list(inputs))      # final: bound before the journal says they are stored
        stats = RunStats(inputs=[ArrayInfo.of(name, v) for name, v in inputs.items()])
        if journal is not None:
            journal.inputs(stats.inputs)

    def commit(name: str, res: StepResult) -> None:
        engine.bind([name])            # its chunks are final once its step is over
        _finish_step(name, wf, res, strategies[name], capture, lineage, budget, stats,
                     profiler, engine)
        if journal is not None:
            if lineage is not None:
                lineage.sync()      # on disk before the journal says so
            journal.finished(stats.ops[-1], budget)
        progress.finished(name)

    _schedule(engine, wf, [n for n in wf.order() if n not in {o.name for o in stats.ops}], strategies,
              capture, progress, commit)
    return stats


def _label(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} +{len(names) - 1} in one job"


def _schedule(engine: Engine, wf: Workflow, pending: list[str],
              strategies: Mapping[str, tuple[Strategy, ...]], capture: bool, progress: Progress,
              commit: Callable[[str, StepResult], None]) -> None:
    """The one loop over a run's jobs, as dask's scheduler loop is one loop whatever runs
    the tasks: up to ``engine.concurrent_jobs`` groups of operators whose inputs are
    stored run at once, each from a thread of its own (the two exposures' branches
    keep a cluster busy together), while their results are committed --
    statistics, lineage under the budget, the journal -- here, one at a time and in
    workflow order, so a run's record and its budget's choices do not depend on
    which job finished first.  With one job at a time the jobs run on this thread
    (:class:`_Inline`): the same loop, in sequence.  A failure (or Ctrl-C) cancels the
    jobs still running and is raised once they stop."""
    jobs = max(1, int(engine.concurrent_jobs))
    shared = _SharedTiles(progress) if jobs > 1 else None
    order = list(pending)
    steps = wf.steps
    ran: dict[str, StepResult] = {}         # run, not yet committed
    available: set[str] = set(wf.steps) - set(pending)      # operators whose arrays are stored
    claimed: set[str] = set()
    running: dict[Future, list[str]] = {}
    at = 0
    pool: Executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="subzero-job") \
        if jobs > 1 else _Inline()
    try:
        while at < len(order):
            deferred: set[str] = set()
            while len(running) < jobs:
                free = [n for n in order if n not in claimed]
                ready = next((n for n in free if n not in deferred and all(
                    a not in steps or a in available for a in steps[n].inputs)), None)
                if ready is None:
                    break
                names = engine.group(wf, [ready] + [n for n in free if n != ready])
                busy = {n for ns in running.values() for n in ns}
                if busy and engine.waits_for(wf, names, busy, free):
                    deferred.update(names)      # a bigger stage once a running job ends
                    continue
                claimed.update(names)
                (shared or progress).started(_label(names))
                reporter = shared.job(names[0]) if shared is not None else progress
                running[pool.submit(engine.run_group, wf, names, strategies, capture,
                                    reporter)] = names
            _harvest(wait(list(running), return_when=FIRST_COMPLETED).done, running, ran, available)
            if not running and shared is not None:
                shared.idle()
            while at < len(order) and order[at] in ran:
                commit(order[at], ran.pop(order[at]))
                at += 1
    except BaseException:
        if running:
            engine.cancel()         # the jobs still running stop; their errors are moot
        wait(list(running))
        raise
    finally:
        pool.shutdown(wait=True)


def _harvest(finished: set[Future], running: dict[Future, list[str]], ran: dict[str, StepResult],
             available: set[str]) -> None:
    """Take the results of the jobs that ended (a failed job's error is raised here).  A
    function of its own so that nothing but ``ran`` keeps a step's values and lineage
    once it is committed."""
    for f in finished:
        names = running.pop(f)
        for name, res in zip(names, f.result()):
            ran[name] = res
            available.add(name)


class _Inline(Executor):
    """Runs a submitted call at once, on the calling thread: the driver loop with one
    job at a time (Ctrl-C and the engine's state stay on the driver's thread)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        f: Future = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:
            if not isinstance(e, Exception):
                raise                   # Ctrl-C, exit: not a job's failure
            f.set_exception(e)
        return f


class _SharedTiles(Progress):
    """The reporter of a run whose jobs run at once: their tile counts reported as one
    (the sums over the jobs since the last moment none was running), and every call
    into the user's reporter made under one lock (job threads report tiles while the
    driver's thread reports operators)."""

    def __init__(self, inner: Progress):
        self.inner = inner
        self.wants_tasks = inner.wants_tasks
        self._lock = threading.Lock()
        self._jobs: dict[str, tuple[int, int]] = {}

    def job(self, key: str) -> Progress:
        """The reporter handed to one job."""
        return _JobTiles(self, key)

    def tiles_of(self, key: str, done: int, total: int) -> None:
        with self._lock:
            self._jobs[key] = (done, total)
            self.inner.tiles(sum(d for d, _ in self._jobs.values()),
                             sum(t for _, t in self._jobs.values()))

    def idle(self) -> None:
        with self._lock:
            self._jobs.clear()

    def begin(self, total: int, desc: str, unit: str = "op") -> None:
        with self._lock:
            self.inner.begin(total, desc, unit)

    def started(self, name: str) -> None:
        with self._lock:
            self.inner.started(name)

    def finished(self, name: str) -> None:
        with self._lock:
            self.inner.finished(name)

    def close(self) -> None:
        with self._lock:
            self.inner.close()


class _JobTiles(Progress):
    """One concurrent job's reporter: its tiles go to the run's :class:`_SharedTiles`."""

    def __init__(self, shared: _SharedTiles, key: str):
        self.shared, self.key = shared, key
        self.wants_tasks = shared.wants_tasks

    def tiles(self, done: int, total: int) -> None:
        self.shared.tiles_of(self.key, done, total)


def _finish_step(name: str, wf: Workflow, res: StepResult, strat: tuple[Strategy, ...], capture: bool,
                 lineage: LineageStore | None, budget: DiskBudget | None, stats: RunStats,
                 profiler: Profiler | None, engine: Engine) -> None:
    """One operator has run: its statistics, its lineage under the budget, the
    profiling hook."""
    step = wf.steps[name]
    op = step.operator
    # a run without lineage stores nothing: it says so, so traces do not look for it
    kept = strat if capture else (tuple(s for s in strat if not s.stored) or (BLACKBOX,))
    st = OpStats(name, type(op).__name__, list(step.inputs), [str(s) for s in kept],
                 res.out_shape, dtype=res.dtype, nbytes=res.nbytes, run_s=res.run_s,
                 lwrite_s=res.lwrite_s, tiles=res.tiles, statistic=res.statistic,
                 rounds=res.rounds)
    t0 = time.perf_counter()
    if capture and lineage is not None:
        st.pairs = res.pairs if res.pairs is not None else \
            (res.full.n if res.full else 0) + (res.pay.n if res.pay else 0)
        if res.shards is not None:
            commit_tile_shards(name, op, strat, res.shards, res.out_shape, res.in_shapes, lineage,
                               st, budget=budget)
        else:
            store_lineage(name, op, strat, res.full, res.pay, res.out_shape, res.in_shapes,
                          lineage, st, budget=budget, copies=res.copies, ahead=res.ahead)
    st.lineage_s = time.perf_counter() - t0
    if profiler is not None:
        if res.inputs is None:
            raise SubZeroError(f"profiling runs use the local engine (`engine='local'`) "
                               f"made with profiling=True, not {engine.name}")
        # the operator's time without its lineage capture (a profiling run may store some),
        # and what it captured: the profiler need not run a mode again to see its pairs
        modes = modes_needed(strat) if capture else frozenset()
        profiler(name, op, res.inputs, res.output, max(res.run_s - res.lwrite_s, 0.0),
                 Captured(modes, res.full, res.pay, res.run_s, res.lwrite_s)
                 if res.shards is None and modes else None, engine.array_store())
    stats.ops.append(st)
