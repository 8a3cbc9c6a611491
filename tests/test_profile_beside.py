"""Pricing beside the run: a profiling run's candidate strategies are priced in forked
children while the run goes on (``Profiler._beside``).  The profile must be the one the
run's own process would make -- the same strategies, bytes, spaces and sample sizes for
every operator -- whatever a child does: fails, dies, or is still running when the run
fails.  Timings differ from run to run and are not compared."""

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import subzero
from subzero.forked import cores
from subzero.model.strategy import parse_one
from subzero.optimizer import profile as profmod
from subzero.optimizer.profile import Profiler, _Job, _sample_rows, profile_workflow
from subzero.optimizer.sampleread import Unread
from subzero.storage.encodings import REC_PAIRS

GENOMICS = str(Path(__file__).resolve().parents[1] / "workflows" / "genomics.py")

needs_two_cores = pytest.mark.skipif(cores() < 2 or not hasattr(os, "fork"),
                                     reason="pricing beside the run needs two cores and fork")


@pytest.fixture(autouse=True)
def a_child_each(monkeypatch):
    """These cases' pairs are small: a child each all the same (none shares one)."""
    monkeypatch.setattr(profmod, "PROFILE_BATCH_BYTES", 0)


def _profile(path: Path, beside: bool) -> dict:
    store = subzero.open_store(path)
    try:
        return profile_workflow(store, GENOMICS, params={"replicate": 1}, progress=False,
                                beside=beside)["ops"]
    finally:
        store.close()


def _deterministic(ops: dict) -> dict:
    """What a profile says that does not depend on timing."""
    out = {}
    for name, rec in ops.items():
        out[name] = {
            "modes": {m: {k: v for k, v in i.items() if k not in ("run_s", "gen_s")}
                      for m, i in rec["modes"].items()},
            "strategies": {s: {k: v[k] for k in ("bytes", "spaces", "exact", "sample_frac")
                               if k in v} | {"reads": [(r["backward"], r["cells_in"],
                                                        r["cells_out"])
                                                       for r in (v["sample"] or {}).get("reads", [])]}
                           for s, v in rec["strategies"].items()}}
    return out


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return _deterministic(_profile(tmp_path_factory.mktemp("inproc") / "s", beside=False))


def _spy_forks(monkeypatch) -> list:
    forks = []
    real = Profiler._fork

    def fork(self, jobs):
        child = real(self, jobs)
        forks.append(child is not None)
        return child
    monkeypatch.setattr(Profiler, "_fork", fork)
    return forks


@needs_two_cores
def test_priced_beside_the_run_is_the_same_profile(tmp_path, monkeypatch, in_process):
    forks = _spy_forks(monkeypatch)
    got = _deterministic(_profile(tmp_path / "s", beside=True))
    assert forks and all(forks)                 # children priced while the run went on
    # a child a job; the run's own process priced the rest once the run had ended
    assert len(forks) <= sum(len(r["strategies"]) for r in got.values())
    assert got == in_process
    assert any(r["strategies"] for r in got.values())
    for r in got.values():                      # in the candidates' order, as in the run
        assert list(r["strategies"]) == [str(c) for m in profmod.LWRITE_MODES
                                         for c in profmod.candidates(m)
                                         if str(c) in r["strategies"]]


@needs_two_cores
def test_small_jobs_sharing_children_make_the_same_profile(tmp_path, monkeypatch, in_process):
    """At the default ``PROFILE_BATCH_BYTES`` genomics 1x's jobs are small: children
    take several each, and the profile is still the run's own."""
    monkeypatch.setattr(profmod, "PROFILE_BATCH_BYTES", 2**20)
    forks = _spy_forks(monkeypatch)
    got = _deterministic(_profile(tmp_path / "s", beside=True))
    assert forks and all(forks)
    assert len(forks) < sum(len(r["strategies"]) for r in got.values())
    assert got == in_process


@needs_two_cores
@pytest.mark.parametrize("batch", [0, 2**20])
@pytest.mark.parametrize("how", ["raises", "dies"])
def test_a_failed_child_is_priced_again_by_the_run(tmp_path, monkeypatch, in_process, how,
                                                    batch):
    monkeypatch.setattr(profmod, "PROFILE_BATCH_BYTES", batch)
    parent = os.getpid()
    real = Profiler._price

    def price(self, job):
        if os.getpid() != parent:               # in a child only
            if how == "raises":
                raise MemoryError("injected")
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, job)
    monkeypatch.setattr(Profiler, "_price", price)
    forks = _spy_forks(monkeypatch)
    got = _deterministic(_profile(tmp_path / "s", beside=True))
    assert forks and all(forks)
    assert got == in_process


def _job(tmp_path, shape=(20, 30)) -> _Job:
    from subzero.capture.runner import run_operator
    from subzero.model.modes import Mode
    from subzero.model.strategy import Direction, Strategy
    from tests.test_profile_cost import Cellwise
    op = Cellwise()
    _out, full, _pay, _ctx = run_operator("op", op, [np.zeros(shape)],
                                          (Strategy(Mode.FULL, "fullone", Direction.BACKWARD),))
    rec = {"modes": {"full": {}}, "strategies": {}}
    return _Job("op", op, Mode.FULL, full, Strategy(Mode.FULL, "fullmany", Direction.FORWARD),
                shape, [shape], rec)


@needs_two_cores
def test_children_still_pricing_are_stopped_when_the_run_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(Profiler, "_price", lambda self, job: time.sleep(600))
    prof = Profiler(tmp_path / "scratch", beside=True)
    job = _job(tmp_path)
    assert prof._beside(job)
    for _ in range(500):                        # the feeding thread starts the child
        with prof._lock:
            running = list(prof._running)
        if running:
            break
        time.sleep(0.01)
    (pid, _path, _jobs), = running
    prof.close()                                # what profile_workflow does when the run fails
    with pytest.raises(ProcessLookupError):     # killed and reaped: no process left
        os.kill(pid, 0)


@pytest.fixture
def beside(tmp_path):
    """A profiler pricing beside the run, closed after the test."""
    prof = Profiler(tmp_path / "scratch", beside=True)
    yield prof
    prof.close()


@needs_two_cores
def test_a_job_memory_cannot_hold_twice_is_priced_in_the_run(tmp_path, monkeypatch, beside):
    monkeypatch.setattr(profmod, "PROFILE_BESIDE_MEMORY", 10**15)
    forks = _spy_forks(monkeypatch)
    job = _job(tmp_path)
    assert beside._beside(job)                  # queued, then priced here
    beside.finish()
    assert forks == [] and not beside._running
    assert list(job.rec["strategies"]) == ["full:fullmany:forward"]


def test_sample_rows_are_the_union_of_their_runs():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(REC_PAIRS, 40 * REC_PAIRS))
        size = int(rng.choice([rng.integers(1, REC_PAIRS), rng.integers(1, 2 * n)]))
        runs = max(1, size // REC_PAIRS)
        starts = np.linspace(0, n - REC_PAIRS, runs).astype(np.int64)
        want = np.unique((starts[:, None] + np.arange(REC_PAIRS)[None, :]).ravel())
        got = _sample_rows(n, size)
        assert got.dtype == want.dtype and np.array_equal(got, want)


@needs_two_cores
def test_jobs_left_when_the_run_ends_are_shared_with_the_run_process(tmp_path, monkeypatch,
                                                                      beside):
    """Once the run has ended its process prices queued jobs too, beside the children
    (it would otherwise wait, a core idle, for the child with the most jobs)."""
    real, parent = Profiler._price, os.getpid()

    def price(self, job):
        if os.getpid() != parent:
            time.sleep(0.5)                     # a child's job outlasts several here
        return {k: {**v, "pid": os.getpid()} for k, v in real(self, job).items()}
    monkeypatch.setattr(Profiler, "_price", price)
    jobs = [_job(tmp_path) for _ in range(6)]
    for job in jobs:
        assert beside._beside(job)
    assert _finished(beside)
    pids = [v["pid"] for job in jobs for v in job.rec["strategies"].values()]
    assert len(pids) == 6 and beside.repriced == 0
    assert parent in pids and set(pids) - {parent}


def _queued(prof: Profiler, jobs: list) -> list:
    """The batches ``prof`` would hand its children for ``jobs`` queued at once, one
    child free at a time and then two (``Profiler._batch``), without starting any."""
    prof._queue.extend(jobs)
    got = []
    while prof._queue:
        batch = prof._batch(1 if not got else 2)
        got.append([next(k for k, j in enumerate(jobs) if j is b) for b in batch])
    return got


def test_small_jobs_share_a_child_and_a_large_one_has_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(profmod, "PROFILE_BATCH_BYTES", 2**20)
    prof = Profiler(tmp_path / "scratch", beside=False)
    small, s1, s3 = _job(tmp_path), _job(tmp_path), _job(tmp_path)
    big = _Job(small.name, small.op, small.mode,
               profmod.Pairs(np.arange(2**18), np.arange(2**18 + 1), [np.arange(2**18)],
                             [np.arange(2**18 + 1)]), small.strategy, small.out_shape,
               small.in_shapes, small.rec)
    assert 3 * profmod._job_bytes(small) < 2**20 <= profmod._job_bytes(big)
    # one child free: the small jobs queued together; the large one alone
    assert _queued(prof, [small, s1, big, s3]) == [[0, 1], [2], [3]]
    # the run has ended, two children free: the queue shared between them
    prof._queue.extend([small] * 5)
    assert [len(prof._batch(2)), len(prof._batch(1))] == [3, 2]
    prof.close()


@pytest.mark.parametrize("full_cells", [0, 10**6])
def test_a_payload_job_is_weighed_by_the_cells_it_expands_to(tmp_path, monkeypatch,
                                                             full_cells):
    """A Pay job's pairs are a few bytes whatever their payloads expand to: it has a
    child of its own when the operator's Full pairs (the cells ``map_p`` expands to) are
    large, and shares one with other small jobs when they are small."""
    from subzero.model.modes import Mode
    from subzero.model.strategy import Direction, Strategy
    monkeypatch.setattr(profmod, "PROFILE_BATCH_BYTES", 2**20)
    prof = Profiler(tmp_path / "scratch", beside=False)
    job = _job(tmp_path)
    pay = profmod.Pairs(np.arange(4), np.arange(5), pay_ids=np.zeros(4, np.int64),
                        payloads=[b"\x00"])
    payjob = _Job(job.name, job.op, Mode.PAY, pay,
                  Strategy(Mode.PAY, "payone", Direction.FORWARD), job.out_shape,
                  job.in_shapes, {"modes": {"full": {"cells": full_cells}}, "strategies": {}})
    assert profmod._pairs_bytes(pay) < 2**10
    want = [[0], [1]] if full_cells else [[0, 1]]
    assert _queued(prof, [job, payjob]) == want
    prof.close()


def _finished(prof: Profiler, seconds: float = 60.0) -> bool:
    """``prof.finish()`` in a thread: whether it returned within ``seconds`` (a stuck
    child would hold it forever; the test then fails, and ``close`` kills the child)."""
    import threading
    t = threading.Thread(target=prof.finish, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


@needs_two_cores
def test_a_child_stuck_on_a_lock_it_inherited_is_killed_and_its_job_priced_here(
        tmp_path, monkeypatch, beside):
    """A child forked while another thread of the run held a lock (an operator's own
    code importing a module, say) waits on it forever: the run's end must not."""
    import threading
    monkeypatch.setattr(profmod, "BESIDE_STALL_S", 1.0)
    held, parent, real = threading.Lock(), os.getpid(), Profiler._price

    def price(self, job):
        if os.getpid() != parent:
            with held:                          # the child's copy is never released
                pass
        return real(self, job)
    monkeypatch.setattr(Profiler, "_price", price)
    forks = _spy_forks(monkeypatch)
    held.acquire()                              # another thread of the run holds it ...
    job = _job(tmp_path)
    assert beside._beside(job)
    for _ in range(500):                        # ... while the child is forked
        if forks:
            break
        time.sleep(0.01)
    held.release()
    assert _finished(beside), "profiling waited forever on a stuck child"
    assert forks == [True] and beside.repriced == 1
    assert list(job.rec["strategies"]) == ["full:fullmany:forward"]


_MID_IMPORT = r'''
import importlib.abc, json, os, sys, threading, time
from pathlib import Path
assert "rtree.index" not in sys.modules
inside, stall = threading.Event(), float(sys.argv[2])

class Slow(importlib.abc.MetaPathFinder):
    """rtree.index takes a while to import: the run's thread is inside its import."""
    def find_spec(self, name, path, target=None):
        if name != "rtree.index":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        real = spec.loader.exec_module
        def exec_module(module):
            inside.set()
            time.sleep(2.0)
            real(module)
        spec.loader.exec_module = exec_module
        return spec

import importlib.util
sys.meta_path.insert(0, Slow())
from subzero.optimizer import profile as profmod
from tests.test_profile_beside import _job
profmod.PROFILE_BATCH_BYTES = 0
profmod.BESIDE_STALL_S = stall
prof = profmod.Profiler(Path(sys.argv[1]) / "scratch", beside=True)
threading.Thread(target=lambda: __import__("rtree.index"), daemon=True).start()
inside.wait(30)
job = _job(None)
prof._beside(job)
while not prof._forks:       # a child takes it (else the run's process would, at its end)
    time.sleep(0.01)
prof.finish()
prof.close()
print(json.dumps({"repriced": prof.repriced, "forks": prof._forks,
                  "strategies": list(job.rec["strategies"])}))
'''


@needs_two_cores
def test_no_child_is_forked_while_the_run_imports_what_it_needs(tmp_path):
    """The child's lazily imported modules (``CHILD_IMPORTS``: rtree) are imported
    before each fork, which waits for an import of them under way in the run's thread;
    forked mid-import, the child would be stuck (and killed after ``BESIDE_STALL_S``)."""
    import json
    import subprocess
    import sys
    script = tmp_path / "mid_import.py"
    script.write_text(_MID_IMPORT)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "1.0"], env=env,
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"repriced": 0, "forks": 1, "strategies": ["full:fullmany:forward"]}


_IMPORTS = r'''
import json, sys
import subzero
from subzero.optimizer import profile as profmod
for m in profmod.CHILD_IMPORTS:
    __import__(m)
new, real = set(), profmod.Profiler._price

def price(self, job):
    before = set(sys.modules)
    try:
        return real(self, job)
    finally:
        new.update(set(sys.modules) - before)
profmod.Profiler._price = price
store = subzero.open_store(sys.argv[1] + "/s")
profmod.profile_workflow(store, sys.argv[2], params={"replicate": 1}, progress=False,
                         beside=False, all_ops=True)
store.close()
print(json.dumps(sorted(new)))
'''


def test_pricing_imports_nothing_beyond_what_is_imported_before_a_fork(tmp_path):
    """What a pricing child imports on first use is in ``CHILD_IMPORTS`` (imported
    before each fork): a lazy import added to the pricing path fails here.  Every
    operator of genomics priced in every mode it supports (Full, Pay, Comp)."""
    import json
    import subprocess
    import sys
    script = tmp_path / "imports.py"
    script.write_text(_IMPORTS)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, str(script), str(tmp_path), GENOMICS], env=env,
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@needs_two_cores
@pytest.mark.parametrize("how", ["priced beside", "children die", "the reading child dies"])
def test_samples_left_unread_read_later_as_they_would_have_been_at_once(tmp_path, monkeypatch,
                                                                       in_process, how):
    """``defer_reads``: only each operator's defaults' samples are read as they are
    written; the others are read after the run from the stores the children left (or
    the run's own, for the jobs of children that died), asked and answering the same,
    half of them in a child of their own (``Unread.read_all``; a sample it did not read,
    because it died, is read by the run's process)."""
    from subzero.model.strategy import default_for
    from subzero.model.workflow import load_workflow
    monkeypatch.setattr(Profiler, "_read_now", lambda self, job: job.read)   # as if the run ended
    if how == "children die":
        parent, real = os.getpid(), Profiler._price

        def price(self, job):
            if os.getpid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, job)
        monkeypatch.setattr(Profiler, "_price", price)
    store = subzero.open_store(tmp_path / "s")
    try:
        got = profile_workflow(store, GENOMICS, params={"replicate": 1}, progress=False,
                               beside=True, defer_reads=True)
    finally:
        store.close()
    unread = got["unread"]
    wf = load_workflow(GENOMICS, {"replicate": 1})
    if how == "the reading child dies":
        parent, real_read = os.getpid(), Unread.read

        def read(self, op, s):
            if os.getpid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_read(self, op, s)
        monkeypatch.setattr(Unread, "read", read)
    try:
        assert unread is not None and len(unread) > 1
        for op, s in unread.pending:
            assert parse_one(s) not in default_for(wf.steps[op].operator)
            rec = got["ops"][op]["strategies"][s]
            assert rec["unread"] is True and rec["sample"] is None
        for (op, s), fields in unread.read_all(sorted(unread.pending)).items():
            assert set(fields) == {"sample"}        # not priced roughly: only read
            got["ops"][op]["strategies"][s]["sample"] = fields["sample"]
        assert not unread.pending
    finally:
        unread.close()
    assert not unread.folder.exists()
    assert _deterministic(got["ops"]) == in_process


def test_a_sample_is_read_as_it_is_written_only_while_the_run_goes_on(tmp_path):
    """Deferred reads: a default's sample is read at once whenever it is priced; another
    strategy's only until the run has ended, in the run's process and in a child, which
    learns it from the file the run makes then."""
    prof = Profiler(tmp_path / "scratch", beside=True, defer_reads=True)
    try:
        default, other = _job(tmp_path), _job(tmp_path)
        default.read, other.read = True, False
        assert prof._read_now(default) and prof._read_now(other)
        prof._ended = False
        prof.beside_dir.mkdir(parents=True)
        (prof.beside_dir / profmod.RUN_ENDED).touch()          # what a child sees
        assert prof._read_now(default) and not prof._read_now(other)
        (prof.beside_dir / profmod.RUN_ENDED).unlink()
        prof.finish()                                          # the run's process
        assert prof._read_now(default) and not prof._read_now(other)
        assert (prof.beside_dir / profmod.RUN_ENDED).exists()
    finally:
        prof.close()


@needs_two_cores
def test_a_rough_price_whose_pricing_child_dies_is_priced_in_the_run_s_process(tmp_path):
    """A plan's rough strategies are priced again half in a forked child
    (``Unread.read_all``); a child that dies leaves its share to the run's process,
    which prices them in full as the child would have: nothing is left rough or lost."""
    from subzero.optimizer.profile import _price_again
    parent = os.getpid()

    def price(folder, name, pending):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return _price_again(folder, name, pending)
    jobs = {name: _job(tmp_path, (50, 100)) for name in ("a", "b")}
    pending = {(name, str(j.strategy)): {"op": j.op, "strategy": j.strategy, "pairs": j.pairs,
                                         "out_shape": j.out_shape, "in_shapes": j.in_shapes,
                                         "cells": None, "sample_pairs": 1024}
               for name, j in jobs.items()}
    want = {k: _price_again(tmp_path / f"want-{k[0]}", k[0], dict(p)) for k, p in pending.items()}
    folder = tmp_path / "unread"
    folder.mkdir()
    unread = Unread(folder, dict(pending), workers=2, price=price)
    try:
        got = unread.read_all(sorted(pending))
        assert not unread.pending and set(got) == set(pending)
        for k, fields in got.items():
            assert fields["sample"]["reads"] and "rough" not in fields
            assert (fields["bytes"], fields["spaces"]) == (want[k]["bytes"], want[k]["spaces"])
    finally:
        unread.close()
    assert not folder.exists()
