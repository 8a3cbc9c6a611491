"""The medulloblastoma relapse workflow of the SubZero paper, on the real data.

``data/genomics/MD_train_set.txt`` is a table of 96 patients (columns) by the
target ``RELAPSE`` and 55 features (rows: clinical features, pathway scores,
copy-number events), after a header row and four metadata columns.  The
workflow trains a naive-Bayes model of relapse on a fixed set of features
and checks its predictions against the truth:

 1. names        feature-name column                        (Slice)
 2. values       strip header and metadata, labels -> level codes, replicate
                 the patients ``replicate`` times           (cell to cell)
 3. transpose    patients x features                        (Transpose)
 4. extract      UDF E: the model's feature columns + RELAPSE, by name (payload)
 5. model        UDF F: naive-Bayes evidence, feature x level (payload)
 6. predict      UDF H: per patient, the summed evidence     (payload)
 7. cumodds      exp(evidence): the cumulative odds ratio    (Exp)
 8. probability  odds / (1 + odds), the logistic of the evidence (Unary)
 9. classify     probability > 0.5                           (Threshold)
10. validate     1 where the prediction equals RELAPSE       (two inputs)

The UDFs' lineage depends on data values (which column holds a name, which
patients share a level), so they write it — as explicit region pairs (Full)
or as small payloads that ``map_p`` expands (Pay) — and both describe the
same relation.  Everything else knows its lineage from coordinates.
"""

from __future__ import annotations

import numpy as np

from subzero import LineageError, Mode, Operator, Workflow
from subzero.operators import Exp, Slice, Threshold, Transpose, Unary
from subzero.operators.base import MappedOperator

#: Features the model uses: clinical (histology, metastasis), expression
#: signatures (MYC, mTOR, p53, CD44, the C6 subtype cluster) and copy-number
#: events (16q loss, 7q21 and 3q26 gains).  STATUS and SURVIVAL are left out:
#: they are outcomes, known only after a relapse would be.
FEATURES = ("HISTO", "MET", "YU_CMYC", "mTOR_UP.v1", "P53_DN.v2", "HOGERKORP_CD44_UP",
            "C6_CLUSTER", "Del_16q", "Amp_7q21.3", "Amp_3q26.32")
TARGET = "RELAPSE"
META_COLUMNS = 4            # Feature, Description, Type, Context
MISSING = ("NA", "")
#: Discrete labels of the file and their level codes; numbers keep their value.
LEVELS = {"N": 0, "Y": 1, "L": 0, "H": 1, "A": 0, "D": 1,
          "CLASSIC": 0, "DESMO": 1, "LCA": 2,
          "c1": 0, "c2": 1, "c3": 2, "c4": 3, "c5": 4, "c6": 5}
SMOOTHING = 2.0             # pseudo-count added to every (level, class) count


def _pair_owner(offsets: np.ndarray) -> np.ndarray:
    """Pair index of every output cell of a CSR pair list."""
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))


def _payload_table(payloads, pay_ids, dtype, width: int, who: str) -> np.ndarray:
    """Decode equal-length payloads into a (len(pay_ids), width) table."""
    dt = np.dtype(dtype)
    bad = [len(p) for p in payloads if len(p) != width * dt.itemsize]
    if bad:
        raise LineageError(f"operator {who!r}: a payload has {bad[0]} bytes, expected "
                           f"{width * dt.itemsize}; its lineage was stored for other input shapes")
    table = np.frombuffer(b"".join(payloads), dt).reshape(len(payloads), width)
    return table[np.asarray(pay_ids, np.int64)].astype(np.int64)


# -- 2. values -------------------------------------------------------------------------------

def encode_labels(table: np.ndarray) -> np.ndarray:
    """Level codes of the table body (header row and metadata columns dropped).

    Each cell's code is a function of its own label only (LEVELS, a number, or
    NaN for NA), which keeps ``values`` a cell-to-cell operator.
    """
    labels = np.char.strip(table[1:, META_COLUMNS:].astype(str))
    uniq, inv = np.unique(labels, return_inverse=True)
    codes = np.empty(len(uniq))
    for k, u in enumerate(uniq.tolist()):
        if u in MISSING:
            codes[k] = np.nan
        elif u in LEVELS:
            codes[k] = LEVELS[u]
        else:
            try:
                codes[k] = float(u)
            except ValueError as err:
                r, c = np.argwhere(labels == u)[0]
                raise ValueError(f"feature {str(table[r + 1, 0])!r} of patient "
                                 f"{str(table[0, c + META_COLUMNS])!r} has the label {u!r}, which is "
                                 f"neither a number, NA nor a known level "
                                 f"({', '.join(LEVELS)})") from err
    return codes[inv].reshape(labels.shape)


class Values(MappedOperator):
    """The numeric features x patients matrix, patients repeated ``replicate`` times.

    Output cell (f, p) depends on the one input cell it encodes,
    (f + 1, 4 + p mod P) for P real patients: replication adds copies, not
    dependencies, so lineage stays exact at 100x.
    """

    def __init__(self, replicate: int = 1):
        if isinstance(replicate, bool) or not isinstance(replicate, (int, np.integer)) \
                or replicate < 1:
            raise ValueError(f"replicate must be a positive integer, got {replicate!r}")
        self.replicate = int(replicate)

    def output_shape(self, shape):
        if len(shape) != 2 or shape[0] < 2 or shape[1] <= META_COLUMNS:
            raise ValueError(f"the input table has shape {tuple(shape)}; expected a "
                             f"header row plus feature rows, and {META_COLUMNS} metadata "
                             f"columns plus patient columns")
        return (shape[0] - 1, (shape[1] - META_COLUMNS) * self.replicate)

    def compute(self, table):
        self.output_shape(table.shape)
        return np.tile(encode_labels(table), (1, self.replicate))

    def backward(self, cells, i, ctx):
        patients = ctx.input_shape(0)[1] - META_COLUMNS
        return np.column_stack([cells[:, 0] + 1, META_COLUMNS + cells[:, 1] % patients]), None

    def forward(self, cells, i, ctx):
        patients = ctx.input_shape(0)[1] - META_COLUMNS
        c = cells[(cells[:, 0] >= 1) & (cells[:, 1] >= META_COLUMNS)]
        copies = np.arange(self.replicate, dtype=np.int64) * patients
        p = (c[:, 1:2] - META_COLUMNS + copies[None, :]).ravel()
        return np.column_stack([np.repeat(c[:, 0] - 1, self.replicate), p])


# -- 4. extract (UDF E) --------------------------------------------------------------------------

class Extract(Operator):
    """The training matrix: the model's feature columns, then RELAPSE, chosen by name.

    Output cell (p, k) depends on the matrix cell (p, j_k) and on the name
    j_k that selected it.  Which column j_k is depends on the names (data), so
    Pay mode stores j_k as the payload (4 bytes, shared by a whole column);
    Full mode writes the same pairs explicitly.  Level codes become int64,
    NA becomes -1.
    """

    all_to_all = False
    map_p_batched = True
    deterministic_lineage = True       # its pairs follow from the data alone

    def __init__(self, features=FEATURES, target: str = TARGET):
        self.features, self.target = tuple(features), target

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY, Mode.BLACKBOX}

    def output_shape(self, matrix_shape, names_shape):
        return (matrix_shape[0], len(self.features) + 1)

    def columns(self, names: np.ndarray) -> np.ndarray:
        known: list[str] = np.char.strip(np.asarray(names).astype(str)).tolist()
        want = list(self.features) + [self.target]
        missing = [f for f in want if f not in known]
        if missing:
            raise ValueError(f"feature {missing[0]!r} is not in the matrix; its "
                             f"features are {', '.join(known)}")
        return np.array([known.index(f) for f in want], np.int64)

    def run(self, ctx, matrix, names):
        matrix = np.asarray(matrix, dtype=float)
        if matrix.ndim != 2 or np.shape(names) != (matrix.shape[1],):
            raise ValueError(f"expected a patients x features matrix and one name per "
                             f"feature, got shapes {matrix.shape} and {np.shape(names)}")
        cols = self.columns(names)
        sub = np.where(np.isnan(matrix[:, cols]), -1.0, matrix[:, cols])
        frac = np.flatnonzero(np.any(sub != np.round(sub), axis=0))
        if frac.size:
            name = (list(self.features) + [self.target])[frac[0]]
            raise ValueError(f"feature {name!r} has non-integer values; the "
                             f"naive-Bayes model needs discrete level codes")
        n, width = sub.shape
        out = np.argwhere(np.ones((n, width), bool))          # (p, k), C order
        src = cols[out[:, 1]]
        if Mode.PAY in ctx.modes:
            for k in range(width):
                ctx.lwrite(out[out[:, 1] == k], payload=int(cols[k]).to_bytes(4, "little"),
                           each=True)
        if Mode.FULL in ctx.modes:
            ctx.lwrite(out, np.column_stack([out[:, 0], src]), src[:, None], each=True)
        return sub.astype(np.int64)

    def map_p(self, cells, payload, i, ctx):
        j = int.from_bytes(payload, "little")
        if i == 0:
            return np.column_stack([cells[:, 0], np.full(len(cells), j, np.int64)])
        return np.full((min(len(cells), 1), 1), j, np.int64)

    def map_p_pairs(self, cells, offsets, payloads, pay_ids, i, ctx):
        owner = _pair_owner(offsets)
        j = _payload_table(payloads, pay_ids, "<u4", 1, "extract")[owner, 0]
        if i == 0:
            return np.column_stack([cells[:, 0], j]), owner
        return j[:, None], owner


# -- 5. model (UDF F) ----------------------------------------------------------------------------

class NaiveBayes(Operator):
    """Evidence of relapse of every (feature k, level slot v): the smoothed log
    odds ratio log((nY+2)/(nN+2)) - log((NY+2)/(NN+2)) over the patients whose
    feature k has level code v - 1 (slot 0 is NA), against all patients.

    The input is the training matrix: feature columns, then the target
    (1 = relapse, 0 = none).  Cell (k, v) depends on the cells (p, k) of the
    patients with that level and on the whole target column.  Which patients
    those are is data, so Pay mode stores them as a bitmap of patients
    (ceil(P/8) bytes per model cell); k and v are the cell's own coordinates.
    """

    all_to_all = False
    map_p_batched = True
    deterministic_lineage = True       # its pairs follow from the data alone

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY, Mode.BLACKBOX}

    def output_shape(self, train_shape):
        return None            # the number of levels depends on the data

    def run(self, ctx, train):
        train = np.asarray(train, np.int64)
        x, y = train[:, :-1], train[:, -1]
        if x.size and x.min() < -1:
            raise ValueError(f"level codes must be >= -1 (NA), found {x.min()}")
        n, k = x.shape
        levels = int(x.max()) + 2 if x.size else 1
        group = np.arange(k, dtype=np.int64)[None, :] * levels + x + 1       # (n, k) model cell
        yes, no = y == 1, y == 0
        n_yes = np.bincount(group[yes].ravel(), minlength=k * levels).reshape(k, levels)
        n_no = np.bincount(group[no].ravel(), minlength=k * levels).reshape(k, levels)
        prior = np.log((yes.sum() + SMOOTHING) / (no.sum() + SMOOTHING))
        evidence = np.log((n_yes + SMOOTHING) / (n_no + SMOOTHING)) - prior
        out = np.argwhere(np.ones((k, levels), bool))
        patient = np.repeat(np.arange(n, dtype=np.int64), k)
        if Mode.PAY in ctx.modes:
            member = np.zeros((k * levels, n), bool)
            member[group.ravel(), patient] = True
            bits = np.packbits(member, axis=1)
            ctx.lwrite(out, payload=[row.tobytes() for row in bits], each=True)
        if Mode.FULL in ctx.modes:
            # input cells labelled by model cell: each patient's feature cell (p, f) for
            # the model cell of its level, then every patient's target cell (p, k) for
            # every model cell -- filled in place (n * k * levels cells: 67 million at
            # 10,000x, where stacking and concatenating copies took seconds)
            m, whole = n * k, n * k * levels
            cells = np.empty((m + whole, 2), np.int64)
            mine = cells[:m].reshape(n, k, 2)
            mine[:, :, 0] = np.arange(n, dtype=np.int64)[:, None]
            mine[:, :, 1] = np.arange(k, dtype=np.int64)
            every = cells[m:].reshape(k * levels, n, 2)
            every[:, :, 0] = np.arange(n, dtype=np.int64)
            every[:, :, 1] = k
            labels = np.empty(m + whole, np.int64)
            labels[:m] = group.ravel()
            labels[m:].reshape(k * levels, n)[:] = np.arange(k * levels, dtype=np.int64)[:, None]
            ctx.lwrite_groups(out, np.arange(k * levels), (cells, labels))
        return evidence

    def _bitmaps(self, payloads, pay_ids, ctx) -> np.ndarray:
        n = ctx.input_shape(0)[0]
        packed = _payload_table(payloads, pay_ids, np.uint8, (n + 7) // 8, "model")
        return np.unpackbits(packed.astype(np.uint8), axis=1, count=n).view(bool)    # 0 or 1

    def map_p(self, cells, payload, i, ctx):
        return self.map_p_pairs(cells, np.array([0, len(cells)]), [payload], [0], i, ctx)[0]

    def map_p_pairs(self, cells, offsets, payloads, pay_ids, i, ctx):
        n, width = ctx.input_shape(0)
        owner = _pair_owner(offsets)
        pairs = np.flatnonzero(np.diff(offsets) > 0)
        member = self._bitmaps(payloads, np.asarray(pay_ids)[owner], ctx)     # (cells, n)
        row, patient = np.nonzero(member)
        # each member patient's feature cell, then every patient's target cell for each
        # pair, filled in place (as ``run`` does)
        m, whole = len(row), n * len(pairs)
        got = np.empty((m + whole, 2), np.int64)
        got[:m, 0] = patient
        got[:m, 1] = cells[row, 0]
        every = got[m:].reshape(len(pairs), n, 2)
        every[:, :, 0] = np.arange(n, dtype=np.int64)
        every[:, :, 1] = width - 1
        owners = np.empty(m + whole, np.int64)
        owners[:m] = owner[row]
        owners[m:].reshape(len(pairs), n)[:] = pairs[:, None]
        return got, owners


# -- 6. predict (UDF H) --------------------------------------------------------------------------

class Predict(Operator):
    """Per patient, the sum over features of the model's evidence for its level.

    Prediction p depends on the patient's feature cells (p, 0..K-1) of the
    training matrix and on the K model cells (k, 1 + its level code in k).
    The latter are data, so Pay mode stores the patient's K level slots (K bytes);
    patients with the same profile share one payload.
    """

    all_to_all = False
    map_p_batched = True
    deterministic_lineage = True       # its pairs follow from the data alone

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY, Mode.BLACKBOX}

    def output_shape(self, train_shape, model_shape):
        return (train_shape[0],)

    def run(self, ctx, train, model):
        train, model = np.asarray(train, np.int64), np.asarray(model, float)
        n, k = train.shape[0], train.shape[1] - 1
        if model.ndim != 2 or model.shape[0] != k:
            raise ValueError(f"the model has shape {model.shape} but the training "
                             f"matrix has {k} feature columns")
        slot = train[:, :k] + 1
        if slot.size and (slot.min() < 0 or slot.max() >= model.shape[1]):
            raise ValueError(f"a level code outside the model's {model.shape[1] - 1} "
                             f"levels (codes -1..{model.shape[1] - 2})")
        feature = np.arange(k, dtype=np.int64)
        evidence = model[feature[None, :], slot].sum(axis=1)
        out = np.arange(n, dtype=np.int64)[:, None]
        if Mode.PAY in ctx.modes and slot.size:
            raw = slot.astype(self._dtype(model.shape[1])).tobytes()
            w = len(raw) // n
            ctx.lwrite(out, payload=[raw[a:a + w] for a in range(0, len(raw), w)], each=True)
        if Mode.FULL in ctx.modes:
            patient = np.repeat(out[:, 0], k)
            feats = np.tile(feature, n)
            ctx.lwrite_groups(out, out[:, 0], (np.column_stack([patient, feats]), patient),
                              (np.column_stack([feats, slot.ravel()]), patient))
        return evidence

    @staticmethod
    def _dtype(levels: int):
        return np.uint8 if levels <= 256 else np.dtype("<u2")

    def map_p(self, cells, payload, i, ctx):
        return self.map_p_pairs(cells, np.array([0, len(cells)]), [payload], [0], i, ctx)[0]

    def map_p_pairs(self, cells, offsets, payloads, pay_ids, i, ctx):
        k = ctx.input_shape(0)[1] - 1
        owner = _pair_owner(offsets)
        if i == 0:
            feature = np.tile(np.arange(k, dtype=np.int64), len(cells))
            return np.column_stack([np.repeat(cells[:, 0], k), feature]), np.repeat(owner, k)
        pairs = np.flatnonzero(np.diff(offsets) > 0)
        dtype = self._dtype(ctx.input_shape(1)[1])
        slots = _payload_table(payloads, np.asarray(pay_ids)[pairs], dtype, k, "predict")
        return (np.column_stack([np.tile(np.arange(k, dtype=np.int64), len(pairs)), slots.ravel()]),
                np.repeat(pairs, k))


# -- 8, 10. probability and validate ------------------------------------------------------------

def odds_to_probability(odds):
    """odds / (1 + odds), also for infinite odds (probability 1)."""
    with np.errstate(divide="ignore"):
        return 1.0 / (1.0 + 1.0 / np.asarray(odds, float))


class Validate(MappedOperator):
    """1 where the predicted class equals the truth (the training matrix's last
    column, RELAPSE), else 0: cell p depends on prediction p and truth (p, K)."""

    arity = 2

    def output_shape(self, pred_shape, train_shape):
        if tuple(pred_shape) != (train_shape[0],):
            raise ValueError(f"{pred_shape[0]} predictions for {train_shape[0]} patients")
        return tuple(pred_shape)

    def compute(self, pred, train):
        self.output_shape(pred.shape, train.shape)
        return (pred.astype(np.int64) == train[:, -1]).astype(np.int64)

    def backward(self, cells, i, ctx):
        if i == 0:
            return cells, None
        return np.column_stack([cells[:, 0], np.full(len(cells), ctx.input_shape(1)[1] - 1)]), None

    def forward(self, cells, i, ctx):
        if i == 0:
            return cells
        return cells[cells[:, 1] == ctx.input_shape(1)[1] - 1][:, :1]


# -- the workflow -----------------------------------------------------------------------------

def workflow(replicate: int = 1) -> Workflow:
    """The relapse workflow; ``replicate`` repeats the 96 patients (100 for benchmarks)."""
    wf = Workflow("genomics")
    matrix = wf.input("matrix", default="data/genomics/MD_train_set.txt")
    names = wf.add("names", Slice(np.s_[1:, 0]), matrix)
    values = wf.add("values", Values(replicate), matrix)
    patients = wf.add("transpose", Transpose(), values)
    train = wf.add("extract", Extract(), patients, names)
    model = wf.add("model", NaiveBayes(), train)
    evidence = wf.add("predict", Predict(), train, model)
    odds = wf.add("cumodds", Exp(), evidence)
    prob = wf.add("probability", Unary(odds_to_probability), odds)
    pred = wf.add("classify", Threshold(0.5, "gt", np.int64), prob)
    wf.add("validate", Validate(), pred, train)
    return wf
