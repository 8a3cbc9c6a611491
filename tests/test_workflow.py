"""Workflow model: building, validation errors, loading modules."""

import numpy as np
import pytest
from conftest import Ident

import subzero
from subzero import Operator, Workflow, WorkflowError, load_workflow


class Add(Operator):
    def run(self, ctx, a, b):
        return a + b


def test_build_and_order():
    wf = Workflow("w")
    a = wf.input("a")
    b = wf.input("b")
    x = wf.add("x", Ident(), a)
    wf.add("y", Add(), x, b)
    assert wf.order() == ["x", "y"]
    assert wf.consumers("a") == [("x", 0)]
    assert wf.consumers("x") == [("y", 0)]


def test_forward_reference_by_name_is_allowed():
    wf = Workflow("w")
    wf.input("a")
    wf.add("y", Ident(), "x")
    wf.add("x", Ident(), "a")
    assert wf.order() == ["x", "y"]


def test_duplicate_name():
    wf = Workflow("w")
    a = wf.input("a")
    wf.add("x", Ident(), a)
    with pytest.raises(WorkflowError, match="duplicate name 'x'"):
        wf.add("x", Ident(), a)
    with pytest.raises(WorkflowError, match="duplicate name 'a'"):
        wf.input("a")


def test_unknown_input():
    wf = Workflow("w")
    wf.input("a")
    wf.add("x", Ident(), "nope")
    with pytest.raises(WorkflowError, match="unknown input 'nope'"):
        wf.validate()


def test_wrong_arity():
    wf = Workflow("w")
    a = wf.input("a")
    with pytest.raises(WorkflowError, match="takes 2 inputs, got 1"):
        wf.add("y", Add(), a)


def test_cycle():
    wf = Workflow("w")
    wf.input("a")
    wf.add("x", Add(), "a", "y")
    wf.add("y", Ident(), "x")
    with pytest.raises(WorkflowError, match="cycle through x, y"):
        wf.validate()


def test_not_an_operator():
    wf = Workflow("w")
    a = wf.input("a")
    with pytest.raises(WorkflowError, match="needs an Operator instance"):
        wf.add("x", np.sum, a)


def test_load_from_path_and_module(tmp_path, monkeypatch):
    p = tmp_path / "mywf.py"
    p.write_text("from subzero import Workflow, Operator\n"
                 "class I(Operator):\n    def run(self, ctx, x):\n        return x\n"
                 "def workflow(k=1):\n    wf = Workflow('mine')\n    a = wf.input('a')\n"
                 "    wf.add('i', I(), a)\n    wf.k = k\n    return wf\n")
    wf = load_workflow(p, {"k": 3})
    assert wf.name == "mine" and wf.k == 3 and wf.source == str(p.resolve())
    monkeypatch.syspath_prepend(str(tmp_path))
    wf2 = load_workflow("mywf")
    assert wf2.name == "mine"


@pytest.mark.parametrize("text,msg", [
    (None, "workflow file not found"),
    ("x = 1\n", "does not define workflow()"),
    ("def workflow(:\n", "syntax error at line 1"),
    ("import nonexistent_pkg_zz\n", "failed to import: ModuleNotFoundError"),
    ("def workflow():\n    return 3\n", "returned int, not a Workflow"),
    ("def workflow():\n    raise RuntimeError('boom')\n", "raised RuntimeError: boom"),
])
def test_bad_modules(tmp_path, text, msg):
    p = tmp_path / "bad.py"
    if text is not None:
        p.write_text(text)
    with pytest.raises(WorkflowError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        load_workflow(p)


def test_unknown_module_name():
    with pytest.raises(WorkflowError, match="neither a file nor an importable module"):
        load_workflow("no_such_module_zz")


def test_pure_blackbox_operator_is_all_to_all():
    assert Add().is_all_to_all(0) and Add().is_all_to_all(1)
    assert not Ident().is_all_to_all(0)
    assert subzero.Mode.MAP in Ident().supported_modes()


# -- workflow code that ends the process or leaves threads behind (issue 28) -----------------
HOSTILE = {
    "exit at import": ("import sys\nsys.exit(0)\n", r"called sys.exit\(0\) while it was imported"),
    "interrupt at import": ("raise KeyboardInterrupt('no')\n",
                            r"raised KeyboardInterrupt: no while it was imported"),
    "exit in workflow()": ("import sys\ndef workflow():\n    sys.exit('bye')\n",
                           r"workflow\(\) of .* called sys.exit\('bye'\); it must return a Workflow"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_workflow_module_that_ends_the_process_is_a_workflow_error(tmp_path, monkeypatch, case):
    text, msg = HOSTILE[case]
    name = "hostile_" + case.replace(" ", "_").replace("()", "")
    (tmp_path / f"{name}.py").write_text(text)
    with pytest.raises(WorkflowError, match=msg):
        load_workflow(str(tmp_path / f"{name}.py"))
    monkeypatch.syspath_prepend(str(tmp_path))          # by module name, too
    with pytest.raises(WorkflowError, match=msg):
        load_workflow(name)


def test_sys_exit_at_import_is_one_line_and_no_run(tmp_path, shell):
    """`subzero run --json` of such a module exited 0 with no output and no run."""
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n")
    code, out, err = shell("run", "quits.py", "--json", "--store", "s", cwd=tmp_path)
    assert code == 2 and out == ""
    assert err.strip() == (f"subzero: error: workflow file {tmp_path / 'quits.py'} called "
                           f"sys.exit(0) while it was imported; a workflow module defines "
                           f"workflow() and must not end the process")
    assert subzero.open_store(tmp_path / "s").runs() == []


SPIN = """
import threading, time
import subzero
from subzero.operators import MeanFilter

threading.Thread(target=time.sleep, args=(3600,), name="spin").start()   # never joined

def workflow():
    wf = subzero.Workflow("spins")
    wf.add("smooth", MeanFilter(3), wf.input("x", default="x.npy"))
    return wf
"""


def test_a_thread_left_running_by_workflow_code_does_not_keep_the_cli_alive(tmp_path):
    """Before, `subzero run` never ended: Python waits for every non-daemon thread."""
    import subprocess

    from conftest import subzero_exe
    np.save(tmp_path / "x.npy", np.arange(20.0).reshape(4, 5))
    (tmp_path / "spins.py").write_text(SPIN)
    p = subprocess.run([subzero_exe(), "run", "spins.py", "--json", "--store", "s"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert subzero.open_store(tmp_path / "s").runs()[-1].status == "complete"
    assert '"run_id": 1' in p.stdout
    assert p.stderr.strip() == ("subzero: warning: code run by this command left thread(s) "
                                "running: 'spin'; exiting without waiting for them")
