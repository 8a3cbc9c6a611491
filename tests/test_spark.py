"""The Spark engine: identical arrays and lineage to the local engine for every
strategy, tile boundaries and halos, retry safety, failures, manifests."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE, ROOT
from relations import stored_relation

import subzero
from subzero import Mode, Operator, OperatorError, Workflow
from subzero.engines.spark.session import check_master, java_version, session
from subzero.errors import SparkError, SubZeroWarning
from subzero.operators import MeanFilter, Mul

STRATS = ["full:fullone:backward", "full:fullmany:backward", "full:fullone:forward",
          "full:fullmany:forward", "blackbox"]
QUERIES = [("stars", [(40, 70)], "raw"), ("raw", [(30, 40), (12, 19)], "stars"),
           ("smooth", [(0, 0), (31, 31), (32, 32), (63, 95)], "raw"), ("raw", [(31, 31), (32, 64)], "smooth"),
           ("clean", [(5, 5), (33, 10)], "calib")]


def same_runs(a, b, queries):
    assert stored_relation(a) == stored_relation(b)      # shards hold the one store's pairs
    for name in a.array_names():
        x, y = a.array(name).values, b.array(name).values
        assert x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    for start, cells, to in queries:
        ra, rb = a.trace(start, cells, to=to), b.trace(start, cells, to=to)
        assert np.array_equal(ra.bitmap, rb.bitmap), (start, cells, to, ra.steps, rb.steps)


@pytest.mark.parametrize("strategy", STRATS + ["comp:payone:backward", "comp:paymany:forward"])
def test_example_identical_to_local(spark, store, strategy):
    strat = {"clean": strategy if not strategy.startswith("pay") else "full",
             "stars": strategy.replace("comp", "pay")}
    sp = store.run(EXAMPLE, engine="spark", spark=spark, tile=32, strategies=strat, progress=False)
    lo = store.run(EXAMPLE, strategies=strat)
    same_runs(sp, lo, QUERIES)
    assert sp.row.engine == "spark" and lo.row.engine == "local"
    log = (sp.dir / "run.log").read_text()
    assert "stage of 2 operators (calib, smooth): 6 tile task(s)" in log
    assert "halos accumulated up to 1" in log
    assert "clean: global operator, one task on the whole array" in log


def cube_wf():
    wf = Workflow("cube")
    c = wf.input("cube")
    s = wf.add("smooth", MeanFilter(size=3, mode="reflect"), c)
    wf.add("scaled", Mul(), s, c)
    return wf


def test_3d_tiles_and_halo(spark, store):
    cube = np.random.default_rng(5).normal(size=(7, 9, 5))
    strat = {"smooth": "full:fullmany:backward+full:fullone:forward", "scaled": "full"}
    sp = store.run(cube_wf(), inputs={"cube": cube}, engine="spark", spark=spark, tile=3,
                   strategies=strat, progress=False)
    lo = store.run(cube_wf(), inputs={"cube": cube}, strategies=strat)
    q = [("scaled", [(0, 0, 0), (3, 4, 2), (6, 8, 4)], "cube"), ("cube", [(2, 2, 2), (3, 3, 3)], "scaled")]
    same_runs(sp, lo, q)
    assert "stage of 2 operators (smooth, scaled): 18 tile task(s)" in (sp.dir / "run.log").read_text()
    for s in ("full:fullmany:backward", "full:fullone:forward"):
        a = sp.trace("scaled", [(3, 3, 3)], to="cube", prefer=s)
        assert np.array_equal(a.bitmap, lo.trace("scaled", [(3, 3, 3)], to="cube", prefer=s).bitmap)


class Twice(Operator):
    """Doubles its input, with the identity as its Full lineage."""

    tiling = subzero.ELEMENTWISE

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        cells = np.argwhere(np.ones(np.shape(x), bool))
        if Mode.FULL in ctx.modes:
            ctx.lwrite(cells, cells, each=True)
        return np.asarray(x) * 2


class FailFirstAttempt(Twice):
    """Writes its lineage, then fails on the first attempt of every task."""

    def run(self, ctx, x):
        out = super().run(ctx, x)
        from pyspark import TaskContext
        tc = TaskContext.get()
        if tc is not None and tc.attemptNumber() == 0:
            raise RuntimeError("injected failure of a first attempt")
        return out


def test_retried_attempts_neither_duplicate_nor_lose_lineage(spark, store):
    wf = Workflow("retry")
    wf.add("twice", FailFirstAttempt(), wf.input("x"))
    x = np.arange(40.0).reshape(8, 5)
    run = store.run(wf, inputs={"x": x}, engine="spark", spark=spark, tile=4,
                    strategies={"twice": "full"}, progress=False)
    op = run.ops()[0]
    assert op["pairs"] == x.size                     # each pair exactly once
    np.testing.assert_array_equal(run.array("twice").values, x * 2)
    for c in ([(0, 0)], [(7, 4)], [(3, 2), (4, 3)]):
        assert run.trace("twice", c, to="x").cells.tolist() == sorted(map(list, c))


class Explode(Operator):
    tiling = subzero.ELEMENTWISE

    def run(self, ctx, x):
        if np.asarray(x).max() > 30:
            raise ValueError("saturated tile")
        return x


def test_operator_failure_names_operator_and_tile(spark, store):
    good = store.run(EXAMPLE, engine="spark", spark=spark, progress=False)
    wf = Workflow("bad")
    wf.add("explode", Explode(), wf.input("x"))
    with pytest.raises(OperatorError, match=r"operator 'explode' \(Explode\) failed: ValueError: saturated tile "
                                            r"\(on tile \[4:8, (0:4|4:5)\], in a Spark task\)"):
        store.run(wf, inputs={"x": np.arange(40.0).reshape(8, 5)}, engine="spark", spark=spark,
                  tile=4, progress=False)
    rows = store.runs()
    assert rows[-1].status == "failed" and "explode" in rows[-1].error
    assert store.get(good.id).trace("stars", [(40, 70)], to="raw").bitmap.any()


def test_unreachable_master_fails_fast():
    with pytest.raises(SparkError, match="cannot reach the Spark master spark://127.0.0.1:9"):
        check_master("spark://127.0.0.1:9")


def test_missing_java_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    assert java_version() is None
    with pytest.raises(SparkError, match=r"needs Java.*`engine='local'`"):
        session()


def test_cli_engine_flags(cli, tmp_path, spark):
    st = tmp_path / "st"
    code, out, err = cli("run", EXAMPLE, "--store", st, "--engine", "spark", "--tile", "32", "--json")
    assert code == 0, err
    assert json.loads(out)["run_id"] == 1
    code, out, err = cli("runs", "--store", st, "--json")
    assert json.loads(out)[0]["engine"] == "spark"
    code, out, err = cli("run", EXAMPLE, "--store", st, "--engine", "local", "--master", "local[2]")
    assert code == 2 and err.startswith("subzero: error: --master needs the Spark engine (--engine "
                                        "spark)"), err
    code, out, err = cli("run", EXAMPLE, "--store", st, "--engine", "spark", "--master",
                         "spark://127.0.0.1:9")
    assert code == 2 and "cannot reach the Spark master" in err and len(err.strip().splitlines()) == 1


def test_manifest_instances(spark, store, tmp_path, cli):
    from subzero.workflows.example import flat_field, synthetic_sky
    for k in range(3):
        np.save(tmp_path / f"raw{k}.npy", synthetic_sky(seed=k))
    np.save(tmp_path / "flat.npy", flat_field())
    (tmp_path / "bad.npy").write_bytes(b"not an array")
    manifest = tmp_path / "night.csv"
    manifest.write_text("raw,flat\nraw0.npy,flat.npy\nraw1.npy,flat.npy\nbad.npy,flat.npy\n"
                        "raw2.npy,flat.npy\n")
    from test_engines import Recorder
    rec = Recorder(tasks=True)
    results = store.run_many(EXAMPLE, manifest, strategies={"stars": "full"}, spark=spark,
                             progress=rec)
    assert [r.ok for r in results] == [True, True, False, True]
    assert rec.events[0] == ("begin", 4, "run") and rec.events.count(("finished", "instance")) == 4
    assert "input 'raw'" in results[2].error
    status = {r.id: r.status for r in store.runs()}
    assert [status[r.run_id] for r in results] == ["complete", "complete", "failed", "complete"]
    assert not list((store.path / "runs").glob("*.partial*"))
    assert {r.id: r for r in store.runs()}[results[2].run_id].error.startswith("input 'raw'")
    for r, k in zip([results[0], results[1], results[3]], (0, 1, 2)):
        run = store.get(r.run_id)
        lo = store.run(EXAMPLE, inputs={"raw": synthetic_sky(seed=k), "flat": flat_field()},
                       strategies={"stars": "full"})
        same_runs(run, lo, QUERIES[:2])
        assert [(o["name"], o["pairs"]) for o in run.ops()] == [(o["name"], o["pairs"]) for o in lo.ops()]
        side = (run.dir / "arrays" / "stars.sums.json").read_text()     # bound to its own run
        assert run.row.uid and f'"run": "{run.row.uid}"' in side and '"chunks": {' in side
    code, out, err = cli("run", EXAMPLE, "--store", store.path, "--engine", "spark",
                         "--inputs-from", manifest)
    assert code == 2 and "3 of 4 instances complete" in out
    manifest.write_text("raw,moon\nraw0.npy,x\n")
    code, out, err = cli("run", EXAMPLE, "--store", store.path, "--engine", "spark",
                         "--inputs-from", manifest)
    assert code == 2 and "column 'moon' is not an input" in err


@pytest.mark.parametrize("wf,params", [("astronomy.py", {}), ("genomics.py", {"replicate": 2})])
def test_ready_workflows_identical_on_spark(spark, store, wf, params):
    path = str(ROOT / "workflows" / wf)
    sp = store.run(path, params=params, engine="spark", spark=spark, progress=False)
    lo = store.run(path, params=params)
    from subzero.query.workload import load_workload, run_workload
    queries = load_workload(str(ROOT / "workflows" / wf.replace(".py", "_workload.json")))
    for name in sp.array_names():
        x, y = sp.array(name).values, lo.array(name).values
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    a = run_workload(sp, queries, record=False)
    b = run_workload(lo, queries, record=False)
    for ra, rb in zip(a, b):
        assert np.array_equal(ra["result"].bitmap, rb["result"].bitmap), ra["name"]


def test_reductions_run_as_spark_aggregations(spark, store):
    """A whole-array sum/mean/min/max runs as per-tile partials merged in a tree,
    bit-identical to the local engine (exact sums), with the same lineage."""
    from subzero.operators import Count, Max, Mean, Min, Sum
    x = np.random.default_rng(9).normal(size=(23, 17)) * 1e6
    for Op in (Sum, Mean, Min, Max, Count):
        wf = Workflow("agg")
        wf.add("r", Op(), wf.input("x"))
        for strat in ("map", "full"):
            sp = store.run(wf, inputs={"x": x}, engine="spark", spark=spark, tile=5,
                           strategies={"r": strat}, progress=False)
            lo = store.run(wf, inputs={"x": x}, strategies={"r": strat})
            assert np.array_equal(sp.array("r").values, lo.array("r").values), Op.__name__
            assert "r: aggregation over 20 tile(s)" in (sp.dir / "run.log").read_text()
            for prefer in (None, strat if strat != "map" else "map"):
                a = sp.trace("r", [(0,)], to="x", prefer=prefer, shortcut=False)
                assert a.bitmap.all()
            assert sp.trace("x", [(4, 4)], to="r", shortcut=False).cells.tolist() == [[0]]


def test_disk_budget_is_enforced_on_spark(spark, store, capfd):
    """A plan's disk budget holds on the Spark engine too: lineage that would overflow
    it is dropped operator by operator (never earlier lineage), the run records the
    downgrades, and every query still answers the same."""
    from subzero.query.workload import load_workload, run_workload
    path = str(ROOT / "workflows" / "genomics.py")
    both = "full:fullone:backward+full:fullone:forward"
    strat = {u: both for u in ("extract", "model", "predict")}
    from subzero.runs.keep import reserve
    free = store.run(path, engine="spark", spark=spark, strategies=strat, progress=False)
    arrays = reserve(free._arrays, free.workflow)      # what the run keeps of arrays, set aside
    budget = free.lineage_bytes() // 2
    plan = {"name": "half", "workflow": "genomics", "strategies": strat,
            "max_disk": arrays + budget, "arrays_reserve": arrays,
            "predicted_bytes": {}}          # no predictions: the writes must catch it
    with pytest.warns(SubZeroWarning, match="disk budget"):
        run = store.run(path, engine="spark", spark=spark, plan=plan, progress=False)
    downs = store.catalog.downgrades(run.id)
    assert downs and 0 < run.lineage_bytes() <= budget
    kept = {o["name"]: o["strategies"] for o in run.ops()}
    assert all(d["strategy"] not in kept[d["op"]] for d in downs)
    queries = load_workload(str(ROOT / "workflows" / "genomics_workload.json"))
    for ra, rb in zip(run_workload(run, queries, record=False),
                      run_workload(free, queries, record=False)):
        assert np.array_equal(ra["result"].bitmap, rb["result"].bitmap), ra["name"]


def test_spark_progress_reports_operators_and_tiles(spark, store):
    """On a terminal the user sees operators done and the tiles of the running job;
    a reporter handed in receives the same."""
    from test_engines import Recorder
    rec = Recorder(tasks=True)
    cube = np.random.default_rng(2).normal(size=(7, 9, 5))
    store.run(cube_wf(), inputs={"cube": cube}, engine="spark", spark=spark, tile=3,
              strategies={"smooth": "full"}, progress=rec)
    ev = rec.events
    assert ev[0] == ("begin", 2, "op") and ev[-1] == ("close",)
    # smooth and scaled run as one fused stage: one job, its tiles, then both finish
    assert ev[1] == ("started", "smooth +1 in one job")
    part = ev[2: ev.index(("finished", "smooth"))]
    assert part and all(e[0] == "tiles" and e[2] == 18 for e in part), part
    assert part[-1] == ("tiles", 18, 18)
    done = [e[1] for e in part]
    assert done == sorted(done)
    assert ev[ev.index(("finished", "smooth")) + 1] == ("finished", "scaled")
    # a silent reporter costs no polling thread, and nothing is drawn off a terminal
    quiet = Recorder(tasks=False)
    store.run(cube_wf(), inputs={"cube": cube}, engine="spark", spark=spark, tile=3, progress=quiet)
    assert not [e for e in quiet.events if e[0] == "tiles"]


def test_jvm_start_failure_names_its_log(tmp_path):
    """A JVM that cannot start is one line that points at its log, kept in SubZero's
    log folder (not loose in the temp folder)."""
    code = """
from subzero.engines.spark.session import session
from subzero.errors import SparkError
try:
    session("local[1]", {"spark.driver.memory": "1x"})
except SparkError as e:
    print(e)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    msg = p.stdout.strip()
    assert msg.startswith("could not start Spark (local[1])") and len(msg.splitlines()) == 1, p
    m = re.search(r"\(JVM log: (\S+)\)", msg)
    assert m and os.path.isfile(m.group(1)) and "subzero-spark-logs" in m.group(1)
    assert "the JVM said:" in msg and "heap" in msg.lower()


# -- errors from Spark as one line (issue 11) --------------------------------------------------

class _Server:
    """A local TCP server that is not a Spark master: it answers garbage, hangs up,
    or stays silent."""

    def __init__(self, mode: str):
        import socket
        import threading
        self.mode, self.conns = mode, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if self.mode == "garbage":
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                c.close()
            elif self.mode == "hangup":
                c.close()
            else:
                self.conns.append(c)        # silent: keep it open, say nothing

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("mode,said", [("garbage", "it answered 'HTTP/1.1 400 Bad Request"),
                                       ("hangup", "closed the connection without answering"),
                                       ("silent", "did not answer within 1 s")])
def test_master_that_is_not_spark_fails_fast_with_the_cause(mode, said):
    import time
    srv = _Server(mode)
    try:
        t0 = time.perf_counter()
        with pytest.raises(SparkError, match=re.escape(said)):
            check_master(f"spark://127.0.0.1:{srv.port}", timeout=1.0)
        assert time.perf_counter() - t0 < 10
    finally:
        srv.close()


def test_cli_master_that_is_not_spark(cli, tmp_path):
    """Through the CLI: one line naming the master and what answered, before any JVM."""
    if not java_ok_here():
        pytest.skip("Java 17+ is not installed")
    srv = _Server("garbage")
    try:
        code, _, err = cli("run", EXAMPLE, "--engine", "spark", "--master",
                           f"spark://127.0.0.1:{srv.port}", "--store", tmp_path / "st")
    finally:
        srv.close()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"subzero: error: spark://127.0.0.1:{srv.port} is not a Spark master")


def java_ok_here() -> bool:
    v = java_version()
    return v is not None and v >= 17


HELPER_WF = '''
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import numpy as np
import subzero_helper_only_on_the_driver as helper
from subzero import Workflow, Operator, ELEMENTWISE
class Plus(Operator):
    tiling = ELEMENTWISE
    def run(self, ctx, x):
        return helper.plus_one(x)
def workflow():
    wf = Workflow("helped"); a = wf.input("a", default=np.zeros((8, 8)))
    wf.add("plus", Plus(), a)
    return wf
'''


def test_worker_import_error_is_reported_with_its_type(cli, spark, tmp_path):
    """An operator whose module imports a helper only the driver can find: the Spark
    workers fail to unpickle the task; the error says which module and operator."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "subzero_helper_only_on_the_driver.py").write_text(
        "def plus_one(x):\n    return x + 1\n")
    (tmp_path / "helped.py").write_text(HELPER_WF)
    saved = list(sys.path)
    try:
        code, _, err = cli("run", tmp_path / "helped.py", "--engine", "spark", "--tile", "4",
                           "--store", tmp_path / "st")
    finally:
        sys.path[:] = saved
        sys.modules.pop("subzero_helper_only_on_the_driver", None)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "operator 'plus' failed in a Spark task: ModuleNotFoundError: No module named " \
           "'subzero_helper_only_on_the_driver'" in lines[0]
    assert "An exception was thrown" not in err


SLOW_WF = '''
import time
import numpy as np
from subzero import Workflow, Operator, ELEMENTWISE
class Slow(Operator):
    tiling = ELEMENTWISE
    def run(self, ctx, x):
        time.sleep(1)
        return x
def workflow():
    wf = Workflow("slow"); a = wf.input("a", default=np.zeros((16, 16)))
    wf.add("slow", Slow(), a)
    return wf
'''


def test_ctrl_c_during_a_spark_run_is_one_line_and_marks_the_run(tmp_path):
    """SIGINT to `subzero run` on Spark while its job runs: one line, exit 130, the run
    failed 'interrupted' in the catalog, its folder removed."""
    import signal
    import time

    from conftest import subzero_exe
    if not java_ok_here():
        pytest.skip("Java 17+ is not installed")
    (tmp_path / "slow.py").write_text(SLOW_WF)
    store = tmp_path / "st"
    p = subprocess.Popen([subzero_exe(), "run", "slow.py", "--engine", "spark", "--master",
                          "local[2]", "--tile", "2", "--store", store], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the output array exists once the dtype probe is done: the job starts next
        started = store / "runs" / "1.partial" / "arrays" / "slow.zarr"
        deadline = time.monotonic() + 600
        while not started.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert started.exists(), p.communicate()
        time.sleep(5)                  # 64 tiles of 1 s on 2 cores: still running
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 130 and lines == ["subzero: interrupted"], err
    with subzero.open_store(store) as st:
        row = st.runs()[-1]
        assert (row.status, row.error) == ("failed", "interrupted")
    assert sorted(os.listdir(store / "runs")) == []


def test_spark_scratch_files_stay_in_subzeros_folder(spark, store):
    """Spark's scratch folders go to this process's folder under SubZero's temp folder
    (pruned once the process is gone), not loose in the temp folder."""
    from subzero.engines.spark.session import jvm_log_dir, scratch_dir
    assert spark.conf.get("spark.local.dir") == scratch_dir()
    assert scratch_dir().startswith(str(jvm_log_dir()))
    store.run(EXAMPLE, engine="spark", spark=spark, progress=False)
    assert any(p.name.startswith(("spark-", "blockmgr-")) for p in Path(scratch_dir()).iterdir())


def test_the_local_driver_jvm_compiles_with_the_quick_jit_only(spark):
    """A local session's JVM (driver and executor at once) runs with the quick JIT only:
    its optimizing compiler cost more CPU than it saved (session.LOCAL_JIT). Asked of the
    running JVM itself, not of the configuration handed to it."""
    from subzero.engines.spark.session import LOCAL_JIT
    args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory
                .getRuntimeMXBean().getInputArguments())
    assert LOCAL_JIT in args
    assert spark.sparkContext._jvm.java.lang.System.getProperty("java.vm.name")  # a real JVM


def _planted_log_folder(tmp_path):
    """A shared temp folder where someone planted ``subzero-spark-logs-<uid>`` as a link
    to a folder of decoys: old-looking Spark logs and a scratch folder of a dead process
    (what pruning removes from SubZero's own folder)."""
    tmp, victim = tmp_path / "tmp", tmp_path / "victim"
    tmp.mkdir()
    (victim / "scratch-999999999" / "keep").mkdir(parents=True)
    for k in range(9):
        (victim / f"spark-{999999900 + k}.log").write_text("decoy")
    (tmp / f"subzero-spark-logs-{os.getuid()}").symlink_to(victim)
    return tmp, victim


def _decoys(victim):
    return sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))


def test_a_planted_jvm_log_folder_link_is_never_followed(tmp_path, monkeypatch):
    """The fault campaign's case without Spark: the log folder in the shared temp folder
    is a link planted by someone else.  SubZero uses the user's cache folder instead,
    and pruning the planted name deletes nothing where it points."""
    import tempfile

    from subzero.engines.spark.session import jvm_log_dir, prune_jvm_logs, scratch_dir
    tmp, victim = _planted_log_folder(tmp_path)
    before = _decoys(victim)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mine = tmp_path / "cache" / "subzero" / "spark-logs"
    assert prune_jvm_logs(tmp / f"subzero-spark-logs-{os.getuid()}") == []
    assert _decoys(victim) == before
    assert jvm_log_dir() == mine and scratch_dir().startswith(str(mine))
    assert (os.stat(mine).st_mode & 0o777) == 0o700
    (mine / "spark-999999999.log").symlink_to(victim / "spark-999999900.log")
    (mine / "scratch-999999998").symlink_to(victim / "scratch-999999999")
    prune_jvm_logs(mine, keep=0)                     # links inside are not followed either
    assert _decoys(victim) == before
    if os.getuid() == 0:                             # a real folder of another user's
        (tmp / f"subzero-spark-logs-{os.getuid()}").unlink()
        theirs = tmp / f"subzero-spark-logs-{os.getuid()}"
        theirs.mkdir(mode=0o777)
        os.chown(theirs, 65534, 65534)
        assert jvm_log_dir() == mine


@pytest.mark.skipif(java_version() is None or java_version() < 17, reason="Spark needs Java 17+")
def test_a_spark_session_writes_and_prunes_only_its_own_log_folder(tmp_path):
    """End to end: a Spark session started where the log folder is a planted link leaves
    the decoys where the link points alone, and keeps its log in the user's cache."""
    tmp, victim = _planted_log_folder(tmp_path)
    before = _decoys(victim)
    env = {**os.environ, "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = ("from subzero.engines.spark.session import session, jvm_log_path\n"
            "s = session('local[1]'); print(jvm_log_path()); s.stop()")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert _decoys(victim) == before                 # before: 4 logs and the folder deleted
    log = Path(p.stdout.strip().splitlines()[-1])
    assert log.parent == tmp_path / "cache" / "subzero" / "spark-logs" and log.is_file()


class Quits(Operator):
    """An operator whose run() tries to end the process, as the fault campaign's did."""
    tiling = subzero.ELEMENTWISE

    def __init__(self, how):
        self.how = how

    def run(self, ctx, x):
        if self.how == "exit":
            import sys as _sys
            _sys.exit(3)
        raise KeyboardInterrupt


QUITS = """
import sys
import subzero

class Quits(subzero.Operator):
    tiling = subzero.ELEMENTWISE

    def run(self, ctx, x):
        {body}

def workflow():
    wf = subzero.Workflow("quits")
    wf.add("quit", Quits(), wf.input("x", default="x.npy"))
    return wf
"""


@pytest.mark.parametrize("how,said", [("exit", r"called sys.exit\(3\)"),
                                      ("interrupt", "raised KeyboardInterrupt")])
def test_an_operator_that_ends_the_process_is_an_operator_error(spark, store, tmp_path, how, said):
    """sys.exit(3) in run() made `subzero run` exit 3 saying nothing, a KeyboardInterrupt
    it raised said "interrupted": now an OperatorError naming the operator, on both
    engines, from Python and from the command line (a real Ctrl-C stays "interrupted":
    test_engines, test_cli)."""
    wf = Workflow("quits")
    wf.add("quit", Quits(how), wf.input("x"))
    x = np.arange(40.0).reshape(8, 5)
    for engine in ("local", "spark"):
        with pytest.raises(OperatorError, match=rf"operator 'quit' \(Quits\) {said} in run\(\)"):
            store.run(wf, inputs={"x": x}, engine=engine, spark=spark if engine == "spark" else None,
                      tile=4, progress=False)
        row = store.runs()[-1]
        assert row.status == "failed" and "'quit'" in row.error
    np.save(tmp_path / "x.npy", x)
    body = "sys.exit(3)" if how == "exit" else "raise KeyboardInterrupt"
    (tmp_path / "quits.py").write_text(QUITS.format(body=body))
    from conftest import subzero_exe
    p = subprocess.run([subzero_exe(), "run", "quits.py", "--engine", "local", "--store", "s"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert re.fullmatch(rf"subzero: error: operator 'quit' \(Quits\) {said} in run\(\); an "
                        rf"operator returns its output or raises an exception", p.stderr.strip())


class Rendezvous(Operator):
    """Marks that its task started, then waits for the other branch's task to start:
    it can finish only if both branches' jobs run at the same time."""

    tiling = subzero.ELEMENTWISE

    def __init__(self, folder: str, me: str, other: str, fail: bool = False):
        self.folder, self.me, self.other, self.fail = folder, me, other, fail

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        import time
        if Mode.FULL in ctx.modes:
            cells = np.argwhere(np.ones(np.shape(x), bool))
            ctx.lwrite(cells, cells, each=True)
        Path(self.folder, self.me).touch()
        if self.fail:
            raise ValueError("this branch fails")
        end = time.monotonic() + 60
        while not Path(self.folder, self.other).exists():
            if time.monotonic() > end:
                raise TimeoutError(f"{self.other} never started: the branches ran one after the other")
            time.sleep(0.05)
        return np.asarray(x) + 1


def branches(folder, fail: bool = False) -> Workflow:
    wf = Workflow("branches")
    a = wf.add("a", Rendezvous(str(folder), "a", "b", fail), wf.input("x"))
    b = wf.add("b", Rendezvous(str(folder), "b", "a"), wf.input("y"))
    wf.add("after_a", Mul(), a, a)
    wf.add("after_b", Mul(), b, b)
    return wf


def test_independent_branches_run_as_concurrent_jobs(spark, store, tmp_path):
    """Two branches over arrays of different shapes (so no stage fuses them) run as two
    Spark jobs at once: each branch's task waits for the other's to start.  The run's
    record still lists its operators in workflow order, and answers as in-process."""
    x, y = np.arange(12.0).reshape(3, 4), np.arange(10.0).reshape(2, 5)
    wf = branches(tmp_path)
    run = store.run(wf, inputs={"x": x, "y": y}, engine="spark", spark=spark, tile=8,
                    strategies={"a": "full", "b": "full"}, progress=False)
    assert [o["name"] for o in run.ops()] == wf.order()
    np.testing.assert_array_equal(run.array("after_b").values, (y + 1) ** 2)
    assert run.trace("after_a", [(1, 2)], to="x").cells.tolist() == [[1, 2]]


def test_a_failing_branch_stops_the_run_in_one_line(spark, store, tmp_path):
    x, y = np.arange(12.0).reshape(3, 4), np.arange(10.0).reshape(2, 5)
    with pytest.raises(OperatorError, match="operator 'a'.*this branch fails"):
        store.run(branches(tmp_path, fail=True), inputs={"x": x, "y": y}, engine="spark",
                  spark=spark, tile=8, progress=False)
    assert store.runs()[-1].status == "failed"
    assert not list((store.path / "runs").glob("*.partial*"))
