"""The one driver loop (subzero.engines.driver): an engine declares what it can do
(concurrent jobs, groups, waiting, cancelling) and the loop never probes for it;
one job at a time runs on the driver's own thread, several from threads of their
own, and results are committed in workflow order whichever job ends first."""

import threading
import time

import numpy as np
import pytest

from subzero import Operator, OperatorError, Workflow
from subzero.engines.base import Engine, StepResult
from subzero.engines.driver import run_workflow
from subzero.engines.local import LocalEngine
from subzero.engines.progress import Progress
from subzero.engines.spark.engine import SparkEngine


class Op(Operator):
    def run(self, ctx, *xs):
        return xs[0]


def branches() -> Workflow:
    """Two independent branches a1 -> a2 and b1 -> b2, joined by c."""
    wf = Workflow("branches")
    x = wf.input("x")
    a1 = wf.add("a1", Op(), x)
    b1 = wf.add("b1", Op(), x)
    a2 = wf.add("a2", Op(), a1)
    b2 = wf.add("b2", Op(), b1)
    wf.add("c", Op(), a2, b2)
    return wf


class Scripted(Engine):
    """An engine of this test's own: each step sleeps as long as ``delays`` says and
    records where and when it ran (no arrays: the loop is what is tested)."""

    name = "scripted"

    def __init__(self, jobs: int = 1, delays: dict | None = None, fail: str | None = None):
        self.concurrent_jobs = jobs
        self.delays = delays or {}
        self.fail = fail
        self.ran: list[tuple[str, str]] = []          # (operator, thread name), in start order
        self.cancelled = False
        self.lock = threading.Lock()

    def load_inputs(self, wf, values):
        pass

    def resume(self, wf, stored):
        pass

    def run_step(self, name, step, strategies, capture, progress):
        with self.lock:
            self.ran.append((name, threading.current_thread().name))
        time.sleep(self.delays.get(name, 0.0))
        if name == self.fail:
            raise OperatorError(f"operator {name!r} failed on purpose")
        return StepResult((2,), "float64", 16, [(2,)], None, None, 0.0, 0.0)

    def cancel(self):
        self.cancelled = True


class Recording(Progress):
    def __init__(self):
        self.done: list[str] = []

    def finished(self, name):
        self.done.append(name)


def _run(engine, wf):
    progress = Recording()
    stats = run_workflow(engine, wf, {"x": np.zeros(2)}, {n: () for n in wf.steps}, None,
                         capture=False, progress=progress)
    return stats, progress


def test_abilities_are_declared_not_probed():
    for cls in (LocalEngine, SparkEngine):
        for ability in ("concurrent_jobs", "group", "run_group", "waits_for", "cancel"):
            assert hasattr(cls, ability), (cls, ability)
    assert LocalEngine.concurrent_jobs == 1 and SparkEngine.concurrent_jobs > 1
    assert LocalEngine.group is Engine.group and SparkEngine.group is not Engine.group


def test_one_job_at_a_time_runs_in_order_on_the_drivers_thread():
    engine = Scripted(jobs=1)
    stats, progress = _run(engine, branches())
    order = branches().order()
    assert [n for n, _ in engine.ran] == order
    assert {t for _, t in engine.ran} == {threading.current_thread().name}
    assert [o.name for o in stats.ops] == order == progress.done


def test_concurrent_jobs_overlap_and_commit_in_workflow_order():
    # a1 is slow: b1 and b2 run (and finish) while it runs, yet the record keeps
    # workflow order
    engine = Scripted(jobs=2, delays={"a1": 0.4})
    stats, progress = _run(engine, branches())
    order = branches().order()
    started = [n for n, _ in engine.ran]
    assert started.index("b2") < started.index("a2"), started     # b's branch went ahead
    assert {t for _, t in engine.ran} != {threading.current_thread().name}
    assert [o.name for o in stats.ops] == order == progress.done


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_job_cancels_the_rest_and_is_raised(jobs):
    engine = Scripted(jobs=jobs, delays={"a1": 0.3}, fail="b1")
    with pytest.raises(OperatorError, match="'b1' failed on purpose"):
        _run(engine, branches())
    assert "c" not in [n for n, _ in engine.ran]
    # jobs still running are cancelled; with one job at a time none is running
    assert engine.cancelled == (jobs > 1)
