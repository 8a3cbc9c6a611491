"""No hidden copies (issue 32, part 4): a run's ``workflow.pkl`` holds code and small
parameters, never input-sized arrays.  An input's array default is the run's input
(stored once, checksummed); any other large array the workflow module builds is left
out and rebuilt from the module when the pickle loads, checked against the digest
the run recorded, so a changed module or data file is a clear error, never another
answer."""

import pickle
from pathlib import Path

import numpy as np
import pytest

import subzero
from subzero.errors import ChangedConstant, WorkflowError
from subzero.model.workflow import KeptInput, load_workflow
from subzero.storage.pickles import FILE, save_workflow

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for p in (ROOT / "workflows").glob("*.py") if p.name != "__init__.py")
#: the bound the issue sets for a shipped workflow's pickle
BOUND = 100 * 1024


@pytest.mark.parametrize("path, params", [(p, {}) for p in SHIPPED]
                         + [(ROOT / "workflows" / "astronomy.py", {"megapixels": 16})],
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_a_shipped_workflows_pickle_holds_no_arrays(tmp_path, path, params):
    """What a run writes for each shipped workflow (loaded from its file, as `subzero
    run` loads it: its module travels by value)."""
    assert SHIPPED and {"astronomy.py", "genomics.py"} <= {p.name for p in SHIPPED}
    wf = load_workflow(path, params)
    assert save_workflow(wf, tmp_path)
    data = (tmp_path / FILE).read_bytes()
    assert len(data) < BOUND, f"{path.name}: workflow.pkl is {len(data)} bytes"
    for name, decl in wf.inputs.items():
        if isinstance(decl.default, np.ndarray):
            assert decl.default.tobytes()[:4096] not in data, name


def test_the_demo_run_keeps_its_calibration_frames_once(tmp_path):
    """The astronomy run's bias, dark and flat (4.1 MB each) are its inputs, stored
    once; its pickle names them by content."""
    store = subzero.open_store(tmp_path / "s")
    run = store.run(ROOT / "workflows" / "astronomy.py", progress=False, engine="local",
                    capture=False)
    assert (run.dir / FILE).stat().st_size < BOUND
    store.close()
    store = subzero.open_store(tmp_path / "s")
    wf = store.get(run.id).workflow
    digests = store.input_digests(run.id)
    for name in ("bias", "dark", "flat"):
        kept = wf.inputs[name].default
        assert isinstance(kept, KeptInput) and kept.used and kept.digest == digests[name]
        with pytest.raises(WorkflowError, match=rf"input '{name}'.*run.array\('{name}'\)"):
            wf.resolve_default(name)
    store.close()


MODULE = '''
from pathlib import Path

import numpy as np

from subzero import Workflow
from subzero.operators import MeanFilter, Unary

TABLE = np.load(Path(__file__).with_name("table.npy"))     # 100x100 float64: 80 KB


def workflow():
    wf = Workflow("tabled")
    x = wf.input("x", default=np.arange(10000.0).reshape(100, 100))
    s = wf.add("shift", Unary(np.add, TABLE), x)
    wf.add("smooth", MeanFilter(3), s)
    return wf
'''


@pytest.fixture
def tabled(tmp_path):
    """A workflow module whose operator holds a table read from a data file beside it,
    and a run of it whose traces re-run that operator."""
    folder = tmp_path / "wf"
    folder.mkdir()
    table = np.random.default_rng(1).normal(0, 1, (100, 100))
    np.save(folder / "table.npy", table)
    (folder / "tabled.py").write_text(MODULE)
    store = subzero.open_store(tmp_path / "s")
    run = store.run(folder / "tabled.py", progress=False, engine="local",
                    strategies={"shift": "blackbox", "smooth": "blackbox"})
    want = run.trace("smooth", [(50, 50)], to="x").cells.tolist()
    data = (run.dir / FILE).read_bytes()
    store.close()
    return tmp_path / "s", folder, table, data, want


def test_a_constant_is_rebuilt_from_the_module_and_answers_the_same(tabled):
    path, folder, table, data, want = tabled
    assert len(data) < BOUND and table.tobytes()[:4096] not in data
    with pytest.raises(ChangedConstant):        # the pickle alone cannot give the table
        from subzero.storage.pickles import load_workflow_pickle
        load_workflow_pickle(data)
    with subzero.open_store(path) as store:     # a new store: the pickle is loaded again
        run = store.get(1)
        assert run.trace("smooth", [(50, 50)], to="x").cells.tolist() == want
        got = run.workflow.steps["shift"].operator.args[0]
        assert np.array_equal(got, table)
        # `subzero trust` says, before anything loads, that the module runs again
        assert store.code_of(run.row)["constants"] == 1


def test_a_changed_data_file_is_a_clear_error_not_another_answer(tabled, cli):
    path, folder, table, data, want = tabled
    changed = table.copy()
    changed[7, 7] += 1e-9
    np.save(folder / "table.npy", changed)
    with subzero.open_store(path) as store:
        with pytest.raises(ChangedConstant, match=r"run 1 used a 100x100 float64 array .* no "
                                                  r"longer builds"):
            store.get(1).trace("smooth", [(50, 50)], to="x")
    code, out, err = cli("trace", "--store", path, "--from", "smooth", "--cells", "50,50",
                         "--to", "x")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "no longer builds" in err and "run 1" in err
    # the module put back as it was: the run answers again
    np.save(folder / "table.npy", table)
    with subzero.open_store(path) as store:
        assert store.get(1).trace("smooth", [(50, 50)], to="x").cells.tolist() == want


def test_a_workflow_built_in_python_keeps_its_constants(tmp_path):
    """It has no module to rebuild them from: they stay inside, and it loads alone."""
    from subzero.operators import Unary
    table = np.ones((100, 100))
    wf = subzero.Workflow("inline")
    wf.add("shift", Unary(np.add, table), wf.input("x"))
    assert save_workflow(wf, tmp_path)
    got = pickle.loads((tmp_path / FILE).read_bytes())
    assert np.array_equal(got.steps["shift"].operator.args[0], table)
