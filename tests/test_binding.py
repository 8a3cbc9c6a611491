"""Trust is bound to place (issue 28): a stored byte proves where it belongs, not only
that it is intact.  Real faults, done to the files on disk as people do them (copying
between runs, restoring one run from another's backup, swapping files): a chunk swapped
with another of its array, a chunk copied or linked from another run, a FIFO in a
chunk's place, a whole array folder taken from another run, a run's ``lineage/`` or
``data.mdb`` swapped with another run's, a Spark shard swapped between runs.  Each
gives the exact answer (another method, with a warning naming the piece) or one line
naming it -- never a wrong answer.  The answers compared with are the undamaged run's,
and the two runs differ where it matters (their stars are elsewhere), so a piece of
one read as the other's would answer wrongly."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE, stored_path, unbound_runs
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as hst

import subzero
from subzero.errors import CorruptArray, SubZeroError, SubZeroWarning
from subzero.model import content
from subzero.model.strategy import parse_one
from subzero.storage import metadata
from subzero.storage.arrays import ArrayStore
from subzero.storage.chunks import sums_file
from subzero.workflows.example import synthetic_sky

#: the other run's sky: the same workflow on other data (stars moved)
OTHER_SKY = np.roll(synthetic_sky(), (5, -7), axis=(0, 1))
#: traces whose answers differ between the two runs (checked by the pair fixtures)
QUERIES = [("stars", [(40, 70)], "raw"), ("stars", [(12, 20), (50, 15)], "clean"),
           ("raw", [(40, 70)], "stars"), ("stars", [(45, 63)], "calib")]


@contextlib.contextmanager
def within(seconds: float):
    """Fail instead of hanging: a read blocked on a FIFO is interrupted after ``seconds``."""
    def alarm(*_):
        raise TimeoutError(f"still blocked after {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def make_pair(root: Path, **run_args) -> tuple[Path, int, int]:
    """Two runs of the example workflow in one store: ``a`` on the default sky, ``b``
    on :data:`OTHER_SKY`.  Every array kept (the tests move and damage intermediate
    chunks)."""
    run_args.setdefault("keep", "all")
    st = subzero.open_store(root)
    try:
        a = st.run(EXAMPLE, tile=32, progress=False, **run_args)
        b = st.run(EXAMPLE, tile=32, progress=False, inputs={"raw": OTHER_SKY}, **run_args)
        return root, a.id, b.id
    finally:
        st.close()


def answers(root: Path, run_id: int) -> list[np.ndarray]:
    st = subzero.open_store(root)
    try:
        run = st.get(run_id)
        return [run.trace(s, c, to=t, record=False).bitmap for s, c, t in QUERIES]
    finally:
        st.close()


@pytest.fixture(scope="module")
def local_pair(tmp_path_factory):
    root, a, b = make_pair(tmp_path_factory.mktemp("bind") / "store", engine="local")
    want, other = answers(root, a), answers(root, b)
    assert all(not np.array_equal(x, y) for x, y in zip(want, other))   # a swap would show
    return root, a, b, want, other


@pytest.fixture
def pair(local_pair, tmp_path):
    """A fresh copy of the two runs' store to damage."""
    root, a, b, want, _ = local_pair
    shutil.copytree(root, tmp_path / "store", symlinks=True)
    st = subzero.open_store(tmp_path / "store")
    yield st, st.get(a), st.get(b), want
    st.close()


def reopened(st, run_id):
    """The run as a new process would see it (nothing cached)."""
    return subzero.open_store(st.path).get(run_id)


def exact_or_one_line(run, want: list[np.ndarray], names: str | None = None,
                      read_values: bool = True) -> list[str]:
    """Every query answers exactly (its values too) or stops with one line naming
    ``names`` (a file or folder); returns the warnings given (one line each)."""
    said = []
    for (s, c, t), w in zip(QUERIES, want):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            try:
                got = run.trace(s, c, to=t, record=False)
                assert np.array_equal(got.bitmap, w), (s, c, t)
                if read_values:
                    np.asarray(got.values)
            except SubZeroError as e:
                msg = str(e)
                assert "\n" not in msg, msg
                assert names is None or names in msg, msg
        said += [str(r.message) for r in rec if issubclass(r.category, SubZeroWarning)]
    assert all("\n" not in m for m in said)
    return said


def chunk(run, array: str, key: str = "c/1/2") -> Path:
    return stored_path(run.dir, array) / "data" / key


# -- chunks ---------------------------------------------------------------------------------
def test_chunks_are_bound_to_their_run_array_and_position(pair):
    st, a, _, want = pair
    store_uid = st.catalog.meta("store_uid")
    for name in a.array_names():
        side = sums_file(stored_path(a.dir, name)).read_text()
        if name in a.row.inputs:        # the store's copy: bound to the store and the content
            assert f'"run": "{store_uid}"' in side and '"owner": "store"' in side
            assert f'"array": "input {st.input_digests(a.id)[name]}' in side
        else:
            assert f'"run": "{a.row.uid}"' in side and f'"array": "{name}"' in side
        assert '"chunks": {' in side and '"format": 2' in side
    digests = ArrayStore(a.dir, run_uid=a.row.uid).sidecar_digests()
    assert sorted(digests) == sorted(a.array_names())
    assert all(len(d) == 64 for d in digests.values())
    assert exact_or_one_line(a, want) == []            # undamaged: exact, nothing said


@pytest.mark.parametrize("array", ["raw", "clean", "stars"])
def test_two_chunks_of_an_array_swapped(pair, array):
    st, a, _, want = pair
    x, y = chunk(a, array, "c/0/0"), chunk(a, array, "c/1/2")
    tmp = x.with_name("swap")
    x.rename(tmp)
    y.rename(x)
    tmp.rename(y)
    run = reopened(st, a.id)
    with pytest.raises(CorruptArray) as e:
        run.array(array)
    msg = str(e.value)
    assert msg.startswith(f"array {array!r} of run {a.id}: chunk file ") and "\n" not in msg
    assert "is not the chunk its place names" in msg and str(x) in msg
    exact_or_one_line(run, want, f"{stored_path(a.dir, array).name}/data/c/")


@pytest.mark.parametrize("array", ["raw", "calib", "clean", "stars"])
def test_a_chunk_copied_from_another_run(pair, array):
    st, a, b, want = pair
    shutil.copyfile(chunk(b, array), chunk(a, array))
    run = reopened(st, a.id)
    with pytest.raises(CorruptArray, match=rf"array {array!r} of run {a.id}: chunk file "
                                           rf".*\.zarr/data/c/1/2 is not the chunk its "
                                           rf"place names"):
        run.read_region(array, (slice(32, 64), slice(64, 96)))
    np.testing.assert_array_equal(run.read_region(array, (slice(0, 32), slice(0, 32))),
                                  a.read_region(array, (slice(0, 32), slice(0, 32))))
    exact_or_one_line(run, want, f"{stored_path(a.dir, array).name}/data/c/1/2")


def test_re_execution_blames_the_chunk_not_the_operator(tmp_path):
    """The issue's case: stars re-executed over a clean chunk from another run used to say
    "operator 'stars' is not deterministic"; now the chunk is named."""
    root = tmp_path / "store"
    _, a, b = make_pair(root, strategies={"stars": "blackbox"})
    st = subzero.open_store(root)
    ra, rb = st.get(a), st.get(b)
    want = ra.trace("stars", [(40, 70)], to="clean", record=False).bitmap
    shutil.copyfile(chunk(rb, "clean"), chunk(ra, "clean"))
    run = reopened(st, a)
    with pytest.raises(CorruptArray) as e:
        got = run.trace("stars", [(40, 70)], to="clean", record=False)
        assert np.array_equal(got.bitmap, want)
    assert "not deterministic" not in str(e.value)
    assert "clean.zarr/data/c/1/2 is not the chunk its place names" in str(e.value)
    st.close()


def test_a_chunk_linked_to_another_runs(pair):
    st, a, b, want = pair
    target = chunk(b, "raw")
    target_bytes = target.read_bytes()
    chunk(a, "raw").unlink()
    chunk(a, "raw").symlink_to(target)
    run = reopened(st, a.id)
    with pytest.raises(CorruptArray, match=r"array 'raw' of run \d+: chunk file .*\.zarr/data/"
                                           r"c/1/2 is a link, not the chunk its place names"):
        run.array("raw")
    exact_or_one_line(run, want, ".zarr/data/c/1/2")
    assert target.read_bytes() == target_bytes          # read through nothing, touched nothing


def test_a_link_to_a_copy_of_the_same_chunk_is_refused_too(pair):
    """A link is never the chunk its place names, even to identical bytes."""
    st, a, _, _ = pair
    copy = a.dir.parent / "elsewhere"
    shutil.copyfile(chunk(a, "raw"), copy)
    chunk(a, "raw").unlink()
    chunk(a, "raw").symlink_to(copy)
    with pytest.raises(CorruptArray, match="is a link, not the chunk its place names"):
        reopened(st, a.id).array("raw")


def test_a_fifo_in_a_chunks_place_does_not_block(pair):
    st, a, _, want = pair
    chunk(a, "raw").unlink()
    os.mkfifo(chunk(a, "raw"))
    run = reopened(st, a.id)
    with within(20):
        with pytest.raises(CorruptArray, match=r"\.zarr/data/c/1/2 is not a regular file"):
            run.array("raw")
        exact_or_one_line(run, want, ".zarr/data/c/1/2")


@pytest.mark.parametrize("array", ["raw", "stars"])
def test_a_whole_array_folder_from_another_run(pair, array):
    st, a, b, want = pair
    dst = stored_path(a.dir, array)
    shutil.rmtree(dst)
    shutil.copytree(stored_path(b.dir, array), dst)
    shutil.copyfile(sums_file(stored_path(b.dir, array)), sums_file(dst))
    run = reopened(st, a.id)
    with pytest.raises(CorruptArray) as e:
        run.array(array)
    msg = str(e.value)
    if array in a.row.inputs:          # the store's copy of another content in its place
        said = f"array {array!r} of run {a.id} is not the array its place names"
        assert said in msg and "is not the array its place names" in msg and "\n" not in msg
        assert f"is of array 'input {st.input_digests(b.id)[array]}" in msg
    else:
        said = f"array {array!r} of run {a.id} belongs to another run"
        assert said in msg and "\n" not in msg
        assert f"names run uid {b.row.uid}" in msg and f"{array}.sums.json" in msg
    exact_or_one_line(run, want, said)


def test_an_array_folder_from_another_run_without_its_sidecar(pair):
    """The metadata files of both runs' arrays are alike; the chunks are not."""
    st, a, b, want = pair
    dst = stored_path(a.dir, "raw")
    shutil.rmtree(dst)
    shutil.copytree(stored_path(b.dir, "raw"), dst)
    run = reopened(st, a.id)
    with pytest.raises(CorruptArray, match=r"\.zarr/data/c/0/0 is not the chunk its place names"):
        run.array("raw")
    exact_or_one_line(run, want, ".zarr/data/c/")


def test_an_array_renamed_into_another_arrays_place(pair):
    st, a, _, _ = pair
    arrays = a.dir / "arrays"
    shutil.rmtree(arrays / "calib.zarr")
    shutil.copytree(arrays / "smooth.zarr", arrays / "calib.zarr")
    shutil.copyfile(arrays / "smooth.sums.json", arrays / "calib.sums.json")
    with pytest.raises(CorruptArray, match=r"array 'calib' of run \d+ is not the array its place "
                                           r"names: .* is of array 'smooth'"):
        reopened(st, a.id).array("calib")


def test_an_edited_manifest_fails_its_own_digest(pair):
    st, a, _, _ = pair
    side = sums_file(stored_path(a.dir, "raw"))
    text = side.read_text()
    i = text.index('"chunks": {') + len('"chunks": {')
    j = text.index('"', text.index(':', i)) + 1            # the first hex digit of a manifest
    side.write_text(text[:j] + ("0" if text[j] != "0" else "1") + text[j + 1:])
    with pytest.raises(CorruptArray, match=r"\.sums\.json is unreadable or fails its own digest"):
        reopened(st, a.id).array("raw")


@pytest.mark.parametrize("source", ["another run", "another store"])
def test_a_whole_run_folder_from_elsewhere_is_refused(pair, tmp_path, source):
    """A run's folder replaced by another run's, or by the same run id of another store of
    the same user: its signature verifies (the same key signed it), but over a record of
    another place.  Before, its record's uid bound the run to the other run's arrays and
    lineage, and traces gave the other run's answers (found by the fault campaign)."""
    st, a, b, want = pair
    if source == "another run":
        src = b.dir
    else:
        with subzero.open_store(tmp_path / "other") as other:
            src = other.run(EXAMPLE, tile=32, progress=False, inputs={"raw": OTHER_SKY},
                            keep="all").dir
    st.close()
    shutil.rmtree(a.dir)
    shutil.copytree(src, a.dir)
    run = reopened(st, a.id)
    assert run.store.verdict(run.row).state == "modified"
    for s, c, t in QUERIES:
        with pytest.raises(SubZeroError) as e:
            run.trace(s, c, to=t, record=False)
        msg = str(e.value)
        assert "\n" not in msg and f"run {a.id} cannot be traced: its record names run " in msg
        assert "the run's folder was taken from elsewhere" in msg and "backup" in msg
    found = subzero.fsck(st.path)                 # reported, nothing rewritten from that record
    assert any(f.run == a.id and f.unresolved and "taken from elsewhere" in f.problem
               for f in found), found
    assert not any(f.action == "repaired" for f in found)


# -- lineage ----------------------------------------------------------------------------------
def _swap(x: Path, y: Path) -> None:
    if x == y:               # an input both runs read from the store's one copy
        return
    tmp = x.with_name(x.name + ".swap")
    x.rename(tmp)
    y.rename(x)
    tmp.rename(y)


@pytest.mark.parametrize("what", ["lineage", "lineage/data.mdb"])
def test_lineage_swapped_between_two_runs_of_a_workflow(pair, what):
    st, a, b, want = pair
    st.close()
    _swap(a.dir / what, b.dir / what)
    run = reopened(st, a.id)
    said = exact_or_one_line(run, want)
    assert said and all("belongs to another run" in m and f"names run uid {b.row.uid}" in m
                        and "answering this step another way" in m for m in said), said
    assert any("operator 'stars'" in m for m in said)
    other = reopened(st, b.id)
    want_b = [x.bitmap for x in (other.trace(s, c, to=t, record=False, prefer="reexec")
                                 for s, c, t in QUERIES)]
    assert exact_or_one_line(other, want_b)


def test_lineage_of_a_run_with_a_uid_in_a_run_without_one(pair, tmp_path, monkeypatch):
    """Bound lineage copied into a run made before uids belongs to another run, and
    unbound lineage copied into a run with a uid cannot prove it is the run's."""
    st, a, _, want = pair
    unbound_runs(monkeypatch)
    old = st.run(EXAMPLE, tile=32, progress=False, inputs={"raw": OTHER_SKY}, keep="all")
    monkeypatch.undo()
    assert old.row.uid is None
    want_old = answers(st.path, old.id)
    st.close()
    _swap(a.dir / "lineage", old.dir / "lineage")
    said = exact_or_one_line(reopened(st, a.id), want)
    assert said and all("is not bound to this run" in m for m in said), said
    said = exact_or_one_line(reopened(st, old.id), want_old)
    assert said and all("belongs to another run" in m and "this run has no uid" in m
                        for m in said), said


def test_older_subzero_sees_a_newer_format_not_damage(pair, monkeypatch):
    """The record of bound lineage is sealed as format 3 sealed it: a SubZero that reads up
    to format 4 sees a newer format and says to upgrade."""
    st, a, _, want = pair
    monkeypatch.setattr(metadata, "FORMAT_VERSION", 4)
    said = exact_or_one_line(reopened(st, a.id), want)
    assert said and all("newer SubZero (lineage format 5; this one reads up to 4)" in m
                        and "upgrade" in m for m in said), said


def test_an_unbound_record_in_a_bound_run_is_not_trusted_by_its_seal():
    s = metadata.StrategyMeta.new(parse_one("full"), (3,), [(3,)])
    uid, other = "ab" * 16, "cd" * 16
    bound = metadata.StrategyMeta.from_bytes(s.bound(uid).to_bytes(b"db"), db=b"db")
    assert bound.run == uid and bound.version == metadata.BOUND_FORMAT
    bound.check_bound(uid, "lineage")
    with pytest.raises(SubZeroError, match=f"belongs to another run: its record names run uid {uid}"):
        bound.check_bound(other, "lineage")
    with pytest.raises(SubZeroError, match="belongs to another run.*this run has no uid"):
        bound.check_bound(None, "lineage")
    with pytest.raises(SubZeroError, match="is not bound to this run"):
        s.in_format(3).check_bound(uid, "lineage")
    s.in_format(3).check_bound(None, "lineage")
    with pytest.raises(SubZeroError, match="malformed metadata .run None in format 5"):
        metadata.StrategyMeta.from_json({**s.bound(uid).to_json(), "run": None})
    with pytest.raises(SubZeroError, match="malformed metadata .run 'x' in format 5"):
        metadata.StrategyMeta.from_json({**s.bound(uid).to_json(), "run": "x"})
    with pytest.raises(SubZeroError, match="malformed metadata .run '.*' in format 3"):
        metadata.StrategyMeta.from_json({**s.in_format(3).to_json(), "run": uid})


# -- a run made before runs had uids ----------------------------------------------------------
def test_a_run_made_before_uids_reads_as_before(store, monkeypatch):
    unbound_runs(monkeypatch)
    old = store.run(EXAMPLE, tile=32, progress=False, keep="all")
    monkeypatch.undo()
    assert old.row.uid is None
    side = sums_file(stored_path(old.dir, "raw")).read_text()
    assert '"run"' not in side and '"chunks"' not in side and '"format": 1' in side
    new = store.run(EXAMPLE, tile=32, progress=False, keep="all")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s, c, t in QUERIES:
            got = old.trace(s, c, to=t, record=False)
            assert np.array_equal(got.bitmap, new.trace(s, c, to=t, record=False).bitmap)
            assert any(st.method.startswith("stored:") for st in got.steps)
    np.testing.assert_array_equal(old.array("stars").values, new.array("stars").values)
    # its arrays and lineage are unbound: taken into a run with a uid, they are not its own
    shutil.copytree(stored_path(old.dir, "raw"), stored_path(new.dir, "raw"),
                    dirs_exist_ok=True)
    shutil.copyfile(sums_file(stored_path(old.dir, "raw")),
                    sums_file(stored_path(new.dir, "raw")))
    with pytest.raises(CorruptArray, match=r"array 'raw' of run \d+ .*is not bound to this store .*"
                                           r"names no run"):
        reopened(store, new.id).array("raw")


# -- Spark ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spark_pair(spark, tmp_path_factory):
    root, a, b = make_pair(tmp_path_factory.mktemp("bind-spark") / "store", engine="spark",
                           spark=spark)
    want, other = answers(root, a), answers(root, b)
    assert all(not np.array_equal(x, y) for x, y in zip(want, other))
    return root, a, b, want


@pytest.fixture
def spair(spark_pair, tmp_path):
    root, a, b, want = spark_pair
    shutil.copytree(root, tmp_path / "store", symlinks=True)
    st = subzero.open_store(tmp_path / "store")
    yield st, st.get(a), st.get(b), want
    st.close()


def _shards(run, op: str) -> list[Path]:
    return sorted((run.dir / "lineage" / "shards").glob(f"{op}*/*.szs"))


def test_spark_writes_bound_arrays_and_shards(spair):
    st, a, b, want = spair
    assert _shards(a, "stars") and _shards(a, "clean")
    side = sums_file(stored_path(a.dir, "smooth")).read_text()      # written by the tasks
    assert f'"run": "{a.row.uid}"' in side and '"chunks": {' in side
    assert exact_or_one_line(a, want) == []
    # inputs by content (issue 29): the same digests as the values the run read
    assert st.input_digests(b.id)["raw"] == content.digest(OTHER_SKY)
    assert st.runs_using(synthetic_sky()) == [(a.id, "raw")]
    imp = st.impact(OTHER_SKY, [(45, 63)], to="stars")        # Spark's lineage, as traced alone
    assert np.array_equal(imp.runs[0].targets[0].cells,
                          b.trace("raw", [(45, 63)], to="stars", record=False).cells)


@pytest.mark.parametrize("op", ["stars", "clean"])
def test_spark_shard_swapped_between_runs(spair, op):
    st, a, b, want = spair
    mine, theirs = _shards(a, op), _shards(b, op)
    assert [p.name for p in mine] == [p.name for p in theirs]
    shutil.copyfile(theirs[0], mine[0])
    said = exact_or_one_line(reopened(st, a.id), want)
    assert any(f"operator {op!r}" in m and f"shard {mine[0].relative_to(a.dir / 'lineage')}" in m
               and "belongs to another run" in m for m in said), said


@pytest.mark.parametrize("array", ["raw", "smooth", "stars"])
def test_spark_chunk_copied_from_another_run(spair, array):
    st, a, b, want = spair
    shutil.copyfile(chunk(b, array), chunk(a, array))
    run = reopened(st, a.id)
    with pytest.raises(CorruptArray, match=r"\.zarr/data/c/1/2 is not the chunk its place "
                                           r"names"):
        run.array(array)
    exact_or_one_line(run, want, f"{stored_path(a.dir, array).name}/data/c/1/2")


def test_spark_lineage_swapped_between_runs(spair):
    st, a, b, want = spair
    st.close()
    _swap(a.dir / "lineage", b.dir / "lineage")
    said = exact_or_one_line(reopened(st, a.id), want)
    assert said and all("belongs to another run" in m for m in said), said


# -- property: random swaps between two runs never change an answer silently -----------------
ARRAYS = ("raw", "flat", "calib", "smooth", "clean", "stars")
KEYS = tuple(f"c/{i}/{j}" for i in range(2) for j in range(3))      # 64x96 in 32x32 tiles

fault = hst.one_of(
    hst.tuples(hst.just("chunk between runs"), hst.sampled_from(ARRAYS), hst.sampled_from(KEYS)),
    hst.tuples(hst.just("chunks within a run"), hst.sampled_from(ARRAYS),
               hst.lists(hst.sampled_from(KEYS), min_size=2, max_size=2, unique=True)),
    hst.tuples(hst.just("chunk linked to the other run's"), hst.sampled_from(ARRAYS),
               hst.sampled_from(KEYS)),
    hst.tuples(hst.just("array folder between runs"), hst.sampled_from(ARRAYS), hst.booleans()),
    hst.tuples(hst.just("lineage between runs"), hst.sampled_from(["lineage", "lineage/data.mdb"]),
               hst.just(None)))


def _apply(kind: str, what, where, a: Path, b: Path) -> None:
    if kind == "chunk between runs":
        _swap(stored_path(a, what) / "data" / where, stored_path(b, what) / "data" / where)
    elif kind == "chunks within a run":
        x, y = (stored_path(a, what) / "data" / k for k in where)
        _swap(x, y)
    elif kind == "chunk linked to the other run's":
        p = stored_path(a, what) / "data" / where
        if p.is_symlink() or not p.exists():
            return
        p.unlink()
        p.symlink_to(stored_path(b, what) / "data" / where)
    elif kind == "array folder between runs":
        _swap(stored_path(a, what), stored_path(b, what))
        if where:               # with its sidecar
            _swap(sums_file(stored_path(a, what)), sums_file(stored_path(b, what)))
    else:
        _swap(a / what, b / what)


@settings(max_examples=40, deadline=None, derandomize=True, database=None, print_blob=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(faults=hst.lists(hst.tuples(fault, hst.booleans()), min_size=1, max_size=3))
def test_random_swaps_between_two_runs_never_change_an_answer_silently(local_pair, faults):
    """Hypothesis swaps chunk files (between the runs, within one, linked), array folders
    (with or without their sidecars) and lineage folders or files between two runs of one
    workflow on different data; each run then answers every query exactly (its values
    too) or refuses in one line -- never the other run's answer."""
    root, a, b, want, want_b = local_pair
    with tempfile.TemporaryDirectory(prefix="subzero-bind-") as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(root, copy, symlinks=True)
        runs = copy / "runs"
        for (kind, what, where), flip in faults:
            x, y = (runs / str(b), runs / str(a)) if flip else (runs / str(a), runs / str(b))
            _apply(kind, what, where, x, y)
            event(kind)
        for rid, w in ((a, want), (b, want_b)):
            st = subzero.open_store(copy)
            try:
                said = exact_or_one_line(st.get(rid), w)
                event("warned" if said else "silent")
            finally:
                st.close()
