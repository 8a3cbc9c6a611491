"""Incremental re-runs (issue 30): a corrected input recomputes only the tiles it can
reach, and the re-run is bit-identical to a full run on the new inputs -- every
array and the stored lineage relation -- whatever the edit, strategy or operator."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as hs
from relations import same, spoil_lineage

from subzero import ExactMedian, Mode, Operator, Workflow, stencil
from subzero.errors import UntrustedRun
from subzero.model.operator import ELEMENTWISE
from subzero.operators import Add, Mean, MeanFilter, Slice, Sub, WindowComposite
from subzero.operators.components import ConnectedComponents

SHAPE = (40, 36)
TILE = 8


class Median64(ExactMedian):
    dtype = np.dtype(np.float64)


class Centre(Operator):
    """The input minus the whole array's median: elementwise, with a statistic."""

    tiling = ELEMENTWISE

    def __init__(self):
        self.statistic = Median64()

    def supported_modes(self):
        return {Mode.FULL, Mode.MAP, Mode.BLACKBOX}

    def run(self, ctx, x):
        if Mode.FULL in ctx.modes:
            cells = np.argwhere(np.ones(np.shape(x), bool))
            ctx.lwrite(cells, cells, each=True)
        return np.asarray(x, np.float64) - ctx.statistic

    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells


class Spikes(WindowComposite):
    """Cells above 3 take the mean of their 3x3 window: composite lineage, a stencil."""

    tiling = stencil(1)
    radius = 1
    lineage_modes = frozenset({Mode.FULL, Mode.COMP, Mode.PAY, Mode.BLACKBOX})

    def compute_flagged(self, x):
        from scipy import ndimage
        x = np.asarray(x, np.float64)
        flagged = x > 3.0
        mean = ndimage.correlate(x, np.full((3, 3), 1 / 9), mode="reflect")
        return np.where(flagged, mean, x), flagged


class Above(ConnectedComponents):
    def __init__(self):
        self.connectivity, self.min_size = "full", 1

    def foreground(self, values, stat):
        return np.asarray(values) > 1.0


def mixed():
    """Every kind of operator a re-run treats differently."""
    wf = Workflow("mixed")
    x, y = wf.input("x"), wf.input("y")
    a = wf.add("smooth", MeanFilter(3), x)                 # stencil
    b = wf.add("spikes", Spikes(), a)                      # stencil, composite lineage
    c = wf.add("centre", Centre(), b)                      # elementwise with a statistic
    m = wf.add("level", Mean(), c)                         # aggregation to one cell
    d = wf.add("minus", Sub(broadcast="scalar"), c, m)     # a one-cell input
    e = wf.add("plus", Add(), d, y)                        # an input no edit touches
    wf.add("blobs", Above(), e)                            # connected components
    wf.add("corner", Slice(np.s_[3:20, 5:30]), e)          # a gather
    return wf


STRATEGIES = {
    "backward": {"smooth": "full:fullone:backward", "spikes": "comp:payone:backward",
                 "centre": "full:fullmany:backward", "plus": "full:fullone:backward",
                 "blobs": "pay:payone:backward", "corner": "full:fullone:backward"},
    "many": {"smooth": "full:fullmany:backward", "spikes": "comp:paymany:backward",
             "centre": "full:fullone:backward+full:fullone:forward",
             "plus": "full:fullmany:backward", "blobs": "pay:paymany:backward"},
    "forward": {"smooth": "full:fullone:forward", "spikes": "comp:payone:forward",
                "centre": "full:fullmany:forward", "plus": "map"},
    "pay": {"spikes": "pay:payone:backward+full:fullone:backward", "smooth": "map"},
}


def data(seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, SHAPE)
    x[10:13, 20:23] = 6.0                     # spikes
    return x, rng.normal(0, 1, SHAPE)


def edited(x, kind, where, size, scale):
    x = x.copy()
    r, c = where
    if kind == "cell":
        x[r, c] += scale
    elif kind == "box":
        x[r:r + size, c:c + size] *= 1 + scale
    elif kind == "chunk":
        r0, c0 = (r // TILE) * TILE, (c // TILE) * TILE
        x[r0:r0 + TILE, c0:c0 + TILE] += scale
    elif kind == "median":                    # moves the median: the statistic changes
        x[: SHAPE[0] // 2] += 5 * abs(scale) + 1
    return x                                  # "none": the same values


EDITS = hs.tuples(hs.sampled_from(["cell", "box", "chunk", "median", "none"]),
                  hs.tuples(hs.integers(0, SHAPE[0] - 1), hs.integers(0, SHAPE[1] - 1)),
                  hs.integers(1, 9), hs.floats(0.5, 4.0))


@pytest.mark.parametrize("strategies", list(STRATEGIES))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(edit=EDITS)
def test_a_rerun_is_a_full_run_on_the_new_inputs(store, strategies, edit):
    x, y = data()
    strat = STRATEGIES[strategies]
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, strategies=strat, progress=False)
    new = edited(x, *edit)
    re = store.rerun(parent.id, {"x": new}, progress=False)
    full = store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE, strategies=strat, progress=False)
    same(re, full)
    info = re.rerun_info()
    assert info["parent"] == parent.id and info["inputs"] == ["x"]
    ops = info["ops"]
    if edit[0] == "none" and strategies != "forward":
        assert all(v["kind"] == "kept" for n, v in ops.items() if n != "x")
    if edit[0] in ("cell", "box") and strategies == "backward":
        assert ops["smooth"]["ran"] < ops["smooth"]["tiles"]        # only what the edit reaches
        assert ops["plus"]["kind"] != "whole"


def test_only_the_tiles_a_change_reaches_run_and_unchanged_tiles_stop_it(store):
    x, y = data()
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE,
                       strategies=STRATEGIES["backward"], progress=False)
    new = x.copy()
    new[21, 17] += 0.25                        # one cell, inside chunk (2, 2)
    re = store.rerun(parent.id, {"x": new}, progress=False)
    ops = re.rerun_info()["ops"]
    assert ops["x"]["changed"] == {"everywhere": False, "chunks": 1, "cells": 1,
                                   "bounds": [[21, 22], [17, 18]]}
    # the 3x3 mean reaches the cell's 3x3 neighbourhood: one chunk, whose tile alone runs
    assert ops["smooth"]["ran"] == 1 and ops["smooth"]["changed"]["cells"] == 9
    # the median did not move: centre runs the one tile its input changed in
    assert ops["centre"]["statistic"]["changed"] is False and ops["centre"]["ran"] == 1
    full = store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE,
                     strategies=STRATEGIES["backward"], progress=False)
    same(re, full)
    # the median moves: every tile of centre runs (it does not say where it used it)
    new[:5] += 3.0
    re = store.rerun(parent.id, {"x": new}, progress=False)
    ops = re.rerun_info()["ops"]
    assert ops["centre"]["statistic"]["changed"] is True
    assert ops["centre"]["ran"] == ops["centre"]["tiles"]
    same(re, store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE,
                       strategies=STRATEGIES["backward"], progress=False))


def test_an_edit_that_changes_nothing_downstream_is_cut_off(store):
    x, y = data()
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE,
                       strategies=STRATEGIES["backward"], progress=False)
    new = x.copy()
    new[10:13, 20:23] = 7.0                    # the spikes only: replaced by their window mean
    re = store.rerun(parent.id, {"x": new}, progress=False)
    ops = re.rerun_info()["ops"]
    assert ops["smooth"]["ran"] >= 1 and ops["smooth"]["changed"]["chunks"] >= 1
    full = store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE,
                     strategies=STRATEGIES["backward"], progress=False)
    same(re, full)
    # an input no edit touched is one copy in the store still
    assert len(store.inputs()) == 3            # x, the new x, y


def test_the_parents_unchanged_chunks_are_shared_not_copied(store):
    x, y = data()
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, progress=False, keep="all")
    new = x.copy()
    new[0, 0] += 1
    re = store.rerun(parent.id, {"x": new}, progress=False)
    from conftest import stored_path
    a = stored_path(parent.dir, "smooth") / "data" / "c" / "4" / "4"
    b = stored_path(re.dir, "smooth") / "data" / "c" / "4" / "4"
    assert a.stat().st_ino == b.stat().st_ino      # one file, two names
    c = stored_path(re.dir, "smooth") / "data" / "c" / "0" / "0"
    assert c.stat().st_ino != (stored_path(parent.dir, "smooth") / "data" / "c" / "0" / "0").stat().st_ino


def test_a_damaged_parent_chunk_is_recomputed_never_reused(store):
    x, y = data()
    strat = STRATEGIES["backward"]
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, strategies=strat, progress=False,
                       keep="all")
    from conftest import stored_path
    f = stored_path(parent.dir, "plus") / "data" / "c" / "4" / "4"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    new = x.copy()
    new[0, 0] += 1                             # far from the damaged chunk
    re = store.rerun(parent.id, {"x": new}, progress=False)
    full = store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE, strategies=strat, progress=False)
    same(re, full)
    assert re.rerun_info()["ops"]["plus"]["ran"] >= 2    # the edit's tile and the damaged one


def test_damaged_parent_lineage_is_recomputed_never_reused(store):
    x, y = data()
    strat = STRATEGIES["backward"]
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, strategies=strat, progress=False)
    assert spoil_lineage(parent, "spikes")
    new = x.copy()
    new[0, 0] += 1
    re = store.rerun(parent.id, {"x": new}, progress=False)
    ops = re.rerun_info()["ops"]
    assert ops["spikes"]["ran"] == ops["spikes"]["tiles"] and ops["spikes"]["lineage"] == "recomputed"
    full = store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE, strategies=strat, progress=False)
    same(re, full)


def test_lineage_of_an_operator_no_change_reaches_is_copied_from_the_parent(store):
    """An operator no change reaches keeps its parent's lineage as a copy of what the
    parent stored, sealed again for the re-run, where it can (one value per key: not
    R-tree files): the re-run's record gives the parent's write time for those, and
    the R-tree strategies are encoded again from the pairs read back.  The re-run is
    still the full run."""
    x, y = data()
    strat = STRATEGIES["many"]
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, strategies=strat, progress=False)
    new = y.copy()
    new[0, 0] += 1                             # y: read by plus, after five operators
    re = store.rerun(parent.id, {"y": new}, progress=False)

    def written(run):
        return {(o["name"], ps["strategy"]): ps["write_s"] for o in run.steering().record["ops"]
                for ps in o["per_strategy"]}
    was, now = written(parent), written(re)
    kept = [k for k, v in re.rerun_info()["ops"].items() if v["kind"] == "kept"]
    assert {"smooth", "spikes", "centre"} <= set(kept)
    for (op, s), w in now.items():
        copied = op in kept and ":fullone:" in s or op in kept and ":payone:" in s
        assert (w == was[(op, s)]) == copied, (op, s)
    full = store.run(mixed(), inputs={"x": x, "y": new}, tile=TILE, strategies=strat, progress=False)
    same(re, full)


def test_a_rerun_of_an_untrusted_run_is_refused(tmp_path, monkeypatch):
    import subzero
    from subzero.storage.trust import CONFIG_ENV
    st = subzero.open_store(tmp_path / "s")
    x, y = data()
    parent = st.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, progress=False)
    st.close()
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "someone-else"))
    st = subzero.open_store(tmp_path / "s")
    with pytest.raises(UntrustedRun, match=rf"run {parent.id} is not trusted .*a re-run runs its code"):
        st.rerun(parent.id, {"x": x + 1}, progress=False)
    assert [r.id for r in st.runs()] == [parent.id]        # nothing begun
    st.close()


def test_unknown_inputs_and_no_inputs_are_refused(store):
    x, y = data()
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, progress=False)
    with pytest.raises(Exception, match="has no input 'flat'"):
        store.rerun(parent.id, {"flat": x})
    with pytest.raises(Exception, match="needs at least one corrected input"):
        store.rerun(parent.id, {})


# -- cosmic rays: a statistic an operator says where it used -------------------------------
def cr_workflow():
    from subzero.workflows.astronomy import CosmicRays
    wf = Workflow("cr")
    wf.add("cr", CosmicRays(), wf.input("img"))
    return wf


@pytest.fixture(scope="module")
def sky():
    from test_statistic import sky_image
    return sky_image()


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(where=hs.tuples(hs.integers(1, 290), hs.integers(4, 250)), scale=hs.sampled_from([1.5, 0.5, 40.0]))
def test_cosmic_rays_rerun_where_the_sky_median_reaches(store, sky, where, scale):
    parent = store.run(cr_workflow(), inputs={"img": sky}, tile=64, progress=False)
    new = sky.copy()
    r, c = where
    new[r:r + 9, c:c + 9] *= scale             # changes the sky median, and maybe the hits
    re = store.rerun(parent.id, {"img": new}, progress=False)
    full = store.run(cr_workflow(), inputs={"img": new}, tile=64, progress=False)
    same(re, full)


# -- the command line -----------------------------------------------------------------------
def test_rerun_from_the_command_line(tmp_path, cli):
    x, y = data()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    wf = tmp_path / "wf.py"
    here = str(__import__("pathlib").Path(__file__).parent)
    wf.write_text(f"import sys\nsys.path.insert(0, {here!r})\nfrom test_rerun import mixed as workflow\n")
    s = tmp_path / "store"
    code, out, err = cli("run", wf, "--input", f"x={tmp_path / 'x.npy'}", "--input",
                         f"y={tmp_path / 'y.npy'}", "--tile", TILE, "--store", s)
    assert code == 0, err
    fixed = x.copy()
    fixed[5, 5] = 0
    np.save(tmp_path / "fixed.npy", fixed)
    code, out, err = cli("rerun", "1", "--input", f"x={tmp_path / 'fixed.npy'}", "--store", s, "-v")
    assert code == 0, err
    assert "run 2: re-run of run 1 with new x:" in out and "smooth" in out
    code, out, err = cli("show", "2", "--store", s)
    assert code == 0 and "re-run of run 1" in out
    code, out, err = cli("show", "1", "--store", s)
    assert "re-run as run 2" in out
    # every run that read x.npy, again; a second call finds the re-run already made
    code, out, err = cli("rerun", "--using", tmp_path / "x.npy", "--input", f"x={tmp_path / 'fixed.npy'}",
                         "--store", s, "--json")
    assert code == 0, err
    made = json.loads(out)
    assert [m["parent"] for m in made] == [1]
    code, out, err = cli("rerun", "--using", tmp_path / "x.npy", "--input", f"x={tmp_path / 'fixed.npy'}",
                         "--store", s, "--json")
    assert [m["run_id"] for m in json.loads(out)] == [m["run_id"] for m in made]
    # the run as every command takes it, --run (the positional is an alias)
    code, out, err = cli("rerun", "--run", "1", "--input", f"x={tmp_path / 'fixed.npy'}",
                         "--store", s, "--json")
    assert code == 0 and json.loads(out)[0]["parent"] == 1, err
    code, out, err = cli("rerun", "1", "--run", "2", "--input", f"x={tmp_path / 'fixed.npy'}",
                         "--store", s)
    assert code == 2 and "two runs given" in err
    # mistakes: one line, exit 2
    code, out, err = cli("rerun", "1", "--input", f"x={tmp_path / 'nope.npy'}", "--store", s)
    assert code == 2 and "file not found" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli("rerun", "1", "--input", f"flat={tmp_path / 'fixed.npy'}", "--store", s)
    assert code == 2 and "no input 'flat'" in err
    code, out, err = cli("rerun", "--store", s, "--input", f"x={tmp_path / 'fixed.npy'}")
    assert code == 2 and "needs a run" in err


# -- the real astronomy workflow, and a parent made on Spark -------------------------------
ASTRO = str(__import__("pathlib").Path(__file__).resolve().parent.parent / "workflows" / "astronomy.py")


def test_a_flat_fix_on_the_real_exposures_recomputes_a_few_tiles(store):
    parent = store.run(ASTRO, progress=False)
    flat = np.asarray(parent.array("flat").values).copy()
    flat[700:764, 200:264] *= 1.01             # a 64x64 patch of the flat, corrected
    re = store.rerun(parent.id, {"flat": flat}, progress=False)
    ops = re.rerun_info()["ops"]
    for name in ("linearity_1", "badpix_2", "overscanmean_1", "bias_2"):
        assert ops[name]["kind"] == "kept"        # upstream of the flat: the parent's
    for name in ("flat_1", "rmbg_2", "cr_1", "cr_2", "combine", "rmcr"):
        assert ops[name]["ran"] < ops[name]["tiles"], name
    assert ops["stars"]["kind"] == "whole"        # connected components run whole
    full = store.run(ASTRO, inputs={"flat": flat}, progress=False)
    same(re, full)
    # the exposures and the other frames are still one copy each in the store
    stored = {e["digest"]: e["stored"]["copies"] for e in store.inputs()}
    assert len(stored) == 6 and set(stored.values()) == {1}


def test_a_rerun_of_a_spark_run_equals_a_full_spark_run(spark, store):
    x, y = data()
    strat = STRATEGIES["backward"]
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, strategies=strat,
                       engine="spark", spark=spark, progress=False)
    new = x.copy()
    new[30:33, 2:6] -= 2.0
    re = store.rerun(parent.id, {"x": new}, progress=False)
    full = store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE, strategies=strat,
                     engine="spark", spark=spark, progress=False)
    same(re, full)
    assert re.rerun_info()["ops"]["smooth"]["ran"] < re.rerun_info()["ops"]["smooth"]["tiles"]


def test_a_replaced_statistics_file_is_not_used(store):
    """The parent's kept merged states are bound by its signed record: a file that is
    not the one the record names is ignored (the statistic is computed whole)."""
    x, y = data()
    strat = STRATEGIES["backward"]
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, strategies=strat, progress=False)
    f = parent.dir / "statistics" / "centre.npz"
    assert f.is_file()
    other = store.run(mixed(), inputs={"x": x * 2, "y": y}, tile=TILE, strategies=strat, progress=False)
    f.write_bytes((other.dir / "statistics" / "centre.npz").read_bytes())
    new = x.copy()
    new[3, 3] -= 1
    re = store.rerun(parent.id, {"x": new}, progress=False)
    assert re.rerun_info()["ops"]["centre"]["statistic"]["recomputed"] is True    # not "updated"
    same(re, store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE, strategies=strat,
                       progress=False))


def test_runs_show_and_the_explorer_say_a_run_is_a_rerun(store, cli):
    x, y = data()
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, progress=False)
    new = x.copy()
    new[1, 1] += 1
    re = store.rerun(parent.id, {"x": new}, progress=False)
    code, out, err = cli("runs", "--store", store.path)
    line = next(ln for ln in out.splitlines() if ln.strip().startswith(str(re.id)))
    assert f"re-run of {parent.id}" in line
    code, out, err = cli("runs", "--store", store.path, "--json")
    assert {r["id"]: r["parent"] for r in json.loads(out)} == {parent.id: None, re.id: parent.id}
    from subzero.explore.session import Session
    s = Session(store.path, re.id)
    info = s.describe()
    assert info["rerun"]["parent"] == parent.id and info["rerun"]["inputs"] == ["x"]
    assert 0 < info["rerun"]["recomputed"] < info["rerun"]["tiles"]
    by = {a["name"]: a["rerun"] for a in info["arrays"]}
    assert by["x"] == {"how": "input", "tiles": None, "recomputed": None, "changed_chunks": 1}
    assert by["y"] is None and by["smooth"]["how"] == "tiles" and by["smooth"]["recomputed"] == 1
    assert Session(store.path, parent.id).describe()["rerun"] is None


def test_many_reruns_as_a_spark_job_equal_reruns_in_process(spark, tmp_path):
    """Every run that read an input, re-run as one Spark job (a task per run), equals the
    same re-runs made one by one in this process; a second call finds them all done."""
    import subzero
    x, y = data()
    old = tmp_path / "x.npy"
    np.save(old, x)
    fixed = x.copy()
    fixed[17:20, 9:12] += 1.5
    np.save(tmp_path / "fixed.npy", fixed)
    strat = STRATEGIES["backward"]
    stores = []
    for where in ("spark", "local"):
        st = subzero.open_store(tmp_path / where)
        for k in range(3):
            st.run(mixed(), inputs={"x": str(old), "y": y + k}, tile=TILE, strategies=strat, progress=False)
        stores.append(st)
    on_spark = stores[0].rerun_using(old, tmp_path / "fixed.npy", name="x", engine="spark",
                                     spark=spark, progress=False)
    local = stores[1].rerun_using(old, tmp_path / "fixed.npy", name="x", progress=False)
    assert [r.rerun_info()["parent"] for r in on_spark] == [1, 2, 3]
    for a, b in zip(on_spark, local):
        same(a, b)
        assert a.rerun_info()["ops"]["smooth"]["ran"] == b.rerun_info()["ops"]["smooth"]["ran"]
    again = stores[0].rerun_using(old, tmp_path / "fixed.npy", name="x", engine="spark",
                                  spark=spark, progress=False)
    assert [r.id for r in again] == [r.id for r in on_spark]
    for st in stores:
        st.close()


def test_a_rerun_killed_midway_resumes_or_cleans_and_its_parent_stays_whole(tmp_path, cli):
    """SIGKILL in the middle of a re-run (some chunks already linked to the parent's):
    `run --resume` finishes it into the run a full run makes; `clean` of another killed
    one removes only its own folder -- the parent's chunks it linked stay the parent's."""
    import subprocess
    import sys

    import subzero
    here = __import__("pathlib").Path(__file__).parent
    x, y = data()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    fixed = x.copy()
    fixed[30:35, 25:30] *= 2
    np.save(tmp_path / "fixed.npy", fixed)
    wf = tmp_path / "wf.py"
    wf.write_text(f"import sys\nsys.path.insert(0, {str(here)!r})\nfrom test_rerun import mixed as workflow\n")
    s = tmp_path / "store"
    code, out, err = cli("run", wf, "--input", f"x={tmp_path / 'x.npy'}", "--input",
                         f"y={tmp_path / 'y.npy'}", "--tile", TILE, "--store", s)
    assert code == 0, err
    parent_before = {n: subzero.open_store(s).get(1).read_region(n, (slice(None),) * 2).tobytes()
                     for n in ("smooth", "plus")}
    kill = [sys.executable, str(here / "crashpoint.py"),
            "subzero.engines.incremental:IncrementalEngine._run_some", "3", "--",
            "rerun", "1", "--input", f"x={tmp_path / 'fixed.npy'}", "--store", str(s)]
    for _ in range(2):
        p = subprocess.run(kill, capture_output=True, text=True, timeout=300)
        assert p.returncode == -9, p.stderr
    code, out, err = cli("run", "--resume", "2", "--store", s)
    assert code == 0, err
    info = subzero.open_store(s).get(2).rerun_info()        # still a re-run, of its parent
    assert info["parent"] == 1 and info["inputs"] == ["x"]
    kinds = {v["kind"] for v in info["ops"].values()}
    assert "resumed" in kinds and kinds & {"tiles", "kept", "whole"}
    code, out, err = cli("clean", "--store", s)
    assert code == 0, err
    st = subzero.open_store(s)
    assert [(r.id, r.status) for r in st.runs()] == [(1, "complete"), (2, "complete"), (3, "failed")]
    full = st.run(wf, inputs={"x": fixed, "y": y}, tile=TILE, progress=False)
    same(st.get(2), full)
    for n, raw in parent_before.items():
        assert st.get(1).read_region(n, (slice(None),) * 2).tobytes() == raw
    code, out, err = cli("fsck", "--store", s)
    assert code == 0, out + err
    st.close()


def test_genomics_a_few_patients_corrected(store):
    """A table of strings (the medulloblastoma features): a correction a feature the model
    does not read stops at the operator that reads it; one it reads reaches the model."""
    from subzero.workflows import genomics as G
    parent = store.run(G.workflow(), progress=False)
    values = np.asarray(parent.array("matrix").values)
    unused = next(r for r in range(2, values.shape[0]) if values[r, 0] not in G.FEATURES)
    used = next(r for r in range(2, values.shape[0]) if values[r, 0] in G.FEATURES)
    for r, reaches in ((unused, False), (used, True)):
        fixed = values.copy()
        levels = sorted(set(values[r, 4:].tolist()) - {""})
        fixed[r, 10] = next(v for v in levels if v != values[r, 10])
        re = store.rerun(parent.id, {"matrix": fixed}, progress=False)
        ops = re.rerun_info()["ops"]
        assert ops["matrix"]["changed"]["cells"] == 1
        assert (ops["model"]["kind"] != "kept") is reaches
        same(re, store.run(G.workflow(), inputs={"matrix": fixed}, progress=False))
