"""The runs of an impact query answered in parallel (issue 29): in this process's
pool for a few runs, as one Spark job over runs for many -- the same answers
either way, since both call :func:`subzero.impact.answer` on each run.

The work is plain data on both sides: a group of ``(run id, input name)`` and the
:class:`~subzero.impact.Question` go out, :class:`~subzero.impact.RunImpact`
values come back.  A worker (a forked process, or a Spark task) opens the store
itself from its path (with the driver's store class: no import of it here) and
checks each run's trust as the driver would -- on Spark with the driver's
vouchers for the signatures, executors never seeing the key; within a group it
shares what it verified (:meth:`subzero.store.Store.checks_shared`).
Warnings a worker raises are carried back and raised again by the driver, so
they are seen once, where the user is.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from subzero.errors import SubZeroWarning
from subzero.tuning import IMPACT_RUNS_PER_TASK, IMPACT_RUNS_PER_WORKER

if TYPE_CHECKING:
    from subzero.engines.choice import EngineRequest
    from subzero.engines.progress import Progress
    from subzero.storage.trust import Voucher

Uses = Sequence[tuple[int, str]]
#: what is asked of every run, and one run's answer: plain data, which this module
#: only carries (:class:`subzero.impact.Question` and ``RunImpact`` for an impact query)
Question = Any
RunImpact = Any


class RunsByInput(Protocol):
    """What answering runs in parallel needs of a store (:class:`subzero.store.Store`):
    its folder, for workers to open it again, the driver's vouchers for the runs'
    signatures, and a scope in which runs share their trust checks."""

    @property
    def path(self) -> Any: ...

    def checks_shared(self) -> AbstractContextManager[Any]: ...

    def vouchers(self, run_ids: Any) -> Any: ...


#: one run's answer: ``answer(store, run id, input name, question)``
#: (:func:`subzero.impact.answer`; a module's function, so that it travels by name)
Answer = Callable[[Any, int, str, Any], Any]


def answer_runs(store: RunsByInput, uses: Uses, answer: Answer, q: Question, engine: str,
                progress: Progress, request: EngineRequest | None = None) -> list[RunImpact]:
    """Every run's ``answer`` to ``q``, in the order of ``uses``: on Spark (``engine``
    "spark", with the session, or master and conf, of ``request``) or in this process,
    in a pool of worker processes when there are runs enough for more than one."""
    if engine == "spark":
        from subzero.engines.choice import EngineRequest
        return _on_spark(store, uses, answer, q, progress, request or EngineRequest("spark"))
    workers = min(os.cpu_count() or 1, math.ceil(len(uses) / IMPACT_RUNS_PER_WORKER))
    if workers <= 1:
        return answer_group(store, uses, answer, q, progress)
    return _in_pool(store, uses, answer, q, progress, workers)


def answer_group(store: RunsByInput, uses: Uses, answer: Answer, q: Question,
                 progress: Progress | None = None) -> list[RunImpact]:
    """Runs answered one after another, sharing their trust checks."""
    out = []
    with store.checks_shared():
        for rid, inp in uses:
            out.append(answer(store, rid, inp, q))
            if progress is not None:
                progress.finished(f"run {rid}")
    return out


def _groups(uses: Uses, n: int) -> list[list[tuple[int, str]]]:
    """``uses`` in ``n`` groups of consecutive runs (runs made together are alike)."""
    size = math.ceil(len(uses) / max(1, n))
    return [list(uses[k:k + size]) for k in range(0, len(uses), size)]


# -- worker processes ---------------------------------------------------------------------
#: the store a pool's worker process opened (one per process, set by its initializer)
_worker_store: Any = None


def _open_worker_store(opener: Callable[..., Any], path: str) -> None:
    global _worker_store
    _worker_store = opener(path, create=False)


def _pool_task(group: list[tuple[int, str]], answer: Answer,
               q: Question) -> tuple[list[RunImpact], list[str]]:
    return _answered(_worker_store, group, answer, q)


def _answered(store: RunsByInput, group: list[tuple[int, str]], answer: Answer,
              q: Question) -> tuple[list[RunImpact], list[str]]:
    """A group's answers and the warnings raised while answering it (as text)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", SubZeroWarning)
        got = answer_group(store, group, answer, q)
    return got, [str(w.message) for w in seen if issubclass(w.category, SubZeroWarning)]


def _rewarn(messages: Sequence[str]) -> None:
    from subzero.errors import warn
    for m in dict.fromkeys(messages):
        warn(m)


def _in_pool(store: RunsByInput, uses: Uses, answer: Answer, q: Question, progress: Progress,
             workers: int) -> list[RunImpact]:
    """Worker processes forked from this one, each answering groups of a few runs as they
    come, so that a slow run holds up only its group.  This process answers the first
    group itself before it forks: what answering needs is then imported once, not in
    every worker."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    first = answer_group(store, uses[:IMPACT_RUNS_PER_WORKER], answer, q, progress)
    rest = uses[IMPACT_RUNS_PER_WORKER:]
    groups = _groups(rest, max(workers, math.ceil(len(rest) / IMPACT_RUNS_PER_WORKER)))
    ctx = multiprocessing.get_context("fork")
    out: list[RunImpact] = list(first)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_open_worker_store,
                             initargs=(type(store), str(store.path))) as pool:
        for got, said in pool.map(_pool_task, groups, [answer] * len(groups), [q] * len(groups)):
            _rewarn(said)
            out.extend(got)
            for r in got:
                progress.finished(f"run {r.run_id}")
    return out


# -- Spark --------------------------------------------------------------------------------
def _spark_task(opener: Callable[..., Any], path: str, answer: Answer, q: Question,
                vouchers: Mapping[int, Voucher], groups: Any) -> Any:
    """One Spark task: its groups of runs answered from the store at ``path`` (opened by
    ``opener``, the driver's store class), each run's signature as the driver checked it
    (``vouchers``: executors never see the key)."""
    with opener(path, create=False) as store, store.checks_shared(vouchers):
        for group in groups:
            yield _answered(store, group, answer, q)


def _on_spark(store: RunsByInput, uses: Uses, answer: Answer, q: Question, progress: Progress,
              request: EngineRequest) -> list[RunImpact]:
    """One Spark job over the runs: a task per group of runs, each answered by its
    executor from the store (which the executors must see at the same path)."""
    from functools import partial

    from subzero.engines.choice import Choice, open_session
    from subzero.engines.spark.jobs import collect
    session = open_session(Choice("spark", "as asked"), request, store.path)
    sc = session.sparkContext
    tasks = max(1, min(len(uses), max(sc.defaultParallelism, math.ceil(len(uses) / IMPACT_RUNS_PER_TASK))))
    groups = _groups(uses, tasks)
    vouchers = store.vouchers(sorted({rid for rid, _ in uses}))
    rdd = sc.parallelize(groups, len(groups)).mapPartitions(
        partial(_spark_task, type(store), str(store.path), answer, q, vouchers))

    def on_tasks(done: int, total: int) -> None:
        progress.tiles(done, total)

    out: list[RunImpact] = []
    for got, said in collect(rdd, "(impact)", on_tasks if progress.wants_tasks else None):
        _rewarn(said)
        out.extend(got)
        for r in got:
            progress.finished(f"run {r.run_id}")
    return out
