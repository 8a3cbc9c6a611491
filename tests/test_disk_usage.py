"""Where a store's bytes go (issue 32, part 1): ``Store.disk_usage`` and ``subzero du``
count every file once however many hard links it has (a re-run's unchanged chunks, the
inputs stored once), so the store's total is what the disk holds, and a run's bytes
split into those it owns alone (what removing it frees) and those it shares."""

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

from subzero import Workflow
from subzero.operators import Add, MeanFilter, Sub

SHAPE = (40, 36)
TILE = 8


def small():
    wf = Workflow("small")
    x, y = wf.input("x"), wf.input("y")
    a = wf.add("smooth", MeanFilter(3), x)
    b = wf.add("minus", Sub(), a, y)
    wf.add("plus", Add(), b, y)
    return wf


def on_disk(root: Path) -> int:
    """What the disk holds under ``root``: every file and folder once, by inode, at its
    apparent size (what ``du -sb`` counts), links never followed."""
    seen, total = set(), 0
    for folder, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            st = os.lstat(os.path.join(folder, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


@pytest.fixture
def runs(store):
    """A run and a re-run of it that changed one cell: the re-run hard-links the
    parent's unchanged chunks, and both read the input ``y`` from the store's copy."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(0, 1, SHAPE), rng.normal(0, 1, SHAPE)
    parent = store.run(small(), inputs={"x": x, "y": y}, tile=TILE, progress=False, keep="all")
    new = x.copy()
    new[0, 0] += 1
    re = store.rerun(parent.id, {"x": new}, progress=False)
    return store, parent, re


def test_every_file_is_counted_once_and_the_total_is_what_the_disk_holds(runs):
    store, parent, re = runs
    du = store.disk_usage()
    assert du.total == on_disk(store.path)
    if shutil.which("du"):          # and what coreutils says, where it is installed
        out = subprocess.run(["du", "-sb", str(store.path)], capture_output=True, text=True)
        assert du.total == int(out.stdout.split()[0])
    # the parts add up to the total: what each owns alone, and hard-linked files once
    alone = sum(r.total.own for r in du.runs) + du.inputs.own + du.catalog.own + du.other.own
    assert alone + du.shared == du.total
    a, b = du.runs
    assert (a.run, b.run) == (parent.id, re.id)
    # the re-run's unchanged chunks are the parent's files: shared by both, once in the total
    assert 0 < b.kinds["arrays"].shared == a.kinds["arrays"].shared
    assert b.arrays["smooth"].shared > 0 and b.arrays["smooth"].own > 0   # one chunk changed
    assert du.shared >= a.total.shared
    assert a.total.bytes + b.total.bytes > du.total - du.inputs.bytes - du.catalog.bytes
    # both read y from the store's copy; the re-run's new x is stored once too
    assert set(a.inputs) == {"x", "y"} and a.inputs["y"] == b.inputs["y"] > 0
    assert a.kinds["pickles"].bytes == (parent.dir / "workflow.pkl").stat().st_size
    assert a.kinds["lineage"].bytes > 0 and a.status == "complete" and a.workflow == "small"


def test_a_run_owns_alone_exactly_what_removing_it_frees(runs):
    store, parent, re = runs
    before = store.disk_usage()
    mine = store.run_usage(re.id)                 # its folder alone: the same answer
    assert mine.total == before.runs[1].total and mine.arrays == before.runs[1].arrays
    shutil.rmtree(re.dir)
    assert on_disk(store.path) == before.total - mine.total.own
    assert store.disk_usage().runs[0].total.shared == 0     # the parent's files are its own now


def test_one_run_is_listed_array_by_array(runs):
    store, parent, re = runs
    du = store.disk_usage(re.id)
    assert [r.run for r in du.runs] == [re.id] and du.total == on_disk(store.path)
    assert set(du.runs[0].arrays) == {"x", "y", "smooth", "minus", "plus"}
    assert du.runs[0].arrays["y"].bytes < 1024      # a reference: the copy is the store's


def test_du_on_the_command_line(runs, cli):
    store, parent, re = runs
    path = store.path
    code, out, err = cli("du", "--store", path)
    assert code == 0 and err == "", err
    assert f"store {path}:" in out and "inputs stored once" in out and "hard-linked" in out
    assert any(line.split()[:3] == [str(re.id), "complete", "small"] for line in out.splitlines())
    code, out, err = cli("du", "--store", path, "--json")
    assert code == 0 and json.loads(out)["total"] == on_disk(path)
    code, out, err = cli("du", "--store", path, "--run", str(re.id))
    assert code == 0 and out.startswith(f"run {re.id} (small, complete)")
    assert "array smooth" in out and "pickles (workflow.pkl)" in out and "inputs read" in out
    assert cli("du", str(re.id), "--store", path)[1] == out        # RUN, as `show` takes it
    for args in (("--run", "99"), ("1", "--run", "2")):
        code, out, err = cli("du", "--store", path, *args)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert err.startswith("subzero: error: ")
    code, out, err = cli("du", "--store", path.parent / "nothing")
    assert code == 2 and "no SubZero store" in err


def test_run_and_show_print_the_whole_footprint(tmp_path, cli):
    from conftest import EXAMPLE
    code, out, err = cli("run", EXAMPLE, "--store", tmp_path / "s", "--engine", "local")
    assert code == 0, err
    line = out.splitlines()[0]
    assert line.startswith("run 1 complete: workflow example") and " on disk: arrays " in line
    assert "lineage " in line and "pickles " in line and "stored once" in line
    code, out, err = cli("show", "1", "--store", tmp_path / "s")
    assert code == 0 and " on disk: arrays " in out and "subzero du --run 1" in out


def test_du_reads_only(runs):
    """Nothing in the store changes (modes and times of every file included)."""
    store, parent, re = runs
    def state():
        return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns, stat.S_IMODE(p.lstat().st_mode))
                for p in sorted(store.path.rglob("*")) if not p.name.startswith("catalog.sqlite")}
    before = state()
    store.disk_usage()
    store.run_usage(parent.id)
    assert state() == before
