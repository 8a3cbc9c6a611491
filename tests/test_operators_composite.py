"""WindowComposite: identity lineage, plus a window around flagged cells.

The expected relation is built here with plain loops (flagged output cell ->
its clipped window, any other -> itself) and compared with what every way of
answering a trace gives: stored Full pairs, Comp and Pay payloads through
``map_p``/``map_p_pairs``, and re-execution; a perturbation oracle checks that
the relation covers what the operator really does.
"""

import itertools

import numpy as np
import pytest

import subzero
from subzero import LineageError
from subzero.operators import WindowComposite, box_payload, radius_payload
from subzero.operators.composite import box_cells
from subzero.operators.testing import mapping_context, perturbation_relation, traced_relation


class Despike(WindowComposite):
    """Replace cells above a threshold by the mean of their window (all inputs summed)."""

    lineage_modes = frozenset({subzero.Mode.FULL, subzero.Mode.COMP, subzero.Mode.PAY,
                               subzero.Mode.BLACKBOX})

    def __init__(self, radius: int = 1, threshold: float = 5.0):
        self.radius, self.threshold = radius, threshold

    def compute_flagged(self, *arrays):
        a = np.sum([np.asarray(x, float) for x in arrays], axis=0)
        hot = a > self.threshold
        out = a.copy()
        for c in np.argwhere(hot):          # small test arrays: clarity over speed
            sl = tuple(slice(max(0, x - self.radius), x + self.radius + 1) for x in c)
            out[tuple(c)] = a[sl].mean()
        return out, hot


def expected_relation(flagged: np.ndarray, radius: int) -> np.ndarray:
    """R[o, j] by brute force."""
    shape = flagged.shape
    n = flagged.size
    rel = np.zeros((n, n), bool)
    for o, c in enumerate(itertools.product(*map(range, shape))):
        if not flagged[c]:
            rel[o, o] = True
            continue
        for d in itertools.product(range(-radius, radius + 1), repeat=len(shape)):
            j = tuple(a + b for a, b in zip(c, d))
            if all(0 <= x < s for x, s in zip(j, shape)):
                rel[o, np.ravel_multi_index(j, shape)] = True
    return rel


def data(shape, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, shape)
    a[tuple(rng.integers(0, s, 3) for s in shape)] = 9.0       # three spikes
    a.flat[0] = 9.0                                            # one at a corner
    return a


@pytest.mark.parametrize("shape,radius", [((6, 7), 1), ((5, 6), 2), ((3, 4, 5), 1)])
@pytest.mark.parametrize("strategy,prefer", [
    ("full:fullone:backward+full:fullmany:forward", None),
    ("comp:payone:backward", None),
    ("comp:paymany:backward", None),
    ("pay:payone:backward", None),
    ("pay:paymany:forward", None),
    ("full:fullone:backward", "reexec"),
])
def test_traces_give_the_relation(tmp_path, shape, radius, strategy, prefer):
    a = data(shape)
    op = Despike(radius)
    _, flagged = op.compute_flagged(a)
    want = expected_relation(flagged, radius)
    wf = subzero.Workflow("w")
    wf.add("op", op, wf.input("a"))
    with subzero.open_store(tmp_path) as st:
        run = st.run(wf, inputs={"a": a}, strategies={"op": strategy}, progress=False)
        for direction in ("backward", "forward"):
            got, _ = traced_relation(run, "op", ["a"], 0, direction, prefer)
            assert np.array_equal(got, want), (direction, np.argwhere(got != want)[:3])


def test_relation_covers_the_real_dependencies():
    a = data((5, 6), seed=3)
    op = Despike(1)
    _, flagged = op.compute_flagged(a)
    real = perturbation_relation(op, [a], 0, nan=False)
    assert real.any()
    assert not (real & ~expected_relation(flagged, 1)).any()


def test_two_inputs_share_the_window(tmp_path):
    a, b = data((5, 5), 1), data((5, 5), 2)
    op = Despike(1, threshold=10.0)
    assert op.n_inputs() is None                  # compute_flagged(*arrays): any number
    _, flagged = op.compute_flagged(a, b)
    want = expected_relation(flagged, 1)
    wf = subzero.Workflow("w")
    wf.add("op", op, wf.input("a"), wf.input("b"))
    with subzero.open_store(tmp_path) as st:
        run = st.run(wf, inputs={"a": a, "b": b}, strategies={"op": "full"}, progress=False)
        for i in (0, 1):
            got, _ = traced_relation(run, "op", ["a", "b"], i, "backward", None)
            assert np.array_equal(got, want)


def test_n_inputs_follow_compute_flagged():
    class One(WindowComposite):
        def compute_flagged(self, img):
            return img, img > 0

    class Two(WindowComposite):
        def compute_flagged(self, img, mask, scale=1.0):
            return img, mask

    assert One().n_inputs() == 1 and Two().n_inputs() == 2


def test_map_p_pairs_equals_map_p_per_pair():
    """The vectorized form: radius and box payloads mixed, pairs of several cells,
    an empty pair, in 3-D."""
    shape = (4, 5, 6)
    op = WindowComposite()
    ctx = mapping_context(op, [shape], shape)
    rng = np.random.default_rng(5)
    payloads = [radius_payload(0), radius_payload(1), box_payload((1, 0, 2), (3, 5, 4)),
                radius_payload(2), box_payload((0, 0, 0), (1, 1, 6))]
    lens = np.array([1, 3, 0, 2, 4, 1, 2])
    offsets = np.concatenate([[0], np.cumsum(lens)])
    cells = np.column_stack([rng.integers(0, s, offsets[-1]) for s in shape])
    pay_ids = np.array([0, 1, 2, 3, 2, 4, 1])
    got, owner = op.map_p_pairs(cells, offsets, payloads, pay_ids, 0, ctx)
    for k in range(len(lens)):
        one = op.map_p(cells[offsets[k]:offsets[k + 1]], payloads[pay_ids[k]], 0, ctx)
        mine = got[owner == k]
        assert {tuple(c) for c in mine} == {tuple(c) for c in one}, k
    assert not (owner == 2).any()                 # an empty pair maps to nothing


def test_box_cells_enumerates_each_box_in_c_order():
    cells, owner = box_cells(np.array([[1, 2], [0, 0], [3, 3]]), np.array([[3, 4], [1, 3], [3, 5]]))
    assert cells.tolist() == [[1, 2], [1, 3], [2, 2], [2, 3], [0, 0], [0, 1], [0, 2]]
    assert owner.tolist() == [0, 0, 0, 0, 1, 1, 1]


def test_bad_payloads_are_clear_errors():
    op = WindowComposite()
    ctx = mapping_context(op, [(4, 4)], (4, 4))
    with pytest.raises(LineageError, match="1 byte .* or 16 bytes .* not 3"):
        op.map_p(np.array([[0, 0]]), b"abc", 0, ctx)
    with pytest.raises(LineageError, match="not 3"):
        op.map_p_pairs(np.array([[0, 0]]), np.array([0, 1]), [b"abc"], np.array([0]), 0, ctx)
    with pytest.raises(LineageError, match="0..255, not 256"):
        radius_payload(256)
