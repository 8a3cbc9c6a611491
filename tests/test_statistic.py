"""Whole-array statistics over tiles, and cosmic-ray detection per tile.

An operator that needs one whole-array number (a median, a noise level) runs per
tile only if every tile sees the whole array's value: the statistic's partials,
merged over any tiling, must give what the whole array gives.  L.A.Cosmic
(astroscrappy) is the hard case: four iterations of filters with a light cone of
38 pixels, and a whole-image median as the fill value of fully masked windows.
Its tiles must equal the whole image bit for bit: the mask, and the cleaned image
(which the fill value changes, so these tests can tell a wrong fill)."""

import numpy as np
import pytest
from astropy.io import fits
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from subzero import ExactMAD, ExactMedian, Workflow
from subzero.capture.runner import run_tile
from subzero.capture.tiles import tiles_for
from subzero.errors import OperatorError
from subzero.model.statistic import lower_median, over_blocks, whole
from subzero.workflows import astronomy as A


def cores(shape, tile):
    return [t.core for t in tiles_for(shape, tile)]


def block_reader(a):
    return lambda box: a[tuple(slice(lo, hi) for lo, hi in box)]


def median_of(dtype):
    m = ExactMedian()
    m.dtype = np.dtype(dtype)
    return m


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_exact_median_over_any_tiling_is_the_lower_median(data):
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    kind = data.draw(st.sampled_from(["normal", "ties", "tiny", "huge", "zeros", "inf"]))
    a = rng.normal(size=shape)
    if kind == "ties":
        a = np.round(a)
    elif kind == "tiny":
        a = a * 1e-40 if dtype == np.float64 else a * np.float32(1e-41)
    elif kind == "huge":
        a = a * 1e300 if dtype == np.float64 else a * 1e37
    elif kind == "zeros":
        a = np.where(a > 0, 0.0, -0.0)
    elif kind == "inf":
        a.flat[0] = np.inf
        a.flat[-1] = -np.inf
    a = a.astype(dtype)
    stat = median_of(dtype)
    tile = data.draw(st.integers(1, 9))
    got = over_blocks(stat, block_reader(a), cores(a.shape, tile), a.shape)
    assert got == lower_median(a) == whole(stat, a)
    assert type(got) is np.dtype(dtype).type


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_exact_mad_over_any_tiling_is_numpys(data):
    """The median absolute deviation in rounds of histograms equals numpy's on the
    whole array (the mean of the two middle values when their number is even), on
    any tiling: the astronomy workflow's star threshold no longer gathers its sample."""
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    kind = data.draw(st.sampled_from(["normal", "ties", "tiny", "huge", "offset", "inf"]))
    a = rng.normal(size=shape)
    if kind == "ties":
        a = np.round(a)
    elif kind == "tiny":
        a = a * 1e-300
    elif kind == "huge":
        a = a * 1e300
    elif kind == "offset":
        a = a * 1e-3 + 1e6
    elif kind == "inf":
        a.flat[0] = np.inf
    tile = data.draw(st.integers(1, 9))
    got = over_blocks(ExactMAD(), block_reader(a), cores(a.shape, tile), a.shape)
    with np.errstate(invalid="ignore"):                 # nan: one value, and it is infinite
        want = np.median(np.abs(a - np.median(a)))
    assert np.array_equal([got, whole(ExactMAD(), a)], [want, want], equal_nan=True)


def test_star_threshold_is_the_mad_of_the_grid_sample():
    """The star threshold per tile equals ``nsigma`` times ``mad_sigma`` of the
    ``[::4, ::4]`` sample of the whole image, bit for bit."""
    sky = sky_image()
    stat = A.StarThreshold(5.0)
    want = 5.0 * A.mad_sigma(sky[::4, ::4].astype(np.float64).ravel())
    for tile in (64, 37, 9):
        assert over_blocks(stat, block_reader(sky), cores(sky.shape, tile), sky.shape) == want
    with pytest.raises(ValueError, match="NaN"):
        bad = sky.astype(np.float64)
        bad[4, 8] = np.nan
        whole(stat, bad)


def test_exact_median_refuses_nan_and_nothing():
    a = np.ones((4, 4), np.float32)
    a[1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        whole(median_of(np.float32), a)
    with pytest.raises(ValueError, match="no values"):
        whole(median_of(np.float32), np.zeros((0, 3), np.float32))


# --- cosmic rays per tile ------------------------------------------------------------------

def sky_image(shape=(300, 260), seed=1, crowd=1.0):
    """Sky noise, stars (some saturated), and cosmic rays: streaks, flat blobs and
    splashes whose every pixel is an edge (their centres get fully masked 5x5
    windows, where L.A.Cosmic writes the whole image's fill value)."""
    rng = np.random.default_rng(seed)
    img = rng.normal(0, 25, shape).astype(np.float32)
    yy, xx = np.mgrid[:shape[0], :shape[1]]
    for _ in range(int(shape[0] * shape[1] * crowd) // 4000):
        y, x = rng.uniform(0, shape[0]), rng.uniform(0, shape[1])
        r2 = (yy - y) ** 2 + (xx - x) ** 2
        near = r2 < 100
        img[near] += (rng.choice([500, 5000, 80000]) * np.exp(-r2[near] / 2.42)).astype(np.float32)
    for _ in range(int(shape[0] * shape[1] * crowd) // 1500):
        y, x = rng.integers(0, shape[0] - 8), rng.integers(0, shape[1] - 8)
        kind = rng.integers(4)
        if kind == 0:
            img[y, x:x + rng.integers(1, 8)] += rng.uniform(300, 3000)
        elif kind == 1:
            img[y:y + rng.integers(1, 8), x] += rng.uniform(300, 3000)
        elif kind == 2:
            w = rng.integers(4, 8)
            img[y:y + w, x:x + w] += rng.uniform(300, 3000)
        else:
            w = rng.integers(5, 8)
            edges = (np.indices((w, w)).sum(0) % 2).astype(np.float32)
            img[y:y + w, x:x + w] += rng.uniform(2000, 6000) * (0.2 + edges)
    return img


def cr_by_tiles(op, img, tile, fill_offset=0.0):
    """The engines' way in one process: the fill value over the tiles, then every
    tile's read region (core plus halo) detected; the cores put together."""
    shape = img.shape
    sky = np.float32(op.sky)
    fill = over_blocks(op.statistic, block_reader(img), cores(shape, tile), shape)
    mask, clean = np.zeros(shape, np.uint8), np.zeros(shape, np.float32)
    for t in tiles_for(shape, tile, op.tiling.radius):
        block = img[t.read_slices()] + sky
        if block.shape == shape:
            m, c = op._detect(block, A.non_science(shape))
        else:
            m, c = op.detect_block(block, t.origin, shape, np.float32(fill + fill_offset))
        mask[t.core_slices()], clean[t.core_slices()] = m[t.core_in_read()], c[t.core_in_read()]
    return mask, clean


@pytest.fixture(scope="module")
def sky():
    img = sky_image()
    op = A.CosmicRays()
    mask, clean = op._detect(img + np.float32(op.sky), A.non_science(img.shape))
    return img, mask, clean


@pytest.mark.parametrize("tile", [64, 97, (17, 200), (300, 50)])
def test_cosmic_rays_per_tile_equal_the_whole_image(sky, tile):
    """Odd tiles, strips along each axis."""
    img, mask, clean = sky
    assert mask.sum() > 300
    got_m, got_c = cr_by_tiles(A.CosmicRays(), img, tile)
    np.testing.assert_array_equal(got_m, mask)
    np.testing.assert_array_equal(got_c, clean)


def test_cosmic_rays_per_tile_under_the_halo_equal_the_whole_image(sky):
    """Tiles of 37 pixels, under the 40-pixel halo, on the whole image: 64 read regions
    of ~117x117 each, ten times the whole image's work (slow tier, tests/conftest.py
    SLOW; the quick tier checks tiles under the halo on a small image,
    test_cosmic_rays_in_tiles_smaller_than_their_halo)."""
    img, mask, clean = sky
    assert mask.sum() > 300
    got_m, got_c = cr_by_tiles(A.CosmicRays(), img, 37)
    np.testing.assert_array_equal(got_m, mask)
    np.testing.assert_array_equal(got_c, clean)


def test_cosmic_rays_in_tiles_smaller_than_their_halo():
    """Tiles of 9 pixels, under the 40-pixel halo, so every tile reads mostly its
    neighbours' cells, on a small crowded image of its own (each tile detects an 89x89
    read region: on the 300x260 image above that is 100x the whole image's work)."""
    img = sky_image(shape=(70, 60), seed=5, crowd=5.0)
    op = A.CosmicRays()
    mask, clean = op._detect(img + np.float32(op.sky), A.non_science(img.shape))
    assert mask.sum() > 40
    got_m, got_c = cr_by_tiles(A.CosmicRays(), img, 9)
    np.testing.assert_array_equal(got_m, mask)
    np.testing.assert_array_equal(got_c, clean)


def test_a_wrong_fill_value_changes_the_cleaned_image(sky):
    """The fill value reaches the output: a tile given another one than the whole
    image's differs (so the equality above is not an accident of unused fills)."""
    img, mask, clean = sky
    got_m, got_c = cr_by_tiles(A.CosmicRays(), img, 64, fill_offset=500.0)
    assert (got_c != clean).sum() > 0


def test_a_tile_without_the_whole_arrays_statistic_is_refused(sky):
    img = sky[0]
    t = tiles_for(img.shape, 64, 40)[0]
    with pytest.raises(OperatorError, match="declares a statistic"):
        run_tile("cr", A.CosmicRays(), [img[t.read_slices()]], (), False, t, img.shape, [img.shape])


def test_tiny_images_are_refused_not_crashed():
    """astroscrappy's C code overruns its buffers under 4 pixels a side."""
    with pytest.raises(ValueError, match="at least 8 pixels"):
        A.CosmicRays().compute_flagged(np.zeros((3, 50), np.float32))


def cr_wf():
    wf = Workflow("cr")
    wf.add("cr", A.CosmicRays(), wf.input("x"))
    return wf


def test_real_exposure_per_tile_in_process(store):
    """The real LSST exposure (sky-subtracted), streamed by the in-process engine in
    97-pixel tiles: the same mask as astroscrappy on the whole image."""
    img = fits.getdata(ROOT / "workflows" / "data" / "lsst" / "imsim_85408556_R23_S11_C04_E001.fits")
    img = img.astype(np.float32)
    img -= np.median(img)
    want, _ = A.CosmicRays().compute_flagged(img)
    run = store.run(cr_wf(), inputs={"x": img}, tile=97, progress=False)
    np.testing.assert_array_equal(run.array("cr").values, want)
    assert want.sum() > 0


@pytest.mark.parametrize("strategy", ["comp:payone:backward", "full", "blackbox"])
def test_spark_cosmic_rays_per_tile_equal_in_process(spark, store, sky, strategy):
    img, mask, _ = sky
    lo = store.run(cr_wf(), inputs={"x": img}, strategies={"cr": strategy}, progress=False)
    sp = store.run(cr_wf(), inputs={"x": img}, strategies={"cr": strategy}, engine="spark",
                   spark=spark, tile=64, progress=False)
    np.testing.assert_array_equal(lo.array("cr").values, mask)
    np.testing.assert_array_equal(sp.array("cr").values, mask)
    log = (sp.dir / "run.log").read_text()
    assert "cr: statistic SkyFill over 4 block(s) in 2 round(s)" in log
    assert "one task on the whole array" not in log and "halo 40" in log
    for c in [tuple(x) for x in np.argwhere(mask)[::97][:4]] + [(150, 130), (0, 0)]:
        a, b = sp.trace("cr", [c], to="x"), lo.trace("cr", [c], to="x")
        np.testing.assert_array_equal(a.bitmap, b.bitmap, err_msg=f"backward {c}")
        a, b = sp.trace("x", [c], to="cr"), lo.trace("x", [c], to="cr")
        np.testing.assert_array_equal(a.bitmap, b.bitmap, err_msg=f"forward {c}")


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_a_statistic_that_fails_is_the_operators_error(spark, store, sky, engine):
    """NaN has no rank: the fill value cannot be computed, and the run stops with the
    operator's error on either engine (not an internal error, not a wrong fill)."""
    img = sky[0].copy()
    img[100, 100] = np.nan
    kw = {"engine": "spark", "spark": spark} if engine == "spark" else {}
    with pytest.raises(OperatorError, match=r"operator 'cr'.*NaN values have no median"):
        store.run(cr_wf(), inputs={"x": img}, tile=64, progress=False, **kw)
    assert store.runs()[-1].status == "failed"


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_statistic_updated_from_changed_tiles_is_the_whole_new_arrays(data):
    """A re-run's statistic: the parent's merged states without the changed tiles' old
    partials and with their new ones equal the statistic over the whole new array --
    the median and the MAD, whether the change moves them or not."""
    from subzero.model.statistic import updated
    kind = data.draw(st.sampled_from(["median32", "median64", "mad"]))
    stat = median_of(np.float32) if kind == "median32" else median_of(np.float64) \
        if kind == "median64" else ExactMAD()
    shape = (data.draw(st.integers(4, 30)), data.draw(st.integers(4, 30)))
    tile = data.draw(st.integers(2, 12))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    old = rng.normal(0, 1, shape).round(data.draw(st.integers(0, 3)))
    new = old.copy()
    r, c = data.draw(st.integers(0, shape[0] - 1)), data.draw(st.integers(0, shape[1] - 1))
    h, w = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    new[r:r + h, c:c + w] += data.draw(st.sampled_from([0.0, 0.5, -3.0, 100.0]))
    cs = cores(shape, tile)
    states: list = []
    before = over_blocks(stat, block_reader(old), cs, shape, states)
    changed = [core for core in cs if old[tuple(slice(a, b) for a, b in core)].tobytes()
               != new[tuple(slice(a, b) for a, b in core)].tobytes()]     # bit for bit: -0.0 is not 0.0
    kept: list = []
    got, was = updated(stat, states, block_reader(old), block_reader(new), changed, cs, shape, kept)
    want_states: list = []
    want = over_blocks(stat, block_reader(new), cs, shape, want_states)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert np.asarray(was).tobytes() == np.asarray(before).tobytes()
    assert all(np.array_equal(a, b) for a, b in zip(kept, want_states))


def test_kept_merged_states_are_compact_and_read_back_exactly(tmp_path):
    """A run keeps its statistics' merged states (histograms of 65,536 counts, almost
    all zero) compressed: a few KB, not a MB each; read back bit for bit, and only
    when the file is the one the run's record names."""
    from subzero.storage import rounds
    rng = np.random.default_rng(0)
    states = []
    for _ in range(4):
        h = np.zeros(65536, np.int64)
        h[rng.integers(0, 65536, 150)] = rng.integers(1, 10**6, 150)
        states.append(h)
    digest = rounds.save(tmp_path, "stars", states)
    assert rounds.path(tmp_path, "stars").stat().st_size < 32 * 1024
    back = rounds.load(tmp_path, "stars", digest)
    assert back is not None and all(a.tobytes() == b.tobytes() for a, b in zip(back, states))
    assert rounds.load(tmp_path, "stars", "0" * 64) is None
