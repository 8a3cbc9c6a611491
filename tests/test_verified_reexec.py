"""Re-execution proves itself: a re-run operator must reproduce the stored output on the
region a trace uses, or the trace stops naming the operator as not deterministic
(issue 11: an operator with unseeded random numbers gave 25, 27 and 23 cells for the
same trace).  ``deterministic = False`` with a strategy that leaves traces to
re-execution is refused when the run starts, not when it is traced."""

import re

import numpy as np
import pytest
from conftest import EXAMPLE

import subzero
from subzero import Mode, Operator, Workflow, window
from subzero.cli import cli_terms
from subzero.errors import CorruptArray, QueryError, StrategyError

SHAPE = (40, 50)


def image():
    rng = np.random.default_rng(3)
    return rng.normal(size=SHAPE)


class Speckle(Operator):
    """Flags pixels above a noisy threshold: every output depends on its 3x3 window.
    The noise is unseeded, so each run flags different pixels (deterministic is left at
    its default, True: the author forgot)."""

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        noisy = x + np.random.default_rng().normal(size=x.shape)
        mask = noisy > 1.0
        if Mode.FULL in ctx.modes:
            hits = np.argwhere(mask)
            ctx.lwrite(hits, [window(c, 1, x.shape) for c in hits], each=True)
        return mask


class Flags(Speckle):
    """The same without the noise: deterministic, and its output has NaN (NaN != NaN must
    not count as a difference)."""

    def run(self, ctx, x):
        mask = x > 1.0
        if Mode.FULL in ctx.modes:
            hits = np.argwhere(mask)
            ctx.lwrite(hits, [window(c, 1, x.shape) for c in hits], each=True)
        return np.where(mask, np.nan, x)


class Drifting(Flags):
    """Deterministic values, but each run returns another dtype or shape."""

    def __init__(self, change):
        self.change, self.runs = change, 0

    def run(self, ctx, x):
        out = super().run(ctx, x)
        self.runs += 1
        if self.runs > 1:
            return out.astype(np.float32) if self.change == "dtype" else out[:, :-1]
        return out


def wf_of(op):
    wf = Workflow("speckle")
    x = wf.input("x")
    wf.add("spk", op, x)
    return wf


def test_unseeded_random_operator_is_caught_not_answered(store):
    run = store.run(wf_of(Speckle()), inputs={"x": image()}, strategies={"spk": "blackbox"})
    cells = np.argwhere(run.array("spk").values)[:5]
    for direction in ("backward", "forward"):
        with pytest.raises(QueryError) as e:
            if direction == "backward":
                run.trace("spk", cells, to="x")
            else:
                run.trace("x", [(20, 20), (5, 7)], to="spk")
        msg = str(e.value)
        assert "operator 'spk' is not deterministic: its re-run output differs from the stored " \
               "output" in msg and "\n" not in msg, msg
        assert re.search(r"\(at cell \(\d+, \d+\): (True|False) instead of (True|False)\)", msg)
        assert "`strategies={'spk': 'full'}`" in msg and "--strategy spk=full" in cli_terms(msg)


def test_forward_trace_with_no_answer_still_checks_a_sample(store):
    """An empty answer has no cells to compare: the first tile is compared instead."""
    x = np.full(SHAPE, -50.0)                      # nothing is ever flagged ...
    x[0, :] = 0.0                                  # ... except, at random, on row 0
    run = store.run(wf_of(Speckle()), inputs={"x": x}, strategies={"spk": "blackbox"})
    with pytest.raises(QueryError, match="'spk' is not deterministic"):
        run.trace("x", [(39, 49)], to="spk")


def test_same_operator_with_stored_lineage_traces(store):
    """Stored lineage records what the run did; no re-run, nothing to prove."""
    run = store.run(wf_of(Speckle()), inputs={"x": image()}, strategies={"spk": "full"})
    cells = np.argwhere(run.array("spk").values)[:5]
    assert len(run.trace("spk", cells, to="x")) > 0


def test_deterministic_rerun_with_nan_output_answers(store):
    x = image()
    bb = store.run(wf_of(Flags()), inputs={"x": x}, strategies={"spk": "blackbox"})
    full = store.run(wf_of(Flags()), inputs={"x": x}, strategies={"spk": "full"})
    flagged = np.argwhere(x > 1.0)
    assert np.isnan(bb.array("spk").values[tuple(flagged[0])])
    for start, cells, to in (("spk", flagged[:7], "x"), ("x", flagged[:7] + 1, "spk")):
        got = bb.trace(start, cells, to=to)
        assert got.steps[0].method == "reexec:full"
        assert np.array_equal(got.bitmap, full.trace(start, cells, to=to).bitmap)


@pytest.mark.parametrize("change, what", [("dtype", "dtype float32 instead of float64"),
                                           ("shape", "shape (40, 49) instead of (40, 50)")])
def test_rerun_with_another_dtype_or_shape_is_caught(store, change, what):
    run = store.run(wf_of(Drifting(change)), inputs={"x": image()}, strategies={"spk": "blackbox"})
    with pytest.raises(QueryError, match=rf"'spk' is not deterministic: .*stored output \({re.escape(what)}\)"):
        run.trace("spk", [(1, 1)], to="x")


def test_damaged_stored_output_stops_the_reexecution(store):
    run = store.run(EXAMPLE, tile=32, strategies={"stars": "blackbox"})
    (run.dir / "arrays" / "stars.zarr" / "data" / "c" / "1" / "2").unlink()
    with pytest.raises(CorruptArray, match=r"array 'stars' of run \d+ is damaged: chunk file "
                                           r".*stars\.zarr/data/c/1/2 is missing"):
        run.trace("stars", [(40, 70)], to="clean")


def test_rerun_reads_only_the_output_region_it_checks(store):
    """The check reads the stored output's chunks under the query's bounding box, not the
    whole array: a damaged chunk elsewhere does not stop the trace."""
    run = store.run(EXAMPLE, tile=32, strategies={"stars": "blackbox"})
    ref = store.run(EXAMPLE, tile=32, strategies={"stars": "full"})
    (run.dir / "arrays" / "stars.zarr" / "data" / "c" / "0" / "0").unlink()
    got = run.trace("stars", [(40, 70)], to="clean")
    assert got.steps[0].method.startswith("reexec")
    assert np.array_equal(got.bitmap, ref.trace("stars", [(40, 70)], to="clean").bitmap)


# -- deterministic = False: refused at run time when only re-execution could trace ----------

class Noisy(Speckle):
    deterministic = False


class NoisyBlackBox(Operator):
    """No lineage of its own: a trace answers all-to-all and never re-runs it."""

    deterministic = False

    def run(self, ctx, x):
        return x + np.random.default_rng().normal(size=x.shape)


def test_nondeterministic_blackbox_is_refused_before_the_run(store):
    with pytest.raises(StrategyError) as e:
        store.run(wf_of(Noisy()), inputs={"x": image()}, strategies={"spk": "blackbox"})
    msg = str(e.value)
    assert msg.startswith("operator 'spk' (Noisy) is declared not deterministic") and "\n" not in msg
    assert "`strategies={'spk': 'blackbox'}`" not in msg and "--strategy spk=" in cli_terms(msg)
    assert store.runs() == []                      # nothing ran, no failed run recorded


def test_nondeterministic_with_stored_lineage_or_no_lineage_runs(store):
    run = store.run(wf_of(Noisy()), inputs={"x": image()}, strategies={"spk": "full"})
    cells = np.argwhere(run.array("spk").values)[:3]
    assert len(run.trace("spk", cells, to="x")) > 0
    run = store.run(wf_of(NoisyBlackBox()), inputs={"x": image()})
    assert run.trace("spk", [(0, 0)], to="x").bitmap.all()


def test_nondeterministic_blackbox_cli_is_one_line(cli, tmp_path):
    mod = tmp_path / "noisy_wf.py"
    mod.write_text(
        "import numpy as np\n"
        "from subzero import Mode, Operator, Workflow\n"
        "class Noisy(Operator):\n"
        "    deterministic = False\n"
        "    def supported_modes(self):\n"
        "        return {Mode.FULL, Mode.BLACKBOX}\n"
        "    def run(self, ctx, x):\n"
        "        return x + np.random.default_rng().normal(size=x.shape)\n"
        "def workflow():\n"
        "    wf = Workflow('noisy')\n"
        "    wf.add('noise', Noisy(), wf.input('x', default=np.zeros((4, 4))))\n"
        "    return wf\n")
    code, out, err = cli("run", mod, "--store", tmp_path / "st", "--strategy", "noise=blackbox")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "operator 'noise' (Noisy) is declared not deterministic" in lines[0]
    st = subzero.open_store(tmp_path / "st")
    try:
        assert st.runs() == []
    finally:
        st.close()
