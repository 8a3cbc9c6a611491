"""The cost model's error model (how far the calibration says a prediction can be
trusted, by kind and size of step) and the R-tree probe count it prices.  Pure: no
workflow runs."""

import math

import numpy as np
import pytest

from subzero.model.cellset import CellSet
from subzero.model.strategy import parse_one
from subzero.optimizer.costmodel import CostModel, error_kind, error_table
from subzero.optimizer.stats import WorkflowStats
from subzero.query.planner import runs_of
from subzero.tuning import DEFAULT_MARGIN, ERROR_BUCKET_MIN_STEPS, ERROR_BUCKETS, EXTRAPOLATION_GROWTH


def _model(errors) -> CostModel:
    from subzero.optimizer.costmodel import FEATURES
    cal = {"coef": {f: [0.0] * len(v) for f, v in FEATURES.items()}, "errors": errors}
    return CostModel(cal, WorkflowStats("w", {}, 1.0, {}))


def test_error_table_buckets_by_size_and_quantiles():
    rng = np.random.default_rng(0)
    obs = []
    for edge, spread in zip((*ERROR_BUCKETS, 10**6), (1.2, 1.5, 2.0, 3.0)):
        for n in rng.integers(max(edge // 8, 1), edge, 40):
            obs += [("reexec", int(n), float(r)) for r in rng.uniform(1 / spread, spread, 1)]
    table = error_table(obs)["reexec"]
    his = [b[1] for b in table["buckets"]]
    assert len(his) == 4 and his == sorted(his)          # wider errors for bigger steps here
    assert all(b[2] <= 1.0 <= b[1] for b in table["buckets"])
    rs = np.array([r for _, n, r in obs if n <= ERROR_BUCKETS[0]])
    assert table["buckets"][0][1] == pytest.approx(max(1.0, np.quantile(rs, 0.9)))


def test_a_bucket_with_few_steps_joins_the_next():
    few, enough = ERROR_BUCKET_MIN_STEPS - 1, 2 * ERROR_BUCKET_MIN_STEPS
    obs = [("map", 10, 1.5)] * few + [("map", 1000, 1.1)] * enough
    buckets = error_table(obs)["map"]["buckets"]
    assert len(buckets) == 1 and buckets[0][3] == few + enough


def test_margin_widens_beyond_the_calibrated_sizes():
    obs = [("stored.index.one.full", n, 1.5) for n in (10, 100, 1000, 5000)] * 5
    model = _model(error_table(obs))
    kind = "stored.index.one.full"
    assert model.margin(kind, 100)[1] == pytest.approx(1.5)
    lo, hi = model.margin(kind, 5000 * 100)              # two decades beyond: wider both ways
    grow = 1 + EXTRAPOLATION_GROWTH * 2
    assert hi == pytest.approx(1.5 * grow) and lo == pytest.approx(1.0 / grow)
    assert model.margin("reexec", 10) == (1 / DEFAULT_MARGIN, DEFAULT_MARGIN)   # never measured
    assert _model(None).margin(kind, 10) == (1 / DEFAULT_MARGIN, DEFAULT_MARGIN)


def test_error_kinds_follow_how_a_step_reads():
    fo = parse_one("full:fullone:backward")
    pm = parse_one("pay:paymany:forward")
    assert error_kind(fo, True) == "stored.index.one.full"
    assert error_kind(fo, False) == "stored.scan.one.full"
    assert error_kind(pm, False) == "stored.index.many.pay"
    assert error_kind("stored:pay:paymany:forward", True) == "stored.scan.many.pay"
    assert error_kind("reexec", True) == "reexec" and error_kind("map", False) == "map"


@pytest.mark.parametrize("seed", range(30))
def test_runs_of_counts_row_runs_in_every_form(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(1, 40, rng.integers(1, 4)))
    bm = rng.random(shape) < rng.choice([0.01, 0.1, 0.5, 0.95])
    rows = bm.reshape(-1, shape[-1])
    want = int(sum(np.count_nonzero(np.diff(np.concatenate(([0], r.astype(int)))) == 1) for r in rows))
    ids = np.flatnonzero(bm.ravel())
    assert runs_of(CellSet.of_sorted(ids, shape)) == want
    assert runs_of(CellSet.of_bitmap(bm)) == want
    assert runs_of(CellSet.everything(shape)) == math.prod(shape[:-1])
