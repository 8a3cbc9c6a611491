"""The LSST astronomy workflow on the two real exposures: science sanity,
structure, and every strategy answering the scientists' queries identically."""

import json
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits
from scipy import ndimage

import subzero
from subzero.query.workload import load_workload, run_workload

ROOT = Path(__file__).resolve().parent.parent
WF = str(ROOT / "workflows" / "astronomy.py")
WORKLOAD = str(ROOT / "workflows" / "astronomy_workload.json")
UDFS = ("cr_1", "cr_2", "rmcr", "stars")
STRATEGIES = {
    "SubZero": {},                                   # the UDFs' own default: composite PayOne
    "BlackBox": {u: "blackbox" for u in UDFS},
    "FullOne": {u: "full" for u in UDFS},
    "FullMany": {u: "full:fullmany:backward" for u in UDFS},
    "Forward": {u: "full:fullone:forward" for u in UDFS},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    st = subzero.open_store(tmp_path_factory.mktemp("astro") / "s")
    out = {k: st.run(WF, strategies=v, progress=False) for k, v in STRATEGIES.items()}
    yield out
    st.close()


@pytest.fixture(scope="module")
def raw():
    return [fits.getdata(ROOT / "workflows" / "data" / "lsst" / f"imsim_85408556_R23_S11_C04_E00{k}.fits")
            .astype(float) for k in (0, 1)]


def test_structure_22_builtins_4_udfs(runs):
    wf = runs["SubZero"].workflow
    mods = {name: type(s.operator).__module__ for name, s in wf.steps.items()}
    builtin = [n for n, m in mods.items() if m.startswith("subzero.operators")
               or type(wf.steps[n].operator).__name__ in ("BlockBackground", "PixelFlags")]
    assert len(wf.steps) == 26 and len(builtin) == 22
    assert sorted(set(wf.steps) - set(builtin)) == sorted(UDFS)
    for n in builtin:   # built-ins answer with mapping functions, nothing stored
        assert runs["SubZero"].ops()[[o["name"] for o in runs["SubZero"].ops()].index(n)]["strategies"] == ["map"]


def test_cosmic_ray_masks_are_sparse_and_find_the_real_hits(runs, raw):
    run = runs["SubZero"]
    a, b = raw
    for j, (img, other) in enumerate(((a, b), (b, a)), 1):
        mask = run.array(f"cr_{j}").values.astype(bool)
        assert 0 < mask.mean() < 0.01
        # a real hit: >200 counts above the other exposure, where the other is plain sky
        lab, n = ndimage.label(img - other > 200, structure=np.ones((3, 3)))
        hits = np.zeros(img.shape, bool)
        for k, sl in enumerate(ndimage.find_objects(lab), 1):
            if other[sl].max() < 1800:
                hits[sl] |= lab[sl] == k
        assert hits.any() and mask[hits].all(), f"exposure {j}: missed cosmic-ray pixels"


def test_bright_pixels_are_stars_or_hot_pixels(runs, raw):
    """Every pixel above 10,000 counts in both exposures lies inside a detected
    star — except isolated hot pixels (one saturated pixel with sky all around
    it, in both exposures: a detector defect), which the cosmic-ray stage flags
    and rmcr repairs."""
    run = runs["SubZero"]
    a, b = raw
    stars = run.array("stars").values
    crm = run.array("crmask").values.astype(bool)
    rmcr = run.array("rmcr").values
    bright = (a > 10000) & (b > 10000)
    neigh = np.maximum(ndimage.maximum_filter(np.where(bright, 0, a), size=3),
                       ndimage.maximum_filter(np.where(bright, 0, b), size=3))
    isolated = bright & (ndimage.uniform_filter(bright.astype(float), size=3) * 9 < 1.5) & (neigh < 2500)
    in_star = bright & (stars > 0)
    assert in_star.sum() > 0
    assert np.array_equal(bright, in_star | isolated), "a bright multi-pixel source is not a star"
    assert crm[isolated].all() and (np.abs(rmcr[isolated]) < 200).all()


def test_cleaned_image_has_no_cosmic_ray_left(runs):
    run = runs["SubZero"]
    rm = run.array("rmcr").values
    crm = run.array("crmask").values.astype(bool)
    op = run.workflow.steps["stars"].operator
    med = ndimage.median_filter(rm, size=5, mode="nearest")
    assert not ((rm - med > op.threshold(rm)) & crm).any()


def test_subzero_lineage_is_small(runs):
    run = runs["SubZero"]
    inputs = sum(v["nbytes"] for v in run.store.catalog.arrays(run.id).values() if v["kind"] == "input")
    assert 0 < run.lineage_bytes() < 0.5 * inputs
    assert run.lineage_bytes() < runs["FullOne"].lineage_bytes()


@pytest.fixture(scope="module")
def reference(runs):
    queries = load_workload(WORKLOAD)
    rows = run_workload(runs["BlackBox"], queries, record=False)     # UDFs re-executed
    return queries, {r["name"]: r["result"].bitmap for r in rows}


def test_reference_really_re_executes(runs, reference):
    queries, _ = reference
    rows = run_workload(runs["BlackBox"], queries[:1], record=False)
    assert any(m.startswith("reexec") for m in rows[0]["methods"])


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "BlackBox"])
def test_every_strategy_answers_the_workload_identically(runs, reference, strategy):
    queries, ref = reference
    for row in run_workload(runs[strategy], queries, record=False):
        assert np.array_equal(row["result"].bitmap, ref[row["name"]]), (strategy, row["name"])
        assert not any(m.startswith("reexec") for m in row["methods"]), (strategy, row["methods"])
        assert row["count"] > 0


def test_workload_shapes(reference):
    queries, ref = reference
    counts = {k: int(v.sum()) for k, v in ref.items()}
    assert counts["BQ3"] == 500                         # the block maps to itself in the mask
    assert counts["FQ0"] == counts["FQ0Slow"] == 2001 * 513   # crosses the all-to-all mean


def test_fq0_shortcut_used(runs):
    queries = {q.name: q for q in load_workload(WORKLOAD)}
    rows = {r["name"]: r for r in run_workload(runs["SubZero"], [queries["FQ0"], queries["FQ0Slow"]],
                                                record=False)}
    assert "all-to-all" in rows["FQ0"]["methods"]
    assert "all-to-all" not in rows["FQ0Slow"]["methods"]


def test_cli_workload_and_plot(runs, cli, tmp_path):
    store = runs["SubZero"].store.path
    code, out, err = cli("trace", "--store", store, "--run", runs["SubZero"].id,
                         "--workload", WORKLOAD, "--json")
    assert code == 0, err
    names = [q["name"] for q in json.loads(out)["queries"]]
    assert names[:2] == ["BQ0-1", "BQ0-2"] and "FQ0Slow" in names
    png = tmp_path / "star.png"
    code, out, err = cli("trace", "--store", store, "--run", runs["SubZero"].id, "--from", "stars",
                         "--cells", "1162,112", "--to", "raw_1", "--plot", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000
