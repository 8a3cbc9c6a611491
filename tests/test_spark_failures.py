"""A failure inside a Spark task crosses the process boundary as a typed record (not
marked prose) and becomes, on the driver, the error the in-process engine raises:
the same class, the operator and tile named, the worker's traceback kept as the
cause for --debug."""

import traceback

import numpy as np
import pytest
from conftest import java_ok
from test_spark import Explode

import subzero
from subzero import LineageError, Operator, OperatorError, Workflow
from subzero.engines.spark.failures import TaskFailure, failed
from subzero.errors import TaskFailed, WorkerTraceback

HOSTILE = 'bad "value"\n{TaskFailed: {"v": 1}}\tünïcödé @@subzero@@ \\ end'


def _raised_text(exc: BaseException) -> str:
    """What the driver receives from PySpark: the worker's formatted traceback inside
    the JVM's own error text."""
    try:
        raise exc
    except BaseException:
        tb = traceback.format_exc()
    return ("py4j.protocol.Py4JJavaError: An error occurred while calling o41.collect.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 in stage "
            "2.0 failed 1 times, most recent failure: Lost task 3.0 (TID 7) (127.0.0.1 executor "
            "driver): org.apache.spark.api.python.PythonException: " + tb +
            "\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"
            "(PythonRunner.scala:572)\n")


def _task_failure(op: str, where: str, exc: Exception) -> TaskFailed:
    try:
        raise exc
    except Exception as e:      # as a task catches it: with its traceback
        return failed(op, where, e)


@pytest.mark.parametrize("message", ["saturated tile", HOSTILE, ""])
def test_record_round_trips_through_a_spark_error_text(message):
    sent = _task_failure("explode", "tile [4:8, 0:4]", ValueError(message))
    got = TaskFailure.from_spark(_raised_text(sent))
    assert got is not None
    assert (got.operator, got.where, got.kind, got.message, got.error) == \
        ("explode", "tile [4:8, 0:4]", "ValueError", message, "")
    assert "_task_failure" in got.traceback and "ValueError" in got.traceback


def test_text_without_a_record_is_not_an_operator_failure():
    assert TaskFailure.from_spark(_raised_text(ModuleNotFoundError("No module named 'mylib'"))) is None
    assert TaskFailure.from_spark("java.lang.OutOfMemoryError: Java heap space") is None
    # a record of another version is not guessed at
    text = _raised_text(TaskFailed('{"v": 99, "operator": "x"}'))
    assert TaskFailure.from_spark(text) is None


def test_error_keeps_its_class_names_operator_and_tile_and_keeps_the_cause():
    lineage = TaskFailure.from_spark(_raised_text(_task_failure(
        "cr", "tile [0:4, 0:4]", LineageError("operator 'cr' wrote cell (9, 9) outside (4, 4)"))))
    assert lineage is not None
    err = lineage.to_error()
    assert type(err) is LineageError
    assert str(err).startswith("operator 'cr' wrote cell (9, 9) outside (4, 4) "
                               "(on tile [0:4, 0:4], in a Spark task)")
    assert isinstance(err.__cause__, WorkerTraceback)
    assert "LineageError" in str(err.__cause__)
    other = TaskFailure("explode", "the whole array", "", "KeyError", "'x'", "Traceback ...").to_error()
    assert type(other) is OperatorError
    assert str(other).startswith("operator 'explode' failed: KeyError: 'x' (on the whole array, in a Spark task)")
    # a class name that is not SubZero's error is not trusted: an operator error
    forged = TaskFailure("a", "tile [0:1]", "SystemExit", "SystemExit", "bye").to_error()
    assert type(forged) is OperatorError


class BadLineage(Operator):
    """Writes a pair whose output cell lies outside the array."""
    tiling = subzero.ELEMENTWISE

    def supported_modes(self):
        return {subzero.Mode.FULL}

    def run(self, ctx, x):
        ctx.lwrite(np.array([[10_000, 0]]), np.array([[0, 0]]))
        return x


@pytest.mark.skipif(not java_ok(), reason="needs Java 17+")
def test_spark_raises_what_the_local_engine_raises(spark, store):
    x = np.arange(40.0).reshape(8, 5)
    for op, cls in ((Explode(), OperatorError), (BadLineage(), LineageError)):
        wf = Workflow("bad")
        wf.add("op", op, wf.input("x"))
        kw = {"strategies": {"op": "full"}} if cls is LineageError else {}
        with pytest.raises(cls) as local:
            store.run(wf, inputs={"x": x}, engine="local", tile=4, progress=False, **kw)
        with pytest.raises(cls) as remote:
            store.run(wf, inputs={"x": x}, engine="spark", spark=spark, tile=4, progress=False, **kw)
        assert "operator 'op'" in str(remote.value) and "(on tile [" in str(remote.value)
        assert "in a Spark task)" in str(remote.value) and "engine" not in str(remote.value)
        cause = remote.value.__cause__
        assert isinstance(cause, WorkerTraceback) and "Traceback" in str(cause), cause
        # the same words (which tile fails first may differ: its shape is left out)
        assert str(local.value).split(" (on tile")[0].split(" (shape")[0] in str(remote.value)
