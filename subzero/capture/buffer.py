"""Lineage capture: buffer ``lwrite`` calls as arrays, finalize to packed pairs.

Nothing is encoded or written per pair: each ``lwrite`` call appends whole
arrays to a buffer, and :meth:`LineageBuffer.finish` validates bounds and
packs every cell with one numpy call per chunk.  The result is plain data
(:class:`Pairs`) that encoders consume and that can cross a Spark task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from subzero.errors import LineageError
from subzero.model.cells import Shape, first_out_of_bounds, fmt_cell, lengths_to_offsets, pack

#: one payload as an operator may give it to ``lwrite`` (kept as ``bytes``)
Payload = bytes | bytearray | memoryview


@dataclass
class Pairs:
    """Region pairs in CSR form, cells packed per array shape.

    Pair k relates ``out[out_off[k]:out_off[k+1]]`` (output cells) to, for a
    full pair, ``ins[i][in_offs[i][k]:in_offs[i][k+1]]`` for every input i,
    or, for a payload pair, to ``payloads[pay_ids[k]]``.
    """

    out: np.ndarray
    out_off: np.ndarray
    ins: list[np.ndarray] = field(default_factory=list)
    in_offs: list[np.ndarray] = field(default_factory=list)
    pay_ids: np.ndarray | None = None
    payloads: list[bytes] | None = None

    @property
    def n(self) -> int:
        return len(self.out_off) - 1

    @property
    def is_payload(self) -> bool:
        return self.pay_ids is not None

    def n_cells(self) -> int:
        return int(self.out.size + sum(a.size for a in self.ins))


def empty_pairs(n_inputs: int, payload: bool) -> Pairs:
    z = np.zeros(0, np.int64)
    off = np.zeros(1, np.int64)
    if payload:
        return Pairs(z, off, pay_ids=np.zeros(0, np.int64), payloads=[])
    return Pairs(z, off, [z] * n_inputs, [off] * n_inputs)


def _ragged(cells_seq: np.ndarray | Sequence[ArrayLike], n_rows: int, ndim: int, what: str,
            as_cells: Callable[[ArrayLike, int], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-row cells given as (N, ndim), (N, K, ndim) or a length-N sequence."""
    if isinstance(cells_seq, np.ndarray) and cells_seq.dtype != object:
        a = np.asarray(cells_seq)
        if a.ndim == 2:
            if a.shape[0] != n_rows:
                raise ValueError(f"{what} has {a.shape[0]} rows, expected {n_rows} (one per output cell)")
            return as_cells(a, ndim), np.ones(n_rows, np.int64)
        if a.ndim == 3:
            if a.shape[0] != n_rows:
                raise ValueError(f"{what} has {a.shape[0]} rows, expected {n_rows} (one per output cell)")
            return as_cells(a.reshape(-1, a.shape[2]), ndim), np.full(n_rows, a.shape[1], np.int64)
        raise ValueError(f"{what} must be (N, ndim), (N, K, ndim) or a sequence of N cell arrays")
    seq = list(cells_seq)
    if len(seq) != n_rows:
        raise ValueError(f"{what} has {len(seq)} entries, expected {n_rows} (one per output cell)")
    parts = [as_cells(c, ndim) for c in seq]
    lens = np.fromiter((len(p) for p in parts), np.int64, count=n_rows)
    cat = np.concatenate(parts) if parts else np.zeros((0, ndim), np.int64)
    return cat, lens


def _payload_key(p: object) -> bytes:
    """Payload ``p`` as the bytes it is kept as: an operator's value must be bytes-like
    (:data:`Payload`), else TypeError."""
    if type(p) is bytes:
        return p
    if not isinstance(p, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload must be bytes, got {type(p).__name__}")
    return bytes(p)


class LineageBuffer:
    """Collects one operator's ``lwrite`` calls for one run (or re-run)."""

    def __init__(self, op_name: str, n_inputs: int, out_ndim: int | None,
                 in_ndims: Sequence[int]):
        self.op_name = op_name
        self.n_inputs = n_inputs
        self.out_ndim = out_ndim
        self.in_ndims = list(in_ndims)
        #: (out, out_lens, [in_i], [in_lens_i]) per lwrite call
        self._full: list[tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]] = []
        self._pay: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (out, out_lens, pay_ids)
        self._payload_ids: dict[bytes, int] = {}
        self.payloads: list[bytes] = []
        self.n_full = 0
        self.n_pay = 0

    # -- appending ----------------------------------------------------------
    def add_full(self, out: np.ndarray, out_lens: np.ndarray,
                 ins: list[np.ndarray], in_lens: list[np.ndarray]) -> None:
        self._full.append((out, out_lens, ins, in_lens))
        self.n_full += len(out_lens)

    def payload_ids(self, seq: Sequence[object]) -> np.ndarray:
        """The id of each payload of ``seq`` (equal payloads share one; new ones are
        numbered in the order first seen); each, an operator's value, must be bytes-like
        (:data:`Payload`), else TypeError before any id is handed out.  In C loops (dict and
        map); measured, no quicker than a Python call per payload (262,144 boxes: 105-110
        against 110-112 ms), since hashing and storing each new payload is most of it."""
        keys = list(map(_payload_key, seq))
        ids = self._payload_ids
        new = [k for k in dict.fromkeys(keys) if k not in ids]
        ids.update(zip(new, range(len(self.payloads), len(self.payloads) + len(new))))
        self.payloads.extend(new)
        return np.fromiter(map(ids.__getitem__, keys), np.int64, len(keys))

    def add_pay(self, out: np.ndarray, out_lens: np.ndarray, pay_ids: np.ndarray) -> None:
        self._pay.append((out, out_lens, pay_ids))
        self.n_pay += len(out_lens)

    # -- finishing -------------------------------------------------------------
    def _check(self, cells: np.ndarray, shape: Shape, side: str) -> None:
        if cells.shape[1] != len(shape) and cells.shape[0]:
            raise LineageError(
                f"operator {self.op_name!r} wrote lineage for {side} cells of {cells.shape[1]} "
                f"coordinates, e.g. {fmt_cell(cells[0])}, but its {side} has {len(shape)} "
                f"dimensions (shape {tuple(shape)})")
        bad = first_out_of_bounds(cells, shape)
        if bad is not None:
            raise LineageError(
                f"operator {self.op_name!r} wrote lineage for {side} cell {fmt_cell(cells[bad])}, "
                f"outside its {side} (shape {tuple(shape)})")

    def finish(self, out_shape: Shape, in_shapes: Sequence[Shape]) -> tuple[Pairs | None, Pairs | None]:
        """Validate and pack everything buffered; returns (full pairs, payload pairs)."""
        full = pay = None
        if self._full:
            outs, olens = [], []
            ins: list[list[np.ndarray]] = [[] for _ in range(self.n_inputs)]
            ilens: list[list[np.ndarray]] = [[] for _ in range(self.n_inputs)]
            for out, out_lens, in_cells, in_lens in self._full:
                self._check(out, out_shape, "output")
                outs.append(pack(out, out_shape))
                olens.append(out_lens)
                for i in range(self.n_inputs):
                    self._check(in_cells[i], in_shapes[i], f"input {i}")
                    ins[i].append(pack(in_cells[i], in_shapes[i]))
                    ilens[i].append(in_lens[i])
            full = Pairs(np.concatenate(outs), lengths_to_offsets(np.concatenate(olens)),
                         [np.concatenate(x) for x in ins],
                         [lengths_to_offsets(np.concatenate(x)) for x in ilens])
        if self._pay:
            outs, olens, pids = [], [], []
            for out, out_lens, pay_ids in self._pay:
                self._check(out, out_shape, "output")
                outs.append(pack(out, out_shape))
                olens.append(out_lens)
                pids.append(pay_ids)
            pay = Pairs(np.concatenate(outs), lengths_to_offsets(np.concatenate(olens)),
                        pay_ids=np.concatenate(pids).astype(np.int64), payloads=list(self.payloads))
        self._full, self._pay = [], []
        return full, pay
