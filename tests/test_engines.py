"""The run transaction, the shared driver loop and run progress: behaviour seen
through the public API (and the reporter a caller hands in)."""

import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import EXAMPLE, Ident

from subzero import Mode, Operator, Workflow
from subzero.engines.progress import Bars, Progress, progress_for
from subzero.errors import OperatorError, QueryError, SubZeroError


class Recorder(Progress):
    """A reporter that keeps what it is told."""

    def __init__(self, tasks: bool = False):
        self.wants_tasks = tasks
        self.events: list[tuple] = []

    def begin(self, total, desc, unit="op"):
        self.events.append(("begin", total, unit))

    def started(self, name):
        self.events.append(("started", name))

    def tiles(self, done, total):
        self.events.append(("tiles", done, total))

    def finished(self, name):
        self.events.append(("finished", name))

    def close(self):
        self.events.append(("close",))


class Boom(Operator):
    def run(self, ctx, x):
        raise ValueError("negative flux")


class Interrupt(Operator):
    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        ctx.lwrite([(0, 0)], [(0, 0)])
        signal.raise_signal(signal.SIGINT)     # a real Ctrl-C (an operator's own `raise
        time.sleep(5)                          # KeyboardInterrupt` is its error: test_spark)


class Copy(Operator):
    """The identity with Full lineage, one pair per cell."""

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        cells = np.argwhere(np.ones(np.shape(x), bool))
        ctx.lwrite(cells, cells, each=True)
        return x


def chain(op, first=None):
    wf = Workflow("w")
    a = wf.input("a")
    b = wf.add("ident", first or Ident(), a)
    wf.add("last", op, b)
    return wf


def leftovers(store):
    return sorted(p.name for p in (store.path / "runs").iterdir())


def test_failed_operator_leaves_no_partial_folder_and_names_the_operator(store):
    x = np.arange(12.0).reshape(3, 4)
    with pytest.raises(OperatorError, match="operator 'last'"):
        store.run(chain(Boom(), Copy()), inputs={"a": x}, strategies={"ident": "full"})
    row = store.runs()[-1]
    assert row.status == "failed" and "operator 'last' (Boom) failed: ValueError: negative flux" in row.error
    assert leftovers(store) == []
    assert store.catalog.ops(row.id) == [] and store.catalog.arrays(row.id) == {}


def _raising_handler(signum, frame):
    """A SIGINT handler in Python that raises KeyboardInterrupt itself, as PySpark's
    (installed by every SparkContext) does."""
    raise KeyboardInterrupt()


@pytest.mark.parametrize("handler", ["python's", "pyspark's"])
def test_keyboard_interrupt_mid_run_is_failed_not_complete(store, handler):
    """A real Ctrl-C (SIGINT) while an operator runs stays a Ctrl-C -- whichever handler
    turns it into KeyboardInterrupt -- and is not taken for the operator's error."""
    x = np.zeros((3, 4))
    good = store.run(chain(Ident()), inputs={"a": x})
    prev = signal.signal(signal.SIGINT, _raising_handler) if handler == "pyspark's" else None
    try:
        with pytest.raises(KeyboardInterrupt):
            store.run(chain(Interrupt()), inputs={"a": x}, strategies={"last": "full"})
    finally:
        if prev is not None:
            signal.signal(signal.SIGINT, prev)
    row = store.runs()[-1]
    assert (row.status, row.error) == ("failed", "interrupted")
    assert leftovers(store) == [str(good.id)]
    with pytest.raises(QueryError, match=f"run {row.id} did not complete"):
        store.get(row.id)
    assert store.get("latest").id == good.id
    assert store.run(chain(Ident()), inputs={"a": x}).id == row.id + 1


def test_profiling_hook_needs_the_local_engine(store):
    with pytest.raises(SubZeroError, match="profiling runs use the local engine"):
        store.run(EXAMPLE, engine="spark", profiler=lambda *a: None)
    assert store.runs() == []


def test_profiler_sees_every_operator_with_its_values(store):
    seen = []

    def profiler(name, op, inputs, out, run_s, captured, arrays):
        seen.append((name, [np.shape(x) for x in inputs], np.shape(out), run_s >= 0,
                     None if captured is None else sorted(m.value for m in captured.modes)))
        assert np.array_equal(arrays.read_value(name), out)      # the run's own, as written

    store.run(chain(Ident(), first=Copy()), inputs={"a": np.zeros((3, 4))}, profiler=profiler,
              strategies={"ident": "full:fullone:backward"})
    assert seen == [("ident", [(3, 4)], (3, 4), True, ["full"]), ("last", [(3, 4)], (3, 4), True, None)]


def test_progress_is_silent_off_a_terminal(store, capfd):
    store.run(EXAMPLE, strategies={"stars": "full"})          # progress=None, stderr not a tty
    store.run(EXAMPLE, progress=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert type(progress_for(None)) is Progress and type(progress_for(False)) is Progress
    assert isinstance(progress_for(True), Bars)


def test_progress_reports_each_operator_in_order(store):
    rec = Recorder()
    run = store.run(EXAMPLE, progress=rec)
    names = [o["name"] for o in run.ops()]
    assert rec.events[0] == ("begin", len(names), "op") and rec.events[-1] == ("close",)
    assert rec.events[1:-1] == [e for n in names for e in (("started", n), ("finished", n))]


def test_progress_reporter_is_closed_when_the_run_fails(store):
    rec = Recorder()
    with pytest.raises(OperatorError):
        store.run(chain(Boom()), inputs={"a": np.zeros(3)}, progress=rec)
    assert rec.events == [("begin", 2, "op"), ("started", "ident"), ("finished", "ident"),
                          ("started", "last"), ("close",)]


def test_forced_progress_draws_bars_on_stderr(store, capfd):
    store.run(EXAMPLE, progress=True)
    out, err = capfd.readouterr()
    assert out == ""
    assert "run 1 (example, local)" in err and ("op/s" in err or "s/op" in err)


def test_bars_show_operators_and_tiles_with_time_left():
    f = io.StringIO()
    bars = Bars(file=f, mininterval=0)
    bars.begin(2, "run 7 (w, spark)")
    bars.started("smooth")
    bars.tiles(3, 12)
    bars.tiles(12, 12)
    bars.finished("smooth")
    bars.close()
    text = f.getvalue()
    assert "run 7 (w, spark)" in text and "smooth" in text
    assert "tiles:  25%" in text and "3/12 [00:00<00:00" in text    # [elapsed<left]
    assert "1/2 [" in text


def test_transaction_left_without_commit_is_failed(store):
    from subzero.runs.transaction import RunTransaction
    wf = chain(Ident())
    with RunTransaction.begin(store.catalog, store.path / "runs", wf, {}, "local") as tx:
        assert tx.folder.is_dir() and tx.folder.name == f"{tx.run_id}.partial"
        assert store.runs()[-1].status == "running"
    row = store.runs()[-1]
    assert row.status == "failed" and "before it was committed" in row.error
    assert leftovers(store) == []


def test_jvm_logs_are_pruned_to_the_newest(tmp_path):
    from subzero.engines.spark.session import jvm_log_dir, jvm_log_path, prune_jvm_logs
    assert os.path.dirname(jvm_log_path()) == str(jvm_log_dir())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    now = time.time()
    logs = []
    for k in range(8):
        p = tmp_path / f"spark-{int(dead) + 100000 * (k + 1)}.log"    # pids of no process
        p.write_text("x")
        os.utime(p, (now - k, now - k))
        logs.append(p)
    mine = tmp_path / f"spark-{os.getpid()}.log"
    mine.write_text("x")
    os.utime(mine, (now - 100, now - 100))
    gone = tmp_path / f"scratch-{int(dead) + 100000}"                  # Spark scratch folders
    (gone / "spark-x" / "pyspark-y").mkdir(parents=True)
    live = tmp_path / f"scratch-{os.getpid()}"
    live.mkdir()
    removed = prune_jvm_logs(tmp_path, keep=3)
    assert set(removed) >= set(logs[3:]) | {gone}
    assert sorted(tmp_path.iterdir()) == sorted(logs[:3] + [mine, live])   # a live process keeps its own
