"""Driver side of the Spark engine: running a job, following its tasks, and
turning its failure into one clear error.

Every Spark action SubZero starts goes through :func:`run_job` (or
:func:`collect`): Ctrl-C cancels the job cleanly instead of letting Py4J print
screenfuls (:class:`_CtrlC`), a thread reports finished tasks to the progress
bar (:class:`_TaskWatch`), and a failure becomes the error the in-process
engine would raise (:func:`raise_from_spark`).
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from subzero.engines.spark.failures import TaskFailure, python_error
from subzero.engines.spark.session import jvm_log_hint
from subzero.errors import OperatorError, SparkError
from subzero.tuning import PROGRESS_POLL_S

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext


def raise_from_spark(e: Exception, name: str) -> NoReturn:
    """Raise the error a failed Spark job stands for: an operator's own failure (the
    task's :class:`TaskFailure` record) as the in-process engine would raise it; a
    worker's Python error outside an operator (a module it cannot import) as an
    operator error with what to do; anything else as a :class:`SparkError` naming
    the operator being run and the JVM's log."""
    text = str(e)
    failure = TaskFailure.from_spark(text)
    if failure is not None:
        raise failure.to_error()
    err = python_error(text)
    if err:
        hint = ""
        if err.startswith(("ModuleNotFoundError", "ImportError")):   # the driver has it
            hint = ("; the Spark workers cannot import it: install it where they run or put its "
                    "folder on PYTHONPATH before starting SubZero (`engine='local'` runs it in "
                    "this process, which can)")
        raise OperatorError(f"operator {name!r} failed in a Spark task: {err}{hint}") from e
    raise SparkError(f"Spark failed while running operator {name!r}: {_reason(text, e)}; "
                     f"try `engine='local'`{jvm_log_hint()}") from e


#: ``on_tasks(done, total)``: a job's finished tasks, as they finish
TaskCallback = Callable[[int, int], None]


def collect(rdd: RDD, name: str, on_tasks: TaskCallback | None = None) -> list:
    """Run a job and return its results; an operator failure in a task becomes one
    clear line naming ``name`` (the operator).  ``on_tasks`` is told the job's
    finished tasks while it runs."""
    return run_job(rdd.context, name, rdd.collect, on_tasks)


def run_job(sc: SparkContext, name: str, action: Callable[[], Any], on_tasks: TaskCallback | None = None) -> Any:
    """``action()`` (a Spark action: collect, treeReduce) with :func:`collect`'s errors."""
    with _CtrlC(sc) as ctrl_c:
        try:
            if on_tasks is None:
                out = action()
            else:
                with _TaskWatch(sc, on_tasks):
                    out = action()
        except Exception as e:
            if ctrl_c.hit:
                raise KeyboardInterrupt from e
            raise_from_spark(e, name)
    if ctrl_c.hit:          # the job ended before the cancellation reached it
        raise KeyboardInterrupt
    return out


class _CtrlC:
    """While a job runs, Ctrl-C cancels Spark's jobs from another thread and the job's
    failure becomes a KeyboardInterrupt (one line from the CLI; the run is failed
    'interrupted').  PySpark's own handler calls into Py4J from the signal handler,
    while the main thread is blocked in a Py4J call: Py4J then prints screenfuls of
    tracebacks.  A second Ctrl-C interrupts at once.  Only the main thread can
    handle signals; elsewhere this does nothing."""

    def __init__(self, sc: SparkContext):
        self.sc = sc
        self.hit = False
        self._installed = False
        self._prev: Any = None

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._prev = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True
        threading.Thread(target=self._cancel, name="subzero-cancel", daemon=True).start()

    def _cancel(self) -> None:
        try:
            self.sc.cancelAllJobs()
        except Exception:
            pass            # the JVM is going away anyway

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._prev if self._prev is not None else signal.SIG_DFL)


class _TaskWatch:
    """Follows the tasks of the jobs this thread starts (one job group) from a thread
    that polls Spark's status tracker, and tells ``on_tasks``; a failure to poll only
    ends the watching."""

    def __init__(self, sc: SparkContext, on_tasks: TaskCallback, every: float = PROGRESS_POLL_S):
        self.sc, self.on_tasks, self.every = sc, on_tasks, every
        self.group = f"subzero-{uuid.uuid4().hex[:12]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="subzero-progress", daemon=True)

    def __enter__(self) -> _TaskWatch:
        self.sc.setJobGroup(self.group, "subzero")
        self.thread.start()
        return self

    def _poll(self) -> None:
        try:
            while not self.stop.wait(self.every):
                self._report()
        except Exception:
            return

    def _report(self) -> None:
        tracker = self.sc.statusTracker()
        done = total = 0
        for jid in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(jid)
            for sid in (job.stageIds if job is not None else ()):
                st = tracker.getStageInfo(sid)
                if st is not None:
                    done += st.numCompletedTasks
                    total += st.numTasks
        if total:
            self.on_tasks(min(done, total), total)

    def __exit__(self, et: type[BaseException] | None, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        try:
            if et is None:
                self._report()
        finally:
            for key in ("spark.jobGroup.id", "spark.job.description"):
                # pyspark annotates the value str, but documents None as removing the property
                self.sc.setLocalProperty(key, None)  # type: ignore[arg-type]


def _reason(text: str, e: Exception) -> str:
    """The informative line of a Py4J error: Spark's stage failure or root cause."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for key in ("Job aborted due to stage failure", "Caused by:", "Exception:"):
        for ln in lines:
            if key in ln and "Py4JJavaError" not in ln:
                return ln[:300]
    return (lines[0] if lines else type(e).__name__)[:300]
