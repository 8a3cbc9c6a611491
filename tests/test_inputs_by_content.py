"""Inputs identified by content (issue 29): every run records each input's content
digest; the store lists its distinct inputs with the runs that read them and
finds the runs that read a file, an array or a digest, whatever format or path
they came in; older runs get their digest when first needed."""

import json

import numpy as np
import pytest
from conftest import EXAMPLE, copied_store, stored_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

import subzero
from subzero.model import content
from subzero.runs import record
from subzero.workflows.example import flat_field, synthetic_sky


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """Three runs sharing one flat -- given as FITS, .npy and in memory -- on three skies."""
    from astropy.io import fits
    d = tmp_path_factory.mktemp("night")
    flat = flat_field()
    np.save(d / "flat.npy", flat)
    fits.PrimaryHDU(flat.astype(">f8")).writeto(d / "flat.fits")
    skies = [np.roll(synthetic_sky(), (k, 2 * k), axis=(0, 1)) for k in range(3)]
    with subzero.open_store(d / "store") as st:
        for sky, f in zip(skies, [d / "flat.fits", d / "flat.npy", flat]):
            st.run(EXAMPLE, inputs={"raw": sky, "flat": f}, tile=32, progress=False)
    return d, flat, skies


@pytest.fixture
def store(night, tmp_path):
    yield from copied_store(night[0] / "store", tmp_path / "store")


def test_one_flat_in_three_forms_is_one_input_read_by_three_runs(night, store):
    d, flat, skies = night
    found = store.inputs()
    by = {e["digest"]: e for e in found}
    f = by[content.digest(flat)]
    assert f["uses"] == [(1, "flat"), (2, "flat"), (3, "flat")]
    assert f["shape"] == flat.shape and f["dtype"] == "float64"
    assert [by[content.digest(s)]["uses"] for s in skies] == [[(1, "raw")], [(2, "raw")], [(3, "raw")]]
    assert len(found) == 4
    for what in (d / "flat.fits", str(d / "flat.npy"), flat, content.digest(flat)):
        assert store.runs_using(what) == [(1, "flat"), (2, "flat"), (3, "flat")]
    assert store.runs_using(2, "flat") == [(1, "flat"), (2, "flat"), (3, "flat")]
    assert store.runs_using(skies[1]) == [(2, "raw")]
    assert store.runs_using(flat * 1.0000001) == []            # one value off is another input


@pytest.mark.parametrize("rid", [1, 2, 3])       # a FITS file, a .npy file, arrays in memory
def test_the_digest_is_the_stored_values_and_is_in_the_signed_record(store, rid):
    run = store.get(rid)
    want = {n: content.digest(np.asarray(run.array(n))) for n in ("raw", "flat")}
    assert store.input_digests(rid) == want
    rec = record.read(run.dir)
    assert {a["name"]: a.get("digest") for a in rec["arrays"] if a["kind"] == "input"} == want


def test_a_labelled_input_in_memory_has_the_digest_of_its_stored_copy(tmp_path):
    import xarray as xr
    sky = xr.DataArray(synthetic_sky(), dims=("y", "x"),
                       coords={"y": np.arange(64) * 0.5, "x": np.arange(96) + 100.0},
                       attrs={"CTYPE1": "RA---TAN", "CTYPE2": "DEC--TAN", "CRVAL1": 10.0, "CRVAL2": 5.0,
                              "CRPIX1": 1.0, "CRPIX2": 1.0, "CDELT1": -1e-4, "CDELT2": 1e-4, "NOTE": "x"})
    with subzero.open_store(tmp_path / "s") as st:
        run = st.run(EXAMPLE, inputs={"raw": sky}, tile=32, progress=False)
        stored = st.run_dir(run.id)
        from subzero.storage.arrays import ArrayStore
        assert st.input_digests(run.id)["raw"] == ArrayStore(stored, run_uid=run.row.uid).content_digest("raw")
        assert st.input_digests(run.id)["raw"] != content.digest(synthetic_sky())   # labels count


def runs_without_digests(monkeypatch):
    """Runs committed from now on are made as before inputs had digests: none in their
    record or the catalog."""
    import subzero.runs.launch as launch
    from subzero.storage.arrays import ArrayStore
    monkeypatch.setattr(launch, "input_digest", lambda v, n: None)
    monkeypatch.setattr(ArrayStore, "content_digest", lambda self, n: None)


def test_a_run_made_before_digests_gets_one_when_first_needed(night, tmp_path, monkeypatch):
    d, flat, skies = night
    with subzero.open_store(tmp_path / "s") as st:
        with monkeypatch.context() as m:
            runs_without_digests(m)
            run = st.run(EXAMPLE, inputs={"raw": skies[0], "flat": d / "flat.npy"}, tile=32,
                         progress=False)
        assert st.catalog.input_digests(run.id) == {"raw": None, "flat": None}
        rec = record.read(run.dir)
        assert all(a.get("digest") is None for a in rec["arrays"])
        assert st.runs_using(d / "flat.fits") == [(run.id, "flat")]       # computed, from the store
        assert st.catalog.input_digests(run.id) == {"raw": content.digest(skies[0]),
                                                    "flat": content.digest(flat)}       # and kept
        assert st.binding(run.id)["catalog_differs"] == []


def test_fsck_rebuilds_the_digests_from_the_records(store):
    want = {r.id: store.input_digests(r) for r in store.runs()}
    path = store.path
    store.close()
    (path / "catalog.sqlite").unlink()
    subzero.fsck(path)
    with subzero.open_store(path, create=False) as st:
        assert {r.id: st.catalog.input_digests(r.id) for r in st.runs()} == want


def test_the_command_line(night, store, shell):
    d, flat, _ = night
    code, out, err = shell("inputs", "--store", store.path)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["content", "shape"] and len(lines) == 6
    assert any("flat (runs 1, 2, 3)" in ln for ln in lines)
    # the flat as FITS keeps its header and (y, x) dims: one copy; as .npy and in memory: one
    flat_line = next(ln for ln in lines if "flat (runs 1, 2, 3)" in ln).split()
    assert flat_line[-7] == "2" and flat_line[-6] == "3", flat_line        # copies, runs
    assert lines[-1].startswith("4 distinct input(s)")
    code, out, err = shell("inputs", d / "flat.fits", "--store", store.path, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["digest"] == content.digest(flat)
    assert got["runs"] == [{"run_id": i, "input": "flat"} for i in (1, 2, 3)]
    code, out, err = shell("show", "2", "--store", store.path)
    assert f"content {content.digest(flat)}" in out
    code, out, err = shell("show", "2", "--store", store.path, "--json")
    assert json.loads(out)["input_digests"]["flat"] == content.digest(flat)


@pytest.mark.parametrize("what, says", [("missing.npy", "file not found: missing.npy"),
                                         ("sz1:abc", "is not a content digest")])
def test_a_wrong_input_is_one_line(store, shell, what, says):
    code, out, err = shell("inputs", what, "--store", store.path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err


# -- impact across runs ---------------------------------------------------------------------
BAD_COLUMN = "0:64,37"          # one column of the flat


def test_impact_of_a_flat_column_equals_each_runs_own_trace(night, store):
    d, flat, skies = night
    imp = store.impact(d / "flat.fits", BAD_COLUMN)
    assert imp.digest == content.digest(flat) and imp.cells_in == 64
    assert [r.run_id for r in imp.runs] == [1, 2, 3] and all(r.error is None for r in imp.runs)
    for r in imp.runs:
        run = store.get(r.run_id)
        assert [t.array for t in r.targets] == ["smooth", "stars"]        # the outputs
        for t in r.targets:
            want = run.trace("flat", BAD_COLUMN, to=t.array, record=False)
            assert np.array_equal(t.cells, want.cells), (r.run_id, t.array)
            assert t.bounds == want.cellset.bounds() and t.count == len(want)
        run.close()
    # the same question asked through one run's input name, or for named arrays
    again = store.impact(2, BAD_COLUMN, name="flat", to=["clean", "stars"])
    assert [r.run_id for r in again.runs] == [1, 2, 3]
    for r, first in zip(again.runs, imp.runs):
        assert [t.array for t in r.targets] == ["clean", "stars"]
        assert np.array_equal(r.targets[1].cells, first.targets[1].cells)


def test_impact_of_one_sky_reaches_only_its_run(night, store):
    _, _, skies = night
    imp = store.impact(skies[2], [(40, 70)], to="stars")
    assert [(r.run_id, r.input) for r in imp.runs] == [(3, "raw")]
    assert np.array_equal(imp.runs[0].targets[0].cells,
                          store.get(3).trace("raw", [(40, 70)], to="stars", record=False).cells)
    assert store.impact(np.zeros((64, 96)), "0,0").runs == []             # read by no run


def test_impact_from_the_command_line(night, store, shell):
    d, _, _ = night
    code, out, err = shell("impact", "--input", d / "flat.npy", "--cells", BAD_COLUMN, "--to", "stars",
                           "--store", store.path, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert [r["run_id"] for r in got["runs"]] == [1, 2, 3]
    want = store.get(1).trace("flat", BAD_COLUMN, to="stars", record=False)
    assert got["runs"][0]["targets"][0]["cells"] == want.cells.tolist()
    code, out, err = shell("impact", "--input", d / "flat.npy", "--cells", BAD_COLUMN,
                           "--store", store.path)
    assert code == 0 and "read by 3 runs, 3 affected" in out and "workflow example: 3 runs" in out, err
    code, out, err = shell("impact", "--input", d / "flat.npy", "--store", store.path)
    assert code == 2 and "impact needs one of --cells" in err and len(err.strip().splitlines()) == 1


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(y0=hst.integers(0, 63), x0=hst.integers(0, 95), h=hst.integers(1, 8), w=hst.integers(1, 8),
       to=hst.sampled_from(["calib", "smooth", "clean", "stars"]))
def test_impact_is_the_union_of_per_run_traces_for_any_region(night, y0, x0, h, w, to):
    """The oracle: for any box of the flat and any array, every run's impact is its own
    forward trace, and no run that read the flat is missing."""
    d, _, _ = night
    box = f"{y0}:{min(64, y0 + h)},{x0}:{min(96, x0 + w)}"
    with subzero.open_store(d / "store", create=False) as st:
        imp = st.impact(d / "flat.npy", box, to=to)
        assert [r.run_id for r in imp.runs] == [1, 2, 3]
        for r in imp.runs:
            with st.get(r.run_id) as run:
                want = run.trace("flat", box, to=to, record=False).cells
            assert np.array_equal(r.targets[0].cells, want)


def test_an_edited_digest_in_the_catalog_is_seen_and_repaired(store, shell):
    """A digest edited in the catalog would hide a run from `impact`: the run's signed
    record says otherwise, `runs` and `show` say the catalog differs, `fsck` repairs it."""
    want = store.input_digests(2)["flat"]
    store.catalog.db.execute("UPDATE arrays SET digest=? WHERE run_id=2 AND name='flat'",
                             ("sz1:" + "0" * 64,))
    assert store.input_digests(2)["flat"] == want                 # the record stands
    assert "arrays.digest of 'flat'" in store.binding(2)["catalog_differs"]
    code, out, err = shell("show", "2", "--store", store.path)
    assert "the catalog differs" in out and "arrays.digest" in out
    subzero.fsck(store.path)
    assert store.catalog.input_digests(2)["flat"] == want
    assert [r for r, _ in store.runs_using(want)] == [1, 2, 3]


def test_a_damaged_input_of_a_run_without_digests_is_named_not_skipped_silently(night, tmp_path, monkeypatch):
    d, flat, skies = night
    with subzero.open_store(tmp_path / "s") as st:
        with monkeypatch.context() as m:
            runs_without_digests(m)
            run = st.run(EXAMPLE, inputs={"raw": skies[0], "flat": d / "flat.npy"}, tile=32,
                         progress=False)
        chunk = next(p for p in (stored_path(run.dir, "flat") / "data" / "c").rglob("*") if p.is_file())
        chunk.write_bytes(b"\0" * chunk.stat().st_size)
        with pytest.warns(subzero.SubZeroWarning, match=r"input 'flat' of run 1 has no content digest.*damaged"):
            assert st.runs_using(d / "flat.npy") == []
        assert st.catalog.input_digests(run.id)["flat"] is None             # nothing wrong kept
