"""Inputs stored once per store (issue 29): a night of runs keeps one copy of each shared
input, bound to the store and its content; every run reads it as it would its own
copy; a kill at any instant of publishing it, a reference or a copy taken from
elsewhere, and cleaning never turn into a wrong answer or a lost run."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import EXAMPLE, ROOT, copied_store, java_ok, subzero_exe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

import subzero
from subzero.errors import CorruptArray
from subzero.model import content
from subzero.storage import shared
from subzero.storage.chunks import sums_file
from subzero.workflows.example import flat_field, synthetic_sky

QUERIES = [("stars", [(40, 70)], "raw"), ("raw", [(10, 10), (33, 50)], "stars"),
           ("flat", [(5, 90)], "stars"), ("clean", [(20, 30)], "flat")]


def skies(n):
    return [np.roll(synthetic_sky(), (3 * k, 5 * k), axis=(0, 1)) for k in range(n)]


def answers(run):
    return [run.trace(s, c, to=t, record=False).bitmap for s, c, t in QUERIES]


def copies(store_path):
    return sorted(p.name for p in (store_path / shared.INPUTS).iterdir() if p.name.endswith(".zarr"))


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """Four runs on four skies sharing one flat (in memory, then .npy), and the same runs
    each alone in a store of its own (nothing to share there)."""
    d = tmp_path_factory.mktemp("shared")
    flat = flat_field()
    np.save(d / "flat.npy", flat)
    alone = []
    with subzero.open_store(d / "store") as st:
        for k, sky in enumerate(skies(4)):
            st.run(EXAMPLE, inputs={"raw": sky, "flat": flat if k % 2 else d / "flat.npy"},
                   tile=32, progress=False)
    for k, sky in enumerate(skies(4)):
        with subzero.open_store(d / f"alone{k}") as st:
            alone.append(answers(st.run(EXAMPLE, inputs={"raw": sky, "flat": flat}, tile=32,
                                        progress=False)))
    return d, flat, alone


@pytest.fixture
def store(night, tmp_path):
    yield from copied_store(night[0] / "store", tmp_path / "store")


def test_a_night_keeps_one_copy_of_its_shared_flat(night, store):
    d, flat, alone = night
    digest = content.digest(flat)
    got = copies(store.path)
    assert len(got) == 5                                     # one flat, four skies
    assert sum(n.startswith(digest.split(":")[1]) for n in got) == 1
    for run in store.runs():
        assert not (store.run_dir(run.id) / "arrays" / "flat.zarr").exists()
        ref = json.loads((store.run_dir(run.id) / "arrays" / "flat.input.json").read_text())
        assert ref["input"] == digest and ref["run"] == run.uid and ref["array"] == "flat"
        r = store.get(run.id)
        np.testing.assert_array_equal(r.array("flat").values, flat)
        assert r.array("flat").dims == ("dim_0", "dim_1")
        rec = json.loads((store.run_dir(run.id) / "run.json").read_text())
        flat_rec = next(a for a in rec["arrays"] if a["name"] == "flat")
        assert flat_rec["shared"] == f"{digest.split(':')[1]}-{ref['form']}"
    e = next(e for e in store.inputs() if e["digest"] == digest)
    assert e["stored"]["copies"] == 1 and e["stored"]["shared"] == 1
    assert e["stored"]["bytes"] < flat.nbytes                  # compressed, once


def test_every_run_answers_as_it_does_alone(night, store):
    _, _, alone = night
    for run, want in zip(store.runs(), alone):
        for g, w in zip(answers(store.get(run.id)), want):
            np.testing.assert_array_equal(g, w)


def test_a_reference_copied_from_another_run_is_refused(store):
    a, b = store.runs()[:2]
    # both read the same flat: a's reference in b's place names run a
    shutil.copyfile(store.run_dir(a.id) / "arrays" / "flat.input.json",
                    store.run_dir(b.id) / "arrays" / "flat.input.json")
    with pytest.raises(CorruptArray, match=rf"array 'flat' of run {b.id}: its reference .* is not "
                                           rf"this run's .*copied from another run"):
        subzero.open_store(store.path).get(b.id).array("flat")


def test_a_reference_resealed_to_another_content_is_refused_by_the_signed_record(store):
    """Someone edits a reference to name another stored input of the same shape (and
    fixes its seal): the run's signed record names its content, so it is refused."""
    a = store.runs()[0]
    f = store.run_dir(a.id) / "arrays" / "flat.input.json"
    other = json.loads((store.run_dir(a.id) / "arrays" / "raw.input.json").read_text())
    body = json.loads(f.read_text())
    body["input"], body["form"] = other["input"], other["form"]
    body["seal"] = shared._seal(body)
    f.write_text(json.dumps(body))
    with pytest.raises(CorruptArray, match=r"its reference .* names content sz1:.*, not the sz1:.* "
                                           r"its run's record names"):
        subzero.open_store(store.path).get(a.id).array("flat")


def test_a_damaged_reference_is_named(store, shell):
    a = store.runs()[0]
    f = store.run_dir(a.id) / "arrays" / "flat.input.json"
    f.write_text(f.read_text().replace('"numpy": true', '"numpy": false'))
    code, out, err = shell("trace", "--store", store.path, "--run", a.id, "--from", "clean",
                           "--cells", "20,30", "--to", "flat")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "flat.input.json is unreadable or fails its own checksum" in err
    with pytest.raises(CorruptArray, match="its reference to the store's copy .* fails its own checksum"):
        subzero.open_store(store.path).get(a.id).array("flat")


def test_the_stores_copy_taken_from_another_store_is_refused(night, store, tmp_path):
    d, flat, _ = night
    with subzero.open_store(tmp_path / "other") as other:
        other.run(EXAMPLE, inputs={"raw": skies(1)[0], "flat": flat}, tile=32, progress=False)
    key = next(n for n in copies(store.path) if n.startswith(content.digest(flat).split(":")[1]))
    mine, theirs = store.path / "inputs" / key, tmp_path / "other" / "inputs" / key
    assert theirs.is_dir()                                   # the same content and form there
    shutil.rmtree(mine)
    shutil.copytree(theirs, mine)
    shutil.copyfile(sums_file(theirs), sums_file(mine))
    with pytest.raises(CorruptArray, match=r"array 'flat' of run 1 belongs to another store: .* names "
                                           r"store uid"):
        subzero.open_store(store.path).get(1).array("flat")


def test_a_missing_copy_is_one_line_and_fsck_names_every_run_that_reads_it(night, store, shell):
    _, flat, _ = night
    key = next(n for n in copies(store.path) if n.startswith(content.digest(flat).split(":")[1]))
    shutil.rmtree(store.path / "inputs" / key)
    code, out, err = shell("trace", "--store", store.path, "--run", 2, "--from", "flat",
                           "--cells", "5,5", "--to", "calib", "--no-shortcut", "--json")
    if code != 0:
        assert code == 2 and len(err.strip().splitlines()) == 1 and "is missing" in err, err
    code, out, err = shell("fsck", "--store", store.path, "--json")
    assert code == 2
    found = json.loads(out)["findings"]
    assert sorted({f["run"] for f in found if "'flat'" in f["problem"]}) == [1, 2, 3, 4], found
    assert all(f["unresolved"] for f in found)


def test_fsck_deep_reads_each_copy_once_and_finds_a_copy_that_lies(night, store):
    _, flat, _ = night
    assert subzero.fsck(store.path, deep=True) == []
    # a copy whose name claims another content: renamed, with its sidecar resealed for the
    # new name -- every chunk intact, only the digest can tell
    from subzero.storage.chunks import bind, seal
    key = next(n for n in copies(store.path) if n.startswith(content.digest(flat).split(":")[1]))
    src = store.path / "inputs" / key
    hexd, form = key.removesuffix(".zarr").rsplit("-", 1)
    fake = "f" * 64
    dst = store.path / "inputs" / f"{fake}-{form}.zarr"
    shutil.copytree(src, dst)
    uid = store.catalog.meta("store_uid")
    seal(dst, shared.owner_name(f"sz1:{fake}", form), uid, owner="store")
    bind(dst, shared.owner_name(f"sz1:{fake}", form), uid, "fake", owner="store")
    run = store.runs()[0]
    f = store.run_dir(run.id) / "arrays" / "flat.input.json"
    body = json.loads(f.read_text())
    body["input"] = f"sz1:{fake}"
    body["seal"] = shared._seal(body)
    f.write_text(json.dumps(body))
    found = subzero.fsck(store.path, deep=True)
    assert any("does not hold that content" in x.problem and x.path == str(dst) for x in found), found


def test_clean_removes_only_copies_no_run_refers_to(night, store, shell):
    d, flat, _ = night
    # a run quarantined keeps its inputs; a copy nobody refers to goes
    orphan = store.path / "inputs" / ("0" * 64 + "-" + "1" * 16 + ".zarr")
    shutil.copytree(store.path / "inputs" / copies(store.path)[0], orphan)
    left = store.path / "inputs" / ".abc.zarr.tmp"
    left.mkdir()
    code, out, err = shell("clean", "--store", store.path, "--dry-run", "--json")
    assert code == 0, err
    said = {x["path"]: x for x in json.loads(out)["removed"]}
    assert set(said) == {str(orphan), str(left)}, said
    assert orphan.exists()
    code, out, err = shell("clean", "--store", store.path)
    assert code == 0 and "an input no run refers to any more" in out, (out, err)
    assert not orphan.exists() and not left.exists()
    assert len(copies(store.path)) == 5
    assert subzero.fsck(store.path, deep=True) == []


def test_clean_removes_nothing_when_a_reference_cannot_be_read(night, store, shell):
    orphan = store.path / "inputs" / ("0" * 64 + "-" + "1" * 16 + ".zarr")
    shutil.copytree(store.path / "inputs" / copies(store.path)[0], orphan)
    (store.run_dir(1) / "arrays" / "raw.input.json").write_text("{")
    code, out, err = shell("clean", "--store", store.path)
    assert code == 0 and orphan.exists()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=hst.lists(hst.integers(1, 40), min_size=0, max_size=3), tile=hst.integers(1, 64),
       kind=hst.sampled_from(["f8", "i4", ">f4", "u1"]))
def test_the_form_of_a_numpy_input_is_that_of_its_stored_copy(tmp_path, shape, tile, kind):
    """A run matches its numpy inputs with the store's copies by form without xarray;
    the form must be the one the stored input has, and the one the DataArray it is
    stored as has (what sharing compared before)."""
    from subzero.storage.arrays import ArrayStore, as_dataarray, form_digest, value_form
    value = np.arange(int(np.prod(shape)), dtype=kind).reshape(shape)
    folder = tmp_path / f"a{len(list(tmp_path.iterdir()))}"
    arrays = ArrayStore(folder, tile=tile)
    arrays.write("x", value)
    form = value_form(value, "x", tile)
    assert form == arrays.form("x")
    da = as_dataarray(value, "x")                 # what the form was worked out from before
    assert not da.attrs and not da.coords
    assert form == form_digest(list(da.dims), {}, {}, True, [min(n, tile) for n in da.shape])


def test_a_run_takes_the_stores_copy_before_it_stores_its_own(tmp_path):
    """A run whose flat is in the store writes a reference, not a copy: killed during
    its first operator, its folder holds the reference only; resumed, it completes."""
    shutil.copy(ROOT / "tests" / "gated_workflow.py", tmp_path / "gatewf.py")
    np.save(tmp_path / "a.npy", np.random.default_rng(1).random((40, 36)))
    base = [subzero_exe(), "run", "gatewf.py", "--store", "s", "--input", "a=a.npy", "--tile", "16"]
    p = subprocess.run(base, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "crashpoint.py"),
                        "subzero.engines.driver:_finish_step", "1", "--", *base[1:]],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       start_new_session=True)
    assert p.returncode == -9, p.stderr
    partial = tmp_path / "s" / "runs" / "2.partial" / "arrays"
    assert (partial / "a.input.json").is_file() and not (partial / "a.zarr").exists()
    p = subprocess.run([subzero_exe(), "run", "--resume", "2", "--store", "s"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    with subzero.open_store(tmp_path / "s", create=False) as st:
        one, two = st.get(1), st.get(2)
        for name in one.array_names():
            np.testing.assert_array_equal(one.array(name).values, two.array(name).values)
        assert len(copies(st.path)) == 1


#: (function, which call) of publishing a run's input at commit; the kill leaves the run
#: unfinished (resumed or cleaned as before), with the store's copy half-made, made but
#: not referenced, or referenced with the run's own copy still there
PUBLISH_POINTS = [("subzero.storage.shared:_fsync_tree", 1),
                  ("subzero.storage.shared:write_ref", 1),
                  ("subzero.storage.arrays:ArrayStore.drop_own", 1)]


@pytest.mark.parametrize("how", ["resume", "clean"])
@pytest.mark.parametrize("point,nth", PUBLISH_POINTS)
def test_a_kill_while_publishing_an_input_loses_nothing(tmp_path, point, nth, how):
    shutil.copy(ROOT / "tests" / "gated_workflow.py", tmp_path / "gatewf.py")
    np.save(tmp_path / "a.npy", np.random.default_rng(1).random((40, 36)))
    args = ["run", "gatewf.py", "--store", "s", "--input", "a=a.npy", "--tile", "16"]
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "crashpoint.py"), point, str(nth),
                        "--", *args], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       start_new_session=True)
    assert p.returncode == -9, f"{point}#{nth} not reached: {p.returncode} {p.stderr}"
    if how == "resume":
        p = subprocess.run([subzero_exe(), "run", "--resume", "1", "--store", "s"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        with subzero.open_store(tmp_path / "s", create=False) as st:
            run = st.get(1)
            np.testing.assert_array_equal(run.array("a").values, np.load(tmp_path / "a.npy"))
            assert not (st.run_dir(1) / "arrays" / "a.zarr").exists()
            assert len(copies(st.path)) == 1
            assert subzero.fsck(st.path, deep=True) == []
    else:
        p = subprocess.run([subzero_exe(), "clean", "--store", "s"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        # the unfinished run is gone, and with it every trace of its copy
        assert [x.name for x in (tmp_path / "s" / "inputs").iterdir() if x.name != ".lock"] == []
    p = subprocess.run([subzero_exe(), *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    with subzero.open_store(tmp_path / "s", create=False) as st:
        assert len(copies(st.path)) == 1
        assert all(r.status != "interrupted" for r in st.runs())


@pytest.mark.skipif(not java_ok(), reason="needs Java for Spark")
def test_spark_tasks_read_the_stores_copy(spark, night, store):
    """A Spark run takes the flat a local run stored; its tasks read it from the store's
    copy, and it answers as the same run alone does."""
    d, flat, alone = night
    run = store.run(EXAMPLE, inputs={"raw": skies(4)[1], "flat": flat}, tile=32, engine="spark",
                    progress=False)
    assert (store.run_dir(run.id) / "arrays" / "flat.input.json").is_file()
    assert not (store.run_dir(run.id) / "arrays" / "flat.zarr").exists()
    for g, w in zip(answers(run), alone[1]):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(run.array("stars").values, store.get(2).array("stars").values)


@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plan=hst.lists(hst.tuples(hst.integers(0, 2), hst.sampled_from(["memory", "npy", "fits"]),
                                 hst.sampled_from([16, 32])), min_size=2, max_size=4))
def test_sharing_never_changes_an_answer(night, tmp_path_factory, plan):
    """The oracle: runs that share their inputs in any order, form and tiling answer
    exactly as the same runs do each alone in a store of its own."""
    from astropy.io import fits
    d, flat, alone = night
    tmp = tmp_path_factory.mktemp("plan")
    np.save(tmp / "flat.npy", flat)
    fits.PrimaryHDU(flat).writeto(tmp / "flat.fits")
    given_as = {"memory": flat, "npy": tmp / "flat.npy", "fits": tmp / "flat.fits"}
    with subzero.open_store(tmp / "store") as st:
        for k, how, tile in plan:
            run = st.run(EXAMPLE, inputs={"raw": skies(3)[k], "flat": given_as[how]}, tile=tile,
                         progress=False)
            for g, w in zip(answers(run), alone[k]):
                np.testing.assert_array_equal(g, w)
        forms = {(how, tile) for _, how, tile in plan}
        kept = [n for n in copies(st.path) if n.startswith(content.digest(flat).split(":")[1])]
        # one copy per stored form: .npy and memory alike, FITS (its header, y/x) apart
        assert len(kept) == len({("fits" if h == "fits" else "array", t) for h, t in forms})
        assert subzero.fsck(st.path, deep=True) == []
