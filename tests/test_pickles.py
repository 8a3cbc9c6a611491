"""Runs saved before SubZero had one import namespace keep their operators: their
``workflow.pkl`` names ``operators.*``, ``subzero.workflow``... and still loads."""

import pickle

import cloudpickle
import numpy as np
import pytest

import subzero
from subzero.operators import Add, MeanFilter
from subzero.storage.pickles import FILE, load_workflow_pickle

OLD_NAMES = {b"subzero.operators.elementwise": b"operators.elementwise",
             b"subzero.operators.stencil": b"operators.stencil",
             b"subzero.model.workflow": b"subzero.workflow",
             b"subzero.model.operator": b"subzero.operator"}


def old_layout_pickle(obj) -> bytes:
    """``obj`` pickled as a SubZero of the old layout would have named its modules
    (protocol 0 writes module names as plain text lines, so they can be renamed)."""
    data = cloudpickle.dumps(obj, protocol=0)
    for new, old in OLD_NAMES.items():
        data = data.replace(b"c" + new + b"\n", b"c" + old + b"\n")
    assert b"coperators.elementwise\n" in data and b"csubzero.workflow\n" in data
    return data


def workflow():
    wf = subzero.Workflow("old")
    x = wf.input("x")
    wf.add("smooth", MeanFilter(3), x)
    wf.add("sum", Add(), x, "smooth")
    return wf


def test_old_module_names_load():
    data = old_layout_pickle(workflow())
    with pytest.raises(ModuleNotFoundError):       # what a plain unpickler does with it
        pickle.loads(data)
    wf = load_workflow_pickle(data)
    assert list(wf.steps) == ["smooth", "sum"]
    assert type(wf.steps["sum"].operator) is Add


def test_old_run_traces_through_its_operators(tmp_path):
    """A run whose workflow.pkl has the old names, and whose source file is gone, still
    answers mapping-function and re-execution steps."""
    store = subzero.open_store(tmp_path / "s")
    run = store.run(workflow(), inputs={"x": np.arange(30.0).reshape(5, 6)},
                    strategies={"smooth": "blackbox", "sum": "map"}, progress=False)
    want = run.trace("sum", [(2, 2)], to="x").cells.tolist()
    (run.dir / FILE).write_bytes(old_layout_pickle(workflow()))
    store.close()
    store = subzero.open_store(tmp_path / "s")
    assert not store.verdict(run.id).trusted     # its pickle is not the one signed
    assert store.trust(run.id) == [run.id]       # as its user would, after a look
    again = store.get(run.id)
    res = again.trace("sum", [(2, 2)], to="x")
    assert res.cells.tolist() == want
    assert {s.method for s in res.steps} >= {"map"} and any(
        s.method.startswith("reexec") for s in res.steps)


def test_names_of_the_spark_engine_before_its_package_load():
    """Objects of the Spark engine's modules, pickled when they were flat modules of
    subzero.engines (or subzero.engines.spark was one module), load from the package."""
    from subzero.engines.spark.stages import Member
    from subzero.engines.spark.tasks import TaskResult, tile_task
    member = Member("m", Add(), ("x",), (), 0, ((2, 2),))
    result = TaskResult((0,), None, None, (2, 2), "float64", 0.0, 0.0)
    data = cloudpickle.dumps([member, result, tile_task], protocol=0)
    for new, old in ((b"subzero.engines.spark.stages", b"subzero.engines.stages"),
                     (b"subzero.engines.spark.tasks\nTaskResult", b"subzero.engines.spark\nTaskResult"),
                     (b"subzero.engines.spark.tasks\ntile_task", b"subzero.engines.spark\n_tile_task")):
        assert new in data, new
        data = data.replace(new, old)
    with pytest.raises((ModuleNotFoundError, AttributeError)):
        pickle.loads(data)
    got = load_workflow_pickle(data)
    assert type(got[0]) is Member and got[0].name == "m" and type(got[0].op) is Add
    assert got[1] == result and got[2] is tile_task
