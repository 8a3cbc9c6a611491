"""What a ``subzero trace`` process pays to load *this* workflow's operators.

A trace is a fresh process.  Before its first step it loads the run's operators from
``workflow.pkl``, which imports every module they come from: at genomics 1x that was
6-9 ms of a 9.5 ms first query, when the steps themselves took 1 ms.  The calibration
measures a fresh process's other first uses (the store opened, the planner made, the
query code's imports) on its own synthetic workflow, whose operators live in SubZero and
cost nothing to import; it cannot see what a user's workflow imports.  So the optimizer
measures it for the workflow it plans: the workflow pickled as a run stores it, then
loaded in a fresh Python process that has first imported what a trace imports before it
loads a run's operators, in CPU seconds.  Once: only a process's first load imports
anything, and that one is what a trace pays.

The child starts when :func:`start` is called and is read when :meth:`LoadCost.seconds`
is: ``optimize`` starts it before calibrating and profiling and reads it when the plan
is assembled, so on a machine with two cores it costs the optimizer no wall time.
"""

from __future__ import annotations

import math

from subzero.scratch import Scratch, scratch
from subzero.tuning import LOADCOST_WAIT_S

from .observers import Child

#: The child: the imports a ``subzero trace`` has made when it loads a run's operators
#: (``Run.trace`` -> ``Store.workflow_of``), then that load, timed.
_CODE = """
import sys, time
from pathlib import Path
import subzero
from subzero.heap import steady
steady()                                  # as the command line's own process does
from subzero.store import open_store      # what `subzero trace` imports first
import subzero.query.executor
import subzero.optimizer.planner
from subzero.storage.pickles import load_workflow_pickle
data = Path(sys.argv[1]).read_bytes()
c0 = time.process_time()
try:
    load_workflow_pickle(data, lambda: {})
except Exception:             # a module it cannot import, constants it would rebuild:
    sys.exit(1)               # a failed child, no figure
print(time.process_time() - c0)
"""


class LoadCost:
    """A fresh child timing one load of a workflow's pickle (see the module's docstring);
    ``None`` child when the workflow could not be pickled or no process started."""

    def __init__(self, child: Child | None, folder: Scratch | None):
        self._child = child
        self._folder = folder
        self._seconds: float | None = None

    def seconds(self) -> float:
        """The CPU seconds the load took; 0.0 when it could not be measured (the child
        failed, printed something else, had not ended ``LOADCOST_WAIT_S`` seconds after it
        was asked for, or the workflow could not be pickled).  A plan is never held up for
        long by what is only a report: a workflow whose imports take longer than its
        profiling run and that wait has no figure for them."""
        if self._seconds is None:
            got = self._child.cpu_s(LOADCOST_WAIT_S) if self._child is not None else 0.0
            self._child = None
            self._seconds = got if math.isfinite(got) else 0.0
            self.close()
        return self._seconds

    def close(self) -> None:
        """Stop the child if it still runs and remove the pickle's folder."""
        if self._child is not None:
            self._child.stop()
            self._child = None
        if self._folder is not None:
            self._folder.close()
            self._folder = None


def start(wf) -> LoadCost:
    """Pickle ``wf`` as a run stores it and start the child that loads it."""
    from subzero.storage.pickles import FILE, save_workflow
    held = scratch("loadcost")
    if not save_workflow(wf, held.path):
        held.close()
        return LoadCost(None, None)
    child = Child(_CODE, str(held.path / FILE), stderr=False)
    return LoadCost(child, held)
