"""A commit that cannot lose a run: the driver is killed with SIGKILL at every point of
beginning and committing a run (tests/crashpoint.py: the Nth call of a function, no
hook in SubZero), and the store must then get to the complete run -- by resume or
by ``subzero clean`` -- with every array and lineage answer of an uninterrupted
run, never a failed run whose computed work was deleted, never a UNIQUE
constraint error.  On both engines."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, java_ok, subzero_exe
from test_resume import STRATS, assert_same_run, reference

import subzero

#: (function, which call, what the store holds when the process dies there)
COMMIT_POINTS = [
    ("subzero.storage.pickles:save_workflow", 1, "unfinished"),
    ("subzero.runs.record:write", 1, "unfinished"),
    ("subzero.storage.trust:sign_record", 1, "unfinished"),
    ("subzero.runs.transaction:_fsync_dir", 1, "unfinished"),      # signed; not yet renamed
    ("subzero.runs.transaction:_fsync_dir", 2, "committed"),       # renamed; entry not yet synced
    ("subzero.runs.record:insert_rows", 1, "committed"),           # the catalog knows nothing yet
    ("subzero.storage.catalog:Catalog.add_op", 3, "committed"),    # inside the catalog transaction
    ("subzero.runs.transaction:RunTransaction._remove_attempts", 1, "complete"),
]
BEGIN_POINTS = [
    ("subzero.runs.transaction:RunTransaction._taken", 1),         # row inserted, no folder
    ("subzero.runs.journal:Journal.begin", 1),                     # folder made, no journal
]


@pytest.fixture
def wfdir(tmp_path):
    shutil.copy(ROOT / "tests" / "gated_workflow.py", tmp_path / "gatewf.py")
    np.save(tmp_path / "a.npy", np.random.default_rng(1).random((40, 36)))
    return tmp_path


def crash(wfdir, point: str, nth: int, *extra: str) -> subprocess.CompletedProcess:
    args = ["run", "gatewf.py", "--store", "s", "--input", "a=a.npy", "--tile", "16",
            *[x for s in STRATS for x in ("--strategy", s)], *extra]
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "crashpoint.py"), point, str(nth), "--",
                        *args], cwd=wfdir, capture_output=True, text=True, timeout=600,
                       start_new_session=True)
    assert p.returncode == -9, f"the crash point {point}#{nth} was not reached: {p.returncode} {p.stderr}"
    return p


def cli(wfdir, *args):
    p = subprocess.run([subzero_exe(), *map(str, args), "--store", "s"], cwd=wfdir,
                       capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def _check(wfdir, state: str, how: str) -> None:
    st = subzero.open_store(wfdir / "s", create=False)
    row = st.runs()[-1]
    expected = {"unfinished": "interrupted", "committed": "interrupted", "complete": "complete"}
    assert row.status == expected[state], (row.status, row.error)
    if state == "committed":          # the folder is in place: nothing may ever delete it
        assert (wfdir / "s" / "runs" / str(row.id) / "run.json").is_file()
    st.close()
    if state != "complete":
        if how == "resume":
            code, out, err = cli(wfdir, "run", "--resume", row.id)
        else:
            code, out, err = cli(wfdir, "clean")
            if state == "unfinished":             # cleaning removes the unfinished run...
                assert code == 0 and "removed" in out, err
                code, out, err = cli(wfdir, "runs", "--json")
                assert json.loads(out)[-1]["status"] == "failed"
                return                            # ...which lost no computed work: never committed
        assert code == 0, err
        assert "UNIQUE" not in err
    st = subzero.open_store(wfdir / "s", create=False)
    run = st.get(row.id)
    assert_same_run(run, reference(wfdir))
    assert sorted(p.name for p in (wfdir / "s" / "runs").iterdir()) == [str(row.id)]
    code, out, err = cli(wfdir, "clean")
    assert code == 0 and "nothing to clean" in out, out


@pytest.mark.parametrize("point,nth,state", COMMIT_POINTS,
                         ids=[f"{p.split(':')[1]}#{n}" for p, n, _ in COMMIT_POINTS])
def test_a_kill_at_any_point_of_the_commit_loses_nothing(wfdir, tmp_path_factory, point, nth, state):
    """One kill; the store it leaves, copied as it is, is then brought back both ways:
    by resuming the run, and by `subzero clean`."""
    crash(wfdir, point, nth)
    twin = tmp_path_factory.mktemp("twin") / "w"
    shutil.copytree(wfdir, twin, symlinks=True)
    _check(wfdir, state, "resume")
    _check(twin, state, "clean")


@pytest.mark.parametrize("point,nth", BEGIN_POINTS, ids=[p.split(":")[1] for p, _ in BEGIN_POINTS])
def test_a_kill_while_a_run_begins_leaves_a_usable_store(wfdir, point, nth):
    crash(wfdir, point, nth)
    code, out, err = cli(wfdir, "clean")
    assert code == 0, err
    code, out, err = cli(wfdir, "run", "gatewf.py", "--input", "a=a.npy", "--tile", "16",
                         *[x for s in STRATS for x in ("--strategy", s)])
    assert code == 0, err
    st = subzero.open_store(wfdir / "s", create=False)
    assert_same_run(st.get("latest"), reference(wfdir))


@pytest.mark.skipif(not java_ok(), reason="Spark needs Java 17+")
@pytest.mark.parametrize("point,nth,state", [COMMIT_POINTS[3], COMMIT_POINTS[5]],
                         ids=["before-rename", "after-rename"])
def test_spark_kill_at_the_commit_loses_nothing(wfdir, point, nth, state):
    crash(wfdir, point, nth, "--engine", "spark", "--master", "local[2]")
    _check(wfdir, state, "resume")

