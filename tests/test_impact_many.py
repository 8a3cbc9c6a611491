"""An impact query over many runs (issue 29, "a night, not a run"): runs answered
in parallel -- a pool of this process's forks, or a Spark job over runs -- with
the same answers as one after another; its outputs (table, plot, PROV,
OpenLineage); the labels of affected objects; untrusted runs named, never
skipped."""

import json
import shutil

import numpy as np
import pytest
from conftest import EXAMPLE

import subzero
from subzero.query import many
from subzero.workflows.example import flat_field, synthetic_sky

BAD_COLUMN = "0:64,37"


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """Five runs sharing one flat, on five skies."""
    d = tmp_path_factory.mktemp("night")
    flat = flat_field()
    np.save(d / "flat.npy", flat)
    with subzero.open_store(d / "store") as st:
        for k in range(5):
            sky = np.roll(synthetic_sky(), (k, 2 * k), axis=(0, 1))
            st.run(EXAMPLE, inputs={"raw": sky, "flat": d / "flat.npy"}, tile=32, progress=False)
    return d, flat


@pytest.fixture
def store(night, tmp_path):
    d, _ = night
    shutil.copytree(d / "store", tmp_path / "store")
    st = subzero.open_store(tmp_path / "store")
    yield st
    st.close()


def answers(imp):
    """An impact as plain data, without the timings."""
    got = imp.as_dict()
    for r in got["runs"]:
        r.pop("seconds")
    return got


def one_by_one(st, flat, cells, to=None):
    """The oracle: each run's own forward traces."""
    out = {}
    for rid, inp in st.runs_using(flat):
        with st.get(rid) as run:
            for t in to or ["smooth", "stars"]:
                out[rid, t] = run.trace(inp, cells, to=t, record=False).cells
    return out


def test_a_pool_of_workers_answers_as_one_process_does(night, store, monkeypatch):
    _, flat = night
    alone = store.impact(flat, BAD_COLUMN, engine="local", progress=False)
    monkeypatch.setattr(many, "IMPACT_RUNS_PER_WORKER", 1)       # five runs: two workers
    pooled = store.impact(flat, BAD_COLUMN, engine="local", progress=False)
    assert answers(pooled) == answers(alone)
    want = one_by_one(store, flat, BAD_COLUMN)
    for r in pooled.runs:
        for t in r.targets:
            assert np.array_equal(t.cells, want[r.run_id, t.array])


def test_spark_answers_as_in_process(night, store, spark):
    _, flat = night
    local = store.impact(flat, BAD_COLUMN, to=["clean", "stars"], engine="local", progress=False)
    on_spark = store.impact(flat, BAD_COLUMN, to=["clean", "stars"], engine="spark", spark=spark,
                            progress=False)
    assert [r.run_id for r in on_spark.runs] == [1, 2, 3, 4, 5]
    assert answers(on_spark) == answers(local)
    want = one_by_one(store, flat, BAD_COLUMN, to=["clean", "stars"])
    for r in on_spark.runs:
        assert r.error is None
        for t in r.targets:
            assert np.array_equal(t.cells, want[r.run_id, t.array])


def test_the_engine_is_chosen_by_the_number_of_runs():
    from subzero.engines.choice import EngineRequest, impact_engine
    from subzero.tuning import SPARK_PAYS_RUNS
    assert impact_engine(None, 5).engine == "local"
    assert impact_engine("auto", SPARK_PAYS_RUNS, java_version=lambda: 17).engine == "spark"
    assert impact_engine("auto", SPARK_PAYS_RUNS, java_version=lambda: None).engine == "local"
    assert impact_engine("local", 10 * SPARK_PAYS_RUNS).engine == "local"
    assert impact_engine(EngineRequest(None, "spark://head:7077"), 2).engine == "spark"
    with pytest.raises(subzero.SubZeroError, match="unknown engine 'gpu'"):
        impact_engine("gpu", 3)


def test_progress_counts_the_runs(night, store):
    from subzero.engines.progress import Progress
    _, flat = night

    class Seen(Progress):
        def __init__(self):
            self.events = []

        def begin(self, total, desc, unit="op"):
            self.events.append(("begin", total, unit))

        def finished(self, name):
            self.events.append(("finished", name))

    seen = Seen()
    store.impact(flat, BAD_COLUMN, progress=seen)
    assert seen.events[0] == ("begin", 5, "run")
    assert [e[1] for e in seen.events[1:]] == [f"run {k}" for k in range(1, 6)]


def test_impact_from_the_command_line_on_both_engines(night, store, shell):
    d, _ = night
    got = {}
    for engine in ("local", "spark"):
        code, out, err = shell("impact", "--input", d / "flat.npy", "--cells", BAD_COLUMN, "--to", "stars",
                               "--engine", engine, "--store", store.path, "--json")
        assert code == 0, err
        got[engine] = json.loads(out)
        for r in got[engine]["runs"]:
            r.pop("seconds")
    assert got["spark"] == got["local"]


# -- the labels of affected objects ----------------------------------------------------------
def test_the_stars_a_column_touches_are_listed_by_id(night, store):
    _, flat = night
    y, x = np.argwhere(np.asarray(store.get(1).array("stars")) > 0)[0]
    box = f"{max(0, y - 3)}:{y + 4},{max(0, x - 3)}:{x + 4}"      # around a star of run 1
    imp = store.impact(flat, box, to="stars", progress=False)
    assert imp.runs[0].targets[0].objects["ids"]
    for r in imp.runs:
        (t,) = r.targets
        stars = np.asarray(store.get(r.run_id).array("stars"))
        ids = np.unique(stars[tuple(t.cells.T)])
        assert t.objects.get("ids", []) == ids[ids != 0].tolist()
        assert r.as_dict()["targets"][0].get("objects", {}).get("ids", []) == t.objects.get("ids", [])


def test_labelled_axes_list_the_labels_of_the_cells_touched(tmp_path):
    import xarray as xr
    ys, xs = np.arange(64) * 0.5, np.arange(96) + 100.0
    sky = xr.DataArray(synthetic_sky(), dims=("y", "x"), coords={"y": ys, "x": xs})
    with subzero.open_store(tmp_path / "s") as st:
        st.run(EXAMPLE, inputs={"raw": sky}, tile=32, progress=False)
        imp = st.impact(sky, "10:12,40:42", to="smooth", progress=False)
        (t,) = imp.runs[0].targets
        assert t.objects == {"y": ys[9:13].tolist(), "x": xs[39:43].tolist()}
        assert t.where["labels"] == {"y": [ys[9], ys[12]], "x": [xs[39], xs[42]]}
