"""Fused Spark stages: which operators share a job, the regions a tile's operators
read as halos accumulate, and arrays and lineage identical to the local engine
for chains and branches of stencils over odd tiles and tiles smaller than the
accumulated halo."""

import re

import numpy as np
import pytest

from subzero import Workflow
from subzero.capture.tiles import tile_plan
from subzero.engines.spark.stages import Member, grow, last_readers, next_stage, plan_boxes, union
from subzero.operators import Add, MaxFilter, MeanFilter, Mul, Sum


def test_boxes_grow_with_the_halos_downstream():
    """a (r=1) -> b (r=2) -> c (elementwise): c reads its core; b must produce what c
    reads and reads 2 more; a produces that and reads 1 more; clipped at the edges."""
    ms = [Member("a", None, ("x",), (), 1), Member("b", None, ("a",), (), 2),
          Member("c", None, ("b", "a"), (), 0)]
    core = ((10, 20), (0, 5))
    boxes = plan_boxes(ms, core, (100, 8))
    assert boxes["c"] == (core, core)
    assert boxes["b"] == (core, ((8, 22), (0, 7)))
    assert boxes["a"] == (((8, 22), (0, 7)), ((7, 23), (0, 8)))
    assert last_readers(ms) == {"a": 2, "b": 2, "c": 2}
    assert grow(((0, 3),), 5, (4,)) == ((0, 4),)
    assert union(((1, 3), (5, 6)), ((0, 2), (7, 9))) == ((0, 3), (5, 9))


def branchy(radii=(1, 2, 1)):
    """Two branches of stencils, joined, a reduction (not tile-parallel) in between."""
    wf = Workflow("branchy")
    x, y = wf.input("x"), wf.input("y")
    a1 = wf.add("a1", MeanFilter(size=2 * radii[0] + 1, mode="reflect"), x)
    a2 = wf.add("a2", MaxFilter(size=2 * radii[1] + 1, mode="nearest"), a1)
    b1 = wf.add("b1", MeanFilter(size=2 * radii[2] + 1, mode="reflect"), y)
    j = wf.add("join", Mul(), a2, b1)
    s = wf.add("total", Sum(), j)
    wf.add("after", MeanFilter(size=3, mode="reflect"), wf.add("again", Add(), j, a1))
    return wf, s


def test_next_stage_takes_branches_and_stops_at_barriers():
    wf, _ = branchy()
    shapes = {"x": (9, 9), "y": (9, 9)}
    order = list(wf.order())
    stage = next_stage(wf, order, shapes, tile_plan)
    assert set(stage) == {"a1", "a2", "b1", "join", "again", "after"}
    assert "total" not in stage
    assert next_stage(wf, ["total"], {**shapes, **{n: (9, 9) for n in stage}}, tile_plan) == ["total"]
    # an input of another shape starts no stage with the first
    assert next_stage(wf, ["join"], {"a2": (9, 9), "b1": (8, 9)}, tile_plan) == ["join"]


STRATS = {"a1": "full:fullone:backward", "a2": "full:fullmany:forward",
          "b1": "full:fullone:forward+full:fullone:backward", "join": "full", "again": "full",
          "after": "full:fullmany:backward"}


@pytest.mark.parametrize("tile,radii", [(7, (1, 2, 1)), (5, (2, 3, 1)), (16, (1, 1, 4)),
                                        (4, (3, 1, 2))])
def test_fused_stage_identical_to_local(spark, store, tile, radii):
    """Odd tiles, and tiles smaller than the accumulated halo (tile 4 with halos 1+1+3)."""
    from test_spark import same_runs
    rng = np.random.default_rng(sum(radii) * tile)
    ins = {"x": rng.normal(size=(23, 17)), "y": rng.normal(size=(23, 17))}
    wf, _ = branchy(radii)
    sp = store.run(wf, inputs=ins, engine="spark", spark=spark, tile=tile, strategies=STRATS,
                   progress=False)
    lo = store.run(wf, inputs=ins, strategies=STRATS)
    log = (sp.dir / "run.log").read_text()
    assert "stage of 6 operators" in log, log
    widest = max(1 + radii[1] + radii[0], 1 + radii[2])     # after <- join <- a2 <- a1 / b1
    assert f"halos accumulated up to {widest}" in log, log
    assert re.search(r"stage done in [0-9.]+ s; largest worker peak memory [0-9]+ MB", log), log
    same_runs(sp, lo, [("after", [(0, 0), (11, 8), (22, 16)], "x"), ("x", [(5, 5), (0, 16)], "after"),
                       ("join", [(3, 4)], "y"), ("y", [(22, 0)], "join"),
                       ("total", [(0,)], "y")])
    assert [o["name"] for o in sp.ops()] != []
    assert {o["name"]: o["pairs"] for o in sp.ops()} == {o["name"]: o["pairs"] for o in lo.ops()}


@pytest.mark.parametrize("jobs", [1, 4])
def test_independent_global_operators_share_one_job(spark, store, monkeypatch, jobs):
    """Two branches' global operators (a transpose each, as the two exposures'
    cosmic-ray detections are) run side by side: one job, one task each, when the
    engine submits one job at a time; concurrent jobs when it submits several
    (``concurrent_jobs``).  A global operator that reads one of them waits for it."""
    from subzero.engines.spark import SparkEngine
    monkeypatch.setattr(SparkEngine, "concurrent_jobs", jobs)
    from test_spark import same_runs

    from subzero.operators import Rebin, Transpose
    wf = Workflow("two-globals")
    x, y = wf.input("x"), wf.input("y")
    tx = wf.add("tx", Transpose(), wf.add("sx", MeanFilter(size=3), x))
    ty = wf.add("ty", Transpose(), y)
    wf.add("r", Rebin((2, 2)), wf.add("j", Add(), tx, ty))
    wf.add("tt", Transpose(), tx)
    rng = np.random.default_rng(5)
    ins = {"x": rng.normal(size=(14, 10)), "y": rng.normal(size=(14, 10))}
    strats = {"tx": "full", "ty": "full:fullmany:forward", "tt": "full", "r": "full"}
    sp = store.run(wf, inputs=ins, engine="spark", spark=spark, tile=4, strategies=strats,
                   progress=False)
    lo = store.run(wf, inputs=ins, strategies=strats)
    log = (sp.dir / "run.log").read_text()
    together = [set(m.split(", ")) for m in re.findall(r"2 independent global operators \((.*?)\)", log)]
    if jobs == 1:
        # tt reads tx, so it waits for the next job (with r, once j is stored)
        assert together == [{"tx", "ty"}, {"tt", "r"}], log
    else:
        lines = log.splitlines()
        assert lines.index("tt: global operator, one task on the whole array") > \
            next(i for i, ln in enumerate(lines) if ln.strip().startswith("tx done")), log
    same_runs(sp, lo, [("r", [(0, 0), (4, 6)], "x"), ("x", [(13, 9)], "tt"),
                       ("ty", [(3, 2)], "y"), ("y", [(13, 0)], "r")])
    assert {o["name"]: o["pairs"] for o in sp.ops()} == {o["name"]: o["pairs"] for o in lo.ops()}
