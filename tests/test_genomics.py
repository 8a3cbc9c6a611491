"""The medulloblastoma relapse workflow (workflows/genomics.py) on the real data.

The model is checked against a plain-Python naive Bayes computed straight from
the text file, the lineage of the three payload UDFs against sets derived
from the data by hand, and every storage strategy against black-box
re-execution: a strategy changes how fast a query is, never its answer.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from conftest import ROOT

import subzero
from subzero.query.workload import load_workload, run_workload

WF = "workflows/genomics.py"
DATA = ROOT / "workflows" / "data" / "genomics" / "MD_train_set.txt"
WORKLOAD = ROOT / "workflows" / "genomics_workload.json"
UDFS = ("extract", "model", "predict")

#: The paper's strategies (Table II), applied to the three UDFs.
STRATEGIES = {
    "BlackBox": "blackbox",
    "FullOne": "full:fullone:backward",
    "FullMany": "full:fullmany:backward",
    "FullForw": "full:fullone:forward",
    "FullBoth": "full:fullone:backward+full:fullone:forward",
    "PayOne": "pay:payone:backward",
    "PayMany": "pay:paymany:backward",
    "PayBoth": "pay:payone:backward+full:fullone:forward",
    "PayForw": "pay:payone:forward",
}


def genomics():
    import subzero.workflows.genomics as g
    return g


# -- an independent reading of the file ------------------------------------------------------

def raw_table():
    """{feature: [label per patient]} and the patient ids, read with the csv module."""
    with open(DATA, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header, body = rows[0], rows[1:]
    return {r[0]: [x.strip() for x in r[4:]] for r in body}, header[4:], [r[0] for r in body]


def python_naive_bayes(features):
    """Evidence per (feature, label) and the training predictions, in plain Python."""
    table, patients, _ = raw_table()
    y = [v == "Y" for v in table["RELAPSE"]]
    n_yes, n_no = sum(y), len(y) - sum(y)
    prior = math.log((n_yes + 2) / (n_no + 2))
    evidence = {}
    for f in features:
        for level in set(table[f]):
            yes = sum(1 for v, t in zip(table[f], y) if v == level and t)
            no = sum(1 for v, t in zip(table[f], y) if v == level and not t)
            evidence[f, level] = math.log((yes + 2) / (no + 2)) - prior
    scores = [sum(evidence[f, table[f][p]] for f in features) for p in range(len(patients))]
    return evidence, scores, y


# -- runs shared by several tests --------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run per strategy (UDFs only; the other steps use their mapping functions)."""
    store = subzero.open_store(tmp_path_factory.mktemp("genomics") / "store")
    out = {name: store.run(ROOT / WF, strategies={u: spec for u in UDFS}, progress=False)
           for name, spec in STRATEGIES.items()}
    yield out
    store.close()


@pytest.fixture(scope="module")
def queries():
    return load_workload(WORKLOAD)


@pytest.fixture(scope="module")
def reference(runs, queries):
    """Workload answers of the black-box run, re-executing every UDF."""
    rows = run_workload(runs["BlackBox"], queries, prefer="reexec", record=False)
    return {r["name"]: r["result"].cells for r in rows}


# -- the science ---------------------------------------------------------------------------------

def test_model_matches_plain_python_and_beats_majority(runs):
    g = genomics()
    run = runs["FullOne"]
    table, patients, names = raw_table()
    evidence, scores, y = python_naive_bayes(g.FEATURES)
    shapes = run.shapes()
    assert shapes["matrix"] == (len(names) + 1, len(patients) + 4)
    assert shapes["transpose"] == (len(patients), len(names))
    assert list(run.array("names").values) == names
    model = run.array("model").values
    for k, f in enumerate(g.FEATURES):
        for level in set(table[f]):
            slot = 0 if level == "NA" else (g.LEVELS[level] if level in g.LEVELS else int(level)) + 1
            assert model[k, slot] == pytest.approx(evidence[f, level])
    np.testing.assert_allclose(run.array("predict").values, scores)
    predicted = run.array("classify").values == 1
    truth = np.array(y)
    np.testing.assert_array_equal(predicted, np.array(scores) > 0)
    accuracy = float(np.mean(predicted == truth))
    majority = max(truth.mean(), 1 - truth.mean())
    print(f"\ngenomics training accuracy {accuracy:.3f} ({int(np.sum(predicted == truth))}/"
          f"{len(truth)}), majority-class baseline {majority:.3f}")
    assert run.array("validate").values.mean() == pytest.approx(accuracy)
    assert accuracy > majority + 0.05


def test_replicate_multiplies_the_patient_axis(tmp_path):
    with subzero.open_store(tmp_path / "s") as store:
        run = store.run(ROOT / WF, params={"replicate": 3}, progress=False)
        shapes = run.shapes()
        assert shapes["matrix"] == (57, 100)                 # the input stays the real file
        assert shapes["values"] == (56, 288) and shapes["transpose"] == (288, 56)
        assert shapes["extract"][0] == shapes["predict"][0] == shapes["validate"][0] == 288
        pred = run.array("predict").values
        np.testing.assert_allclose(pred, np.tile(pred[:96], 3))
        # one raw cell (feature MET of patient MD_102) feeds its three copies
        res = run.trace("matrix", [(5, 5)], to="values")
        assert res.cells.tolist() == [[4, 1], [4, 97], [4, 193]]
        back = run.trace("values", [(4, 193)], to="matrix")
        assert back.cells.tolist() == [[5, 5]]


# -- lineage ---------------------------------------------------------------------------------------

def test_udf_lineage_is_the_data_dependent_relation(runs):
    """BQ0, BQ1 and FQ0 against the sets the model really used, built from the file."""
    g = genomics()
    table, _, names = raw_table()
    col = {f: names.index(f) for f in names}
    target = [(p, col["RELAPSE"]) for p in range(96)]
    for name in ("PayOne", "FullMany", "BlackBox"):
        run = runs[name]
        # BQ0: model cell (HISTO, CLASSIC) <- the CLASSIC patients' HISTO cells + every RELAPSE cell
        got = run.trace("model", [(0, g.LEVELS["CLASSIC"] + 1)], to="transpose").cells
        want = [(p, col["HISTO"]) for p, v in enumerate(table["HISTO"]) if v == "CLASSIC"]
        assert sorted(map(tuple, got.tolist())) == sorted(want + target)
        # BQ1: prediction 5 <- its own features, and through the model every patient sharing
        # a level with it in some feature, plus every RELAPSE cell
        got = run.trace("predict", [(5,)], to="transpose").cells
        want = {(p, col[f]) for f in g.FEATURES for p in range(96)
                if table[f][p] == table[f][5]} | set(target)
        assert set(map(tuple, got.tolist())) == want
        # FQ0: a training cell reaches exactly the model cell of its level
        got = run.trace("transpose", [(0, col["HISTO"])], to="model").cells
        assert got.tolist() == [[0, g.LEVELS[table["HISTO"][0]] + 1]]
        # a feature the model does not use reaches nothing
        assert len(run.trace("transpose", [(0, col["STATUS"])], to="validate")) == 0


UDF_INPUTS = {"extract": ("transpose", "names"), "model": ("extract",),
              "predict": ("extract", "model")}


@pytest.mark.parametrize("udf", list(UDF_INPUTS))
def test_full_and_payload_lineage_are_one_relation(runs, udf):
    """Single-cell traces through one UDF, both ways (a spread of 64 start cells):
    explicit pairs (Full), payloads (Pay, backward- and forward-keyed) and
    re-execution agree cell for cell.  The reference, FullBoth, reads each
    direction from the index keyed its way."""
    from subzero.operators.testing import traced_relation
    inputs = UDF_INPUTS[udf]
    for i in range(len(inputs)):
        for direction in ("backward", "forward"):
            want, _ = traced_relation(runs["FullBoth"], udf, inputs, i, direction, None, sample=64)
            assert want.any()
            others = [("FullOne", None), ("FullMany", None), ("FullForw", None), ("PayOne", None),
                      ("PayMany", None), ("PayForw", None), ("BlackBox", "reexec")]
            for name, prefer in others:
                got, _ = traced_relation(runs[name], udf, inputs, i, direction, prefer, sample=64)
                assert np.array_equal(got, want), f"{udf} input {i} {direction}: {name} differs"


def test_forward_trace_of_an_unused_cell_over_fullone_backward(runs):
    col_status = raw_table()[2].index("STATUS")              # not a model feature
    res = runs["FullOne"].trace("transpose", [(0, col_status)], to="extract")
    assert len(res) == 0


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "BlackBox"])
def test_every_strategy_answers_the_workload_identically(runs, queries, reference, strategy):
    run = runs[strategy]
    for prefer in (None, "reexec"):
        for row in run_workload(run, queries, prefer=prefer, record=False):
            assert np.array_equal(row["result"].cells, reference[row["name"]]), \
                f"{strategy} (prefer={prefer}) answers {row['name']} differently"
            if prefer is None:
                assert not any(m.startswith("reexec") for m in row["methods"]), row["methods"]


def test_workload_file_and_stored_lineage(runs, queries, reference):
    assert [q.name for q in queries] == ["FQ0", "FQ1", "BQ0", "BQ1"]
    counts = {k: len(v) for k, v in reference.items()}
    assert counts["FQ0"] == 1 and counts["FQ1"] == 96          # RELAPSE reaches every patient
    assert counts["BQ0"] == 65 + 96                            # 65 CLASSIC patients + RELAPSE
    stored = {(s["op"], s["strategy"]) for s in runs["PayBoth"].strategy_stats()}
    assert stored == {(u, s) for u in UDFS
                      for s in ("pay:payone:backward", "full:fullone:forward")}


def _decoded(run) -> int:
    """Lineage blocks the run's readers hold decoded."""
    return sum(len(r._blocks) + len(r._key_index) for r in run.executor()._readers.values())


@pytest.mark.parametrize("warm", [False, True])
def test_a_workload_times_each_query_from_nothing_decoded(runs, queries, reference, monkeypatch,
                                                          warm):
    """Under FullOne (backward) the forward queries scan the backward indexes and leave
    every block decoded; a workload's later queries must not start from that (their
    time would be the file order's), unless ``warm`` asks for a session's total."""
    run = runs["FullOne"]
    run.executor().clear_cache(close=True)
    seen, opened, trace = [], [], run.trace

    def spy(*args, **kw):
        seen.append(_decoded(run))
        opened.append(run.executor()._lineage is not None)
        return trace(*args, **kw)
    monkeypatch.setattr(run, "trace", spy)
    import subzero.query.workload as workload
    released, release = [], workload.release
    monkeypatch.setattr(workload, "release", lambda: released.append(len(seen)) or release())
    rows = run_workload(run, queries, record=False, warm=warm)
    assert [r["name"] for r in rows] == ["FQ0", "FQ1", "BQ0", "BQ1"]
    # the heap earlier queries freed goes back before each query: it faults in its own
    assert released == ([] if warm else [0, 1, 2, 3])
    for row in rows:
        assert np.array_equal(row["result"].cells, reference[row["name"]]), row["name"]
    assert _decoded(run) > 0 and seen[0] == 0
    if warm:
        assert min(seen[1:]) > 0, seen
        assert opened == [False, True, True, True]
    else:                  # nothing decoded, nothing mapped: each query opens the lineage
        assert seen == [0, 0, 0, 0], seen
        assert opened == [False] * 4
        assert all(r["result"].steps[0].cold for r in rows if r["result"].steps
                   and r["result"].steps[0].method.startswith("stored:"))


def test_cli_run_and_workload_trace(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(ROOT)
    store = tmp_path / "store"
    code, out, err = cli("run", WF, "--store", store, "--param", "replicate=2",
                         "--strategy", "model=pay", "--strategy", "predict=pay:paymany:backward")
    assert code == 0, err
    code, out, err = cli("trace", "--workload", WORKLOAD.relative_to(ROOT), "--store", store,
                         "--json")
    assert code == 0, err
    rows = {q["name"]: q for q in json.loads(out)["queries"]}
    assert set(rows) == {"FQ0", "FQ1", "BQ0", "BQ1"}
    assert rows["FQ1"]["count"] == 192                          # both copies of every patient
    assert rows["BQ0"]["count"] == 2 * (65 + 96)
    assert json.loads(out)["warm"] is False
    code, out, err = cli("trace", "--workload", WORKLOAD, "--store", store, "--warm", "--json")
    assert code == 0, err
    warm = {q["name"]: q for q in json.loads(out)["queries"]}
    assert json.loads(out)["warm"] is True
    assert {k: q["count"] for k, q in warm.items()} == {k: q["count"] for k, q in rows.items()}
    code, out, err = cli("trace", "--workload", WORKLOAD, "--store", store)
    assert code == 0 and "BQ1" in out, err
    code, out, err = cli("trace", "--from", "predict", "--cells", "0", "--to", "patients",
                         "--store", store, "--warm")
    assert code == 2 and err.strip().splitlines() == ["subzero: error: --warm goes with --workload"], err


# -- the built-in-like steps and errors -----------------------------------------------------------

def test_mapped_steps_pass_the_lineage_oracle(tmp_path):
    from subzero.operators.testing import check_full, check_lineage
    g = genomics()
    rng = np.random.default_rng(3)
    check_lineage(g.Validate(), rng.integers(0, 2, 7), rng.integers(-1, 3, (7, 4)),
                  store_dir=tmp_path / "v")
    table = np.array([["Feature", "D", "T", "C", "P1", "P2", "P3"],
                      ["RELAPSE", "", "", "", "Y", "N", "NA"],
                      ["HISTO", "", "", "", "LCA", "DESMO", "12.5"]])
    check_full([(g.Values(replicate=2), [table])], tmp_path / "f")


def test_errors_name_the_feature_and_patient(tmp_path):
    from subzero.capture.context import Context
    from subzero.storage.inputs import load_path
    g = genomics()
    table = load_path(DATA)
    table[5, 7] = "MEDIUM"                                   # feature MET of patient MD_104
    with subzero.open_store(tmp_path / "s") as store:
        with pytest.raises(subzero.OperatorError, match="'MET' of patient 'MD_104'.*'MEDIUM'"):
            store.run(ROOT / WF, inputs={"matrix": table}, progress=False)
    names = np.char.strip(load_path(DATA)[1:, 0])
    matrix = g.encode_labels(load_path(DATA)).T
    with pytest.raises(ValueError, match="'NO_SUCH_GENE' is not in the matrix"):
        op = g.Extract(features=("NO_SUCH_GENE",))
        op.run(Context("extract", op), matrix, names)
    with pytest.raises(ValueError, match="'SURVIVAL' has non-integer values"):
        op = g.Extract(features=("SURVIVAL",))
        op.run(Context("extract", op), matrix, names)
    with pytest.raises(ValueError, match="replicate must be a positive integer"):
        g.workflow(replicate=0)
