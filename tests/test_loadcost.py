"""What a trace process pays to load a workflow's operators, measured for the workflow a
plan is made for (``optimizer.loadcost``): a fresh process loads the workflow's pickle
after importing what a trace imports first, and the plan reports that beside its query
prices (at genomics 1x, 6-9 ms of a 9.5 ms first query that no calibration could see)."""

import sys
import threading

import subzero
from subzero.operators import MeanFilter
from subzero.optimizer import loadcost

#: a module of operators whose import takes ``SPIN`` seconds of CPU: the cost a trace
#: pays for it is the cost the child must find
SLOW = """
import time
from subzero.operators import MeanFilter
t = time.process_time()
while time.process_time() - t < {spin}:
    pass


class Slow(MeanFilter):
    pass
"""


def _workflow(op):
    wf = subzero.Workflow("loaded")
    x = wf.input("x")
    wf.add("smooth", op, x)
    return wf


def _module(folder, name: str, spin: float, monkeypatch, child: bool = True):
    """A module ``name`` in ``folder`` whose import spins ``spin`` seconds, importable
    here and (``child``) in the child, which inherits PYTHONPATH."""
    (folder / f"{name}.py").write_text(SLOW.format(spin=spin))
    monkeypatch.syspath_prepend(str(folder))
    if child:
        monkeypatch.setenv("PYTHONPATH", str(folder))
    return __import__(name)


def test_the_load_of_operators_from_a_slow_module_is_measured(tmp_path, monkeypatch):
    """The child imports the operators' module as a trace would: its cost is there, and a
    workflow of SubZero's own operators (imported with the trace's code) costs far less."""
    slow = _module(tmp_path, "subzero_test_slow_ops", 0.2, monkeypatch)
    try:
        got = loadcost.start(_workflow(slow.Slow(3))).seconds()
        plain = loadcost.start(_workflow(MeanFilter(3))).seconds()
    finally:
        sys.modules.pop("subzero_test_slow_ops", None)
    assert got >= 0.2
    assert 0.0 <= plain < 0.1


def test_a_workflow_that_cannot_be_pickled_costs_nothing_measured(tmp_path):
    """Operators that cannot be pickled leave no pickle to load (a trace then loads the
    workflow from its source): no child, and 0.0 rather than a guess or an error."""
    op = MeanFilter(3)
    op.lock = threading.Lock()              # not picklable
    cost = loadcost.start(_workflow(op))
    assert cost._child is None
    assert cost.seconds() == 0.0


def test_a_child_that_fails_costs_nothing_measured(tmp_path, monkeypatch):
    """The child cannot import the operators' module (it is on this process's path
    only): 0.0 rather than a figure, and the pickle's folder is removed."""
    here = _module(tmp_path, "subzero_test_here_ops", 0.0, monkeypatch, child=False)
    try:
        cost = loadcost.start(_workflow(here.Slow(3)))
        assert cost._child is not None and cost._folder is not None
        folder = cost._folder.path
        assert folder.exists()
        assert cost.seconds() == 0.0
    finally:
        sys.modules.pop("subzero_test_here_ops", None)
    assert not folder.exists()


def test_a_load_that_outlasts_the_wait_is_left_out(tmp_path, monkeypatch):
    """A workflow whose imports take longer than the plan waits for them: no figure (0.0)
    after about the wait, never a plan held up by the child, which is stopped."""
    import time
    (tmp_path / "subzero_test_slower_ops.py").write_text(
        "import os, time\n"
        "from subzero.operators import MeanFilter\n"
        "t = time.process_time()\n"
        "while os.environ.get('SUBZERO_TEST_SPIN') and time.process_time() - t < 60:\n"
        "    pass\n\n\n"
        "class Slow(MeanFilter):\n"
        "    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(loadcost, "LOADCOST_WAIT_S", 0.5)
    try:
        slow = __import__("subzero_test_slower_ops")        # here: no spin
        monkeypatch.setenv("SUBZERO_TEST_SPIN", "1")       # the child's import spins 60 s
        # pickled while its module is imported here: by reference, so the child imports it
        cost = loadcost.start(_workflow(slow.Slow(3)))
    finally:
        sys.modules.pop("subzero_test_slower_ops", None)
    child = cost._child
    t0 = time.perf_counter()
    assert cost.seconds() == 0.0
    assert time.perf_counter() - t0 < 10.0
    assert child is not None and child._p is None          # reaped, not left running
