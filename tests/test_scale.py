"""Sizes of the LSST workflow (the real amplifier tiled) and the DuckDB peer of
benchmarks/peer.py: small images, so they run in the suite."""

import importlib.util
import pickle
import sys

import numpy as np
import pytest
from conftest import ROOT

from subzero.errors import WorkflowError
from subzero.model.cells import box
from subzero.workflows import astronomy as A


def _load_peer():
    """benchmarks/peer.py under a name of its own (the benchmarks are not a package)."""
    spec = importlib.util.spec_from_file_location("subzero_bench_peer", ROOT / "benchmarks" / "peer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


peer_mod = _load_peer()
Peer, capture_full, same_cells = peer_mod.Peer, peer_mod.capture_full, peer_mod.same_cells

WF = str(ROOT / "workflows" / "astronomy.py")
#: a crop of the amplifier whose science area (192 x 384) is a whole number of the
#: background's 64x64 blocks, so every copy of it sees the same blocks
CROP = (193, 388)
H, W = CROP[0] - 1, CROP[1] - 4
#: stars of the crop away from its borders (row, column of a pixel of theirs)
STARS = [(85, 315), (125, 340)]


def test_tiling_sizes_and_layout():
    assert [A.tiling(mp) for mp in (1, 4, 16, 64)] == [(1, 1), (2, 2), (4, 4), (9, 7)]
    assert A.tiling(tiles=[3, 2]) == (3, 2)
    raw = A.source("raw_1")
    assert np.array_equal(A.mosaic(raw, (1, 1)), raw)
    m = A.mosaic(raw, (2, 3))
    assert m.shape == A.TiledInput("raw_1", (2, 3)).shape == (1 + 2 * 2000, 4 + 3 * 509)
    # copy (1, 2) of the science area, the prescan strip repeated down, row 0 along
    assert np.array_equal(m[1 + 2000:, 4 + 2 * 509:], raw[1:, 4:])
    assert np.array_equal(m[1 + 2000:, :4], raw[1:, :4])
    assert np.array_equal(m[0, 4 + 509:4 + 2 * 509], raw[0, 4:])


def test_megapixels_parameter():
    from subzero import load_workflow
    default = load_workflow(WF)
    assert default.inputs["raw_1"].default == A.EXPOSURES[0]      # unchanged without a size
    wf = load_workflow(WF, {"megapixels": 4})
    d = wf.inputs["flat"].default
    assert np.shape(d) == (4001, 1022)
    assert np.array_equal(np.asarray(d), A.mosaic(A.flat_frame(), (2, 2)))
    assert len(pickle.dumps(wf.inputs["raw_1"].default)) < 1000  # built when loaded, not pickled
    for bad in (-1, 0, "big"):
        with pytest.raises(WorkflowError, match="megapixels must be"):
            load_workflow(WF, {"megapixels": bad})
    with pytest.raises(WorkflowError, match="tiles must be"):
        load_workflow(WF, {"tiles": [0, 2]})


def test_cli_rejects_a_bad_size_in_one_line(cli):
    code, out, err = cli("run", WF, "--engine", "local", "--param", "megapixels=-4")
    assert code == 2
    assert err.strip().count("\n") == 0 and "megapixels must be a positive number" in err


@pytest.fixture(scope="module")
def crop_runs(tmp_path_factory):
    import subzero
    st = subzero.open_store(tmp_path_factory.mktemp("scale") / "store")
    small = st.run(WF, inputs=A.tiled_inputs((1, 1), CROP), progress=False)
    large = st.run(WF, inputs=A.tiled_inputs((2, 2), CROP), progress=False)
    yield st, small, large
    st.close()


def test_tiled_image_answers_star_traces_like_the_original(crop_runs):
    """A star's peak traced back to raw_1 in copy (k, l) of the 2x2 tiled image reaches
    the original's answer shifted by the copy's offset (the prescan strip, which every
    pixel reaches through the overscan mean, aside)."""
    _, small, large = crop_runs
    labels = np.asarray(small.array("stars").values)
    rmcr = np.asarray(small.array("rmcr").values)
    for star in STARS:
        lab = labels[star]
        assert lab > 0
        pix = np.argwhere(labels == lab)
        peak = pix[np.argmax(rmcr[tuple(pix.T)])]
        want = small.trace("stars", [tuple(peak)], to="raw_1", record=False).cells
        want = want[want[:, 1] >= 4]
        assert len(want) > 1000
        for k in (0, 1):
            for l in (0, 1):
                off = np.array([k * H, l * W])
                assert np.asarray(large.array("stars").values)[tuple(peak + off)] > 0
                got = large.trace("stars", [tuple(peak + off)], to="raw_1", record=False).cells
                got = got[got[:, 1] >= 4] - off
                assert same_cells(got, want), (star, k, l)
    # the star masks agree copy by copy, but for a few threshold pixels: the noise
    # estimate behind the threshold is global and the tiled image has relatively
    # less of the (non-sky) prescan strip and row 0
    big = np.asarray(large.array("stars").values) > 0
    for k in (0, 1):
        for l in (0, 1):
            sub = big[1 + k * H:1 + (k + 1) * H, 4 + l * W:4 + (l + 1) * W]
            assert np.count_nonzero(sub != (labels[1:, 4:] > 0)) <= 10


def test_peer_answers_equal_subzero(crop_runs, tmp_path):
    """The DuckDB peer (complete lineage, joins along every DAG path) returns SubZero's
    cells backward, forward, and through the all-to-all overscan mean."""
    _, small, _ = crop_runs
    wf = A.workflow()
    values = {n: np.asarray(small.array(n).values) for n in wf.inputs}
    captured, _ = capture_full(wf, values)
    assert set(captured) == set(wf.steps)
    peer = Peer(tmp_path / "peer.duckdb")
    try:
        peer.load(captured)
        assert peer.bytes_on_disk() > 0
        labels = np.asarray(small.array("stars").values)
        queries = [("stars", [STARS[0]], "raw_1"), ("stars", [STARS[1]], "raw_2"),
                   ("raw_1", box((80, 300), (90, 310)), "stars"),
                   ("raw_1", box((100, 0), (110, 10)), "rmoverscan_1"),
                   ("crmask", [STARS[0]], "flat_2")]
        for start, cells, to in queries:
            got = peer.trace(start, cells, to)
            want = small.trace(start, cells, to=to, record=False).cells
            assert len(want) and same_cells(got, want), (start, to)
        assert labels[STARS[0]] > 0
        with pytest.raises(ValueError, match="neither upstream nor downstream"):
            peer.trace("raw_1", [(0, 0)], "raw_2")
    finally:
        peer.close()
    assert not same_cells(np.array([[1, 2]]), np.array([[1, 3]]))
