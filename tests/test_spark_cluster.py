"""A real Spark standalone cluster: one master and two workers started from the
installed pyspark on 127.0.0.1 (``subzero.engines.spark.standalone.LocalCluster``),
stopped by their PIDs.  The astronomy workflow runs on it from the command line
with a relative store, and gives the in-process engine's arrays and lineage;
a worker killed mid-run changes nothing; a worker without SubZero is one line."""

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, java_ok, subzero_exe
from relations import stored_relation

import subzero

ASTRONOMY = str(ROOT / "workflows" / "astronomy.py")
QUERIES = [("stars", [(1162, 112)], "raw_1"), ("stars", [(1162, 112)], "raw_2"),
           ("raw_1", [(1000, 100), (1500, 300)], "stars"), ("raw_2", [(5, 5)], "rmcr")]

pytestmark = pytest.mark.skipif(not java_ok(), reason="Java 17+ is not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from subzero.engines.spark.standalone import LocalCluster
    c = LocalCluster(workers=2, cores=1, memory="2g", folder=tmp_path_factory.mktemp("cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()
    for p in [c.master, *c.workers]:
        assert p is None
    # stopped by PID: nothing of it is left
    left = subprocess.run(["pgrep", "-f", str(c.folder)], capture_output=True, text=True).stdout
    assert left.strip() == "", left


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The in-process engine's run of the same workflow."""
    st = subzero.open_store(tmp_path_factory.mktemp("ref") / "store")
    run = st.run(ASTRONOMY, engine="local", tile=256)
    yield run
    st.close()


def cli_run(cwd: Path, master: str, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "SUBZERO_ENGINE"}
    return subprocess.Popen([subzero_exe(), "run", ASTRONOMY, "--master", master, "--store",
                             "rel/store", "--tile", "256", "--json", *extra], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def same_as_reference(store_dir: Path, run_id: int, reference) -> None:
    with subzero.open_store(store_dir, create=False) as st:
        run = st.get(run_id)
        assert run.row.engine == "spark"
        assert sorted(run.array_names()) == sorted(reference.array_names())
        for name in reference.array_names():
            x, y = run.array(name).values, reference.array(name).values
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
        for start, cells, to in QUERIES:
            a, b = run.trace(start, cells, to=to, record=False), reference.trace(start, cells, to=to,
                                                                                 record=False)
            assert np.array_equal(a.bitmap, b.bitmap), (start, cells, to)
        assert {o["name"]: o["pairs"] for o in run.ops()} == \
            {o["name"]: o["pairs"] for o in reference.ops()}
        # the same lineage stored: shards written by the executors hold the relation
        # the in-process engine's one store holds, pair for pair
        assert stored_relation(run) == stored_relation(reference)
        assert not list((store_dir / "runs" / str(run_id) / "lineage").rglob("*.a*.szs"))


def test_a_worker_without_subzero_is_one_line(cluster, tmp_path):
    """Executors run tasks with the driver's PYSPARK_PYTHON: here the system's python3,
    which has no SubZero."""
    bare = next((p for p in ("/usr/bin/python3", "/bin/python3") if Path(p).exists()), None)
    if bare is None or subprocess.run([bare, "-c", "import subzero"], capture_output=True).returncode == 0:
        pytest.skip("no Python without SubZero on this machine")
    env = {k: v for k, v in os.environ.items() if k != "SUBZERO_ENGINE"}
    env["PYSPARK_PYTHON"] = bare
    p = subprocess.run([subzero_exe(), "run", str(ROOT / "workflows" / "example.py"), "--master",
                        cluster.master_url, "--store", str(tmp_path / "st")], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot import SubZero" in lines[0] and bare in lines[0], p.stderr
    assert "PYSPARK_PYTHON" in lines[0]


def test_astronomy_with_a_relative_store_and_a_worker_lost(cluster, reference, tmp_path):
    """The real workflow from the command line, with a relative store (resolved once, on
    the driver: executors write into it, not into their own folders); one worker -- its
    JVM and its executors -- is killed mid-run: the run completes on the other, with the
    in-process engine's arrays, lineage and answers."""
    p = cli_run(tmp_path, cluster.master_url)
    arrays = tmp_path / "rel" / "store" / "runs" / "1.partial" / "arrays"
    end = time.monotonic() + 600
    while not (arrays / "rmoverscan_1.zarr").exists():        # the run is under way
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.monotonic() < end
        time.sleep(0.2)
    cluster.kill_worker(0)
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    assert cluster.alive_workers() == 1
    run_id = json.loads(out)["run_id"]
    store = tmp_path / "rel" / "store"
    assert (store / "runs" / str(run_id) / "arrays" / "stars.zarr").is_dir()
    assert not list((store / "runs").glob("*.partial*"))
    assert not list((store / "runs" / str(run_id) / "arrays").glob(".*attempt*"))
    assert not list(cluster.folder.rglob("store"))       # nothing inside the workers' folders
    same_as_reference(store, run_id, reference)
