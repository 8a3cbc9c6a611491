"""Black-box re-execution: re-run one operator on its stored inputs and
collect, in memory, only the lineage pairs that touch the query."""

from __future__ import annotations

import numpy as np

from subzero.capture.buffer import LineageBuffer, Pairs
from subzero.capture.context import Context
from subzero.errors import LineageError, OperatorError, QueryError, SubZeroError
from subzero.model.cells import first_out_of_bounds, fmt_cell, lengths_to_offsets, pack, rows_hitting
from subzero.model.modes import Mode


def capture_mode(op) -> Mode | None:
    """The lineage mode a re-run asks for: the richest one the operator has.

    COMP needs the fewest pairs (mapping functions cover the default), then
    FULL, then PAY.  None means the operator has no lwrite lineage at all.
    """
    modes = op.supported_modes()
    if Mode.COMP in modes and op.has_mapping():
        return Mode.COMP
    if Mode.FULL in modes:
        return Mode.FULL
    if Mode.PAY in modes:
        return Mode.PAY
    return None


class QueryBuffer(LineageBuffer):
    """Keeps only the pairs whose key side intersects the query.

    Backward: key side = output cells.  Forward: key side = input ``i``
    (for payload pairs, ``map_p`` of the output cells).  Composite re-runs
    also keep the output cells of every payload pair (the covered set).
    """

    def __init__(self, name, n_inputs, out_shape, in_shapes, backward: bool, i: int,
                 q_flat: np.ndarray, map_p_pairs, keep_covered: bool):
        super().__init__(name, n_inputs, len(out_shape), [len(s) for s in in_shapes])
        self.out_shape, self.in_shapes = tuple(out_shape), [tuple(s) for s in in_shapes]
        self.backward, self.i, self.q_flat = backward, i, q_flat
        self.map_p_pairs = map_p_pairs
        self.keep_covered = keep_covered
        self.covered: list[np.ndarray] = []
        self._kept_full: list[tuple] = []
        self._kept_pay: list[tuple] = []

    def add_full(self, out, out_lens, ins, in_lens) -> None:
        self._check(out, self.out_shape, "output")
        o = pack(out, self.out_shape)
        oo = lengths_to_offsets(out_lens)
        packed_ins = []
        for k in range(self.n_inputs):
            self._check(ins[k], self.in_shapes[k], f"input {k}")
            packed_ins.append((pack(ins[k], self.in_shapes[k]), lengths_to_offsets(in_lens[k])))
        key, key_off = (o, oo) if self.backward else packed_ins[self.i]
        rows = rows_hitting(key, key_off, self.q_flat)
        if rows.size:
            self._kept_full.append((o, oo, packed_ins, rows))
        self.n_full += len(out_lens)

    def add_pay(self, out, out_lens, pay_ids) -> None:
        self._check(out, self.out_shape, "output")
        o = pack(out, self.out_shape)
        oo = lengths_to_offsets(out_lens)
        if self.keep_covered:
            self.covered.append(o)
        if self.backward:
            rows = rows_hitting(o, oo, self.q_flat)
        else:
            cells, owner = self.map_p_pairs(out, oo, self.payloads, pay_ids, self.i)
            cells = np.asarray(cells, np.int64).reshape(-1, len(self.in_shapes[self.i]))
            bad = first_out_of_bounds(cells, self.in_shapes[self.i])
            if bad is not None:
                raise LineageError(f"operator {self.op_name!r}: map_p returned cell "
                                   f"{fmt_cell(cells[bad])} outside input {self.i} "
                                   f"(shape {tuple(self.in_shapes[self.i])})")
            packed = pack(cells, self.in_shapes[self.i]) if len(cells) else np.zeros(0, np.int64)
            rows = np.unique(np.asarray(owner, np.int64)[self.q_flat[packed]]) if len(cells) \
                else np.zeros(0, np.int64)
        if rows.size:
            self._kept_pay.append((o, oo, pay_ids, rows))
        self.n_pay += len(out_lens)

    def kept(self) -> tuple[Pairs | None, Pairs | None]:
        from subzero.model.cells import csr_take
        full = pay = None
        if self._kept_full:
            outs: list[np.ndarray] = []
            olens: list[np.ndarray] = []
            ins: list[list[np.ndarray]] = [[] for _ in range(self.n_inputs)]
            ilens: list[list[np.ndarray]] = [[] for _ in range(self.n_inputs)]
            for o, oo, pins, rows in self._kept_full:
                outs.append(csr_take(o, oo, rows))
                olens.append(oo[rows + 1] - oo[rows])
                for k, (c, co) in enumerate(pins):
                    ins[k].append(csr_take(c, co, rows))
                    ilens[k].append(co[rows + 1] - co[rows])
            full = Pairs(np.concatenate(outs), lengths_to_offsets(np.concatenate(olens)),
                         [np.concatenate(x) for x in ins],
                         [lengths_to_offsets(np.concatenate(x)) for x in ilens])
        if self._kept_pay:
            outs, olens, pids = [], [], []
            for o, oo, pay_ids, rows in self._kept_pay:
                outs.append(csr_take(o, oo, rows))
                olens.append(oo[rows + 1] - oo[rows])
                pids.append(np.asarray(pay_ids)[rows])
            pay = Pairs(np.concatenate(outs), lengths_to_offsets(np.concatenate(olens)),
                        pay_ids=np.concatenate(pids).astype(np.int64), payloads=list(self.payloads))
        return full, pay


def rerun(name: str, op, inputs: list, out_shape, mode: Mode, backward: bool, i: int,
          q_flat: np.ndarray) -> tuple[Pairs | None, Pairs | None, np.ndarray | None]:
    """Re-run ``op`` asking for ``mode``; returns the query's pairs (full, payload)
    and, for composite lineage, the covered output cells."""
    if not op.deterministic:
        raise QueryError(f"operator {name!r} is not deterministic, so its lineage cannot be "
                         f"recomputed by re-running it; store it (e.g. --strategy {name}=full)")
    in_shapes = [tuple(int(x) for x in np.shape(v)) or (1,) for v in inputs]
    mctx = Context(name, op, frozenset(), in_shapes, out_shape)

    def mpp(cells, off, payloads, pay_ids, k):
        return op.map_p_pairs(np.asarray(cells, np.int64), off, payloads, pay_ids, k, mctx)

    buf = QueryBuffer(name, len(inputs), out_shape, in_shapes, backward, i, q_flat, mpp,
                      keep_covered=(mode is Mode.COMP))
    ctx = Context(name, op, {mode}, in_shapes, out_shape, buf)
    try:
        op.run(ctx, *inputs)
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"re-running operator {name!r} for a trace failed: "
                            f"{type(e).__name__}: {e}") from e
    full, pay = buf.kept()
    covered = np.unique(np.concatenate(buf.covered)) if buf.covered else (
        np.zeros(0, np.int64) if mode is Mode.COMP else None)
    return full, pay, covered
