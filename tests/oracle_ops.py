"""Random lineage operators and a brute-force lineage oracle (for test_oracle_property.py).

An :class:`OpSpec` is plain data: shapes, the supported modes, an optional
default mapping (``map_b``/``map_f``) and a list of :class:`Call` s, each a
group of region pairs emitted through one ``lwrite`` form.  A pair's input
side is either explicit (flat input indices per input) or described by a
payload (``radius``: a window around each output cell projected onto the
input; ``bbox``: the bounding box of *all* the pair's projected output cells,
which only works if ``map_p`` receives every output cell of the pair at once).

:class:`SpecOp` turns a spec into a deterministic operator (declaring its
output shape; :class:`UndeclaredSpecOp` does not, so SubZero learns the output
shape -- often of another rank than the inputs -- only when ``run`` returns): in FULL mode it
writes every pair as a region pair (payload pairs resolved with its own
``map_p``); in PAY/COMP mode it writes every pair as a payload pair (explicit
pairs encoded into the payload).  So FULL and PAY lineage of one spec mean the
same relation; COMP adds the default mapping on output cells no pair covers.

The oracle side (:func:`relation`) rebuilds that relation with plain Python
loops, independently of subzero and of the operator's numpy code, as one
boolean dependency matrix per input: ``D[i][o, x]`` = output cell ``o``
depends on cell ``x`` of input ``i``.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

import numpy as np

import subzero
from subzero import Mode, Operator

# --------------------------------------------------------------------------- data

@dataclass(frozen=True)
class Pair:
    out: tuple[int, ...]                                # flat output indices (repeats allowed)
    ins: tuple[tuple[int, ...], ...] | None = None      # explicit flat input indices per input
    pkind: str | None = None                            # "radius" | "bbox" (payload-described)
    r: int = 0


@dataclass(frozen=True)
class Call:
    form: str                                           # "single" | "each" | "groups"
    pairs: tuple[Pair, ...]
    style: int = 0                                      # representation variant
    labels: tuple[int, ...] = ()                        # groups: one label per pair
    junk: tuple[tuple[tuple[int, int], ...], ...] = ()  # groups: per input (flat, unused label)
    seed: int = 0                                       # groups: order of the cells


@dataclass(frozen=True)
class OpSpec:
    out_shape: tuple[int, ...]
    in_shapes: tuple[tuple[int, ...], ...]
    calls: tuple[Call, ...]
    modes: frozenset                                    # subset of {"full", "pay", "comp", "map"}
    default: tuple | None = None                        # (kind, offsets per input) for map ops
    check_modes: bool = True                            # emit only the modes ctx asks for
    batched: bool = False                               # map_p_batched
    pairs_at_once: bool = False                         # its own map_p_pairs (batched only)
    declared: bool = True                               # the op defines output_shape

    @property
    def n_inputs(self) -> int:
        return len(self.in_shapes)

    @property
    def has_mapping(self) -> bool:
        return self.default is not None

    def n_pairs(self) -> int:
        return sum(len(c.pairs) for c in self.calls)


def size_of(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def unflat(flat: int, shape) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        out.append(flat % n)
        flat //= n
    return tuple(reversed(out))


def flat_of(cell, shape) -> int:
    f = 0
    for c, n in zip(cell, shape):
        f = f * n + c
    return f


def cells_of(flats, shape) -> np.ndarray:
    """(N, ndim) int64 array of flat indices (pure Python unravel)."""
    return np.array([unflat(int(f), shape) for f in flats], dtype=np.int64).reshape(-1, len(shape))


# --------------------------------------------------------------------------- payloads

def encode_payload(pair: Pair) -> bytes:
    if pair.pkind is None:
        parts = [b"E", struct.pack("<B", len(pair.ins))]
        for idx in pair.ins:
            parts.append(struct.pack("<I", len(idx)))
            parts.append(np.asarray(idx, dtype="<u4").tobytes())
        return b"".join(parts)
    return {"radius": b"R", "bbox": b"B"}[pair.pkind] + bytes([pair.r])


def _decode_explicit(payload: bytes, i: int) -> np.ndarray:
    (n,) = struct.unpack_from("<B", payload, 1)
    pos = 2
    for k in range(n):
        (m,) = struct.unpack_from("<I", payload, pos)
        pos += 4
        if k == i:
            return np.frombuffer(payload, dtype="<u4", count=m, offset=pos).astype(np.int64)
        pos += 4 * m
    raise AssertionError(f"explicit payload has no input {i}")


def project(cells: np.ndarray, in_shape) -> np.ndarray:
    """Output cells -> input cells: coordinate d is out[d % out_ndim] mod in_shape[d]."""
    idx = [d % cells.shape[1] for d in range(len(in_shape))]
    return cells[:, idx] % np.asarray(in_shape, dtype=np.int64)


# --------------------------------------------------------------------------- the operator

def _as_style(cells: np.ndarray, style: int):
    """Same cells, in one of the accepted spellings."""
    if style % 3 == 1:
        return [tuple(int(x) for x in c) for c in cells]          # list of tuples
    if style % 3 == 2 and len(cells) == 1:
        return tuple(int(x) for x in cells[0])                    # a single tuple
    return cells


class UndeclaredSpecOp(Operator):
    """Deterministic operator whose lineage is fixed by its spec; like most user
    operators it does not define ``output_shape``."""

    def __init__(self, spec: OpSpec):
        self.spec = spec
        self.map_p_batched = spec.batched
        self._memo: dict = {}

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_memo"] = {}                      # a cache of spec-derived arrays, never pickled
        return d

    def supported_modes(self):
        m = {Mode.BLACKBOX}
        for name in self.spec.modes:
            m.add(Mode(name))
        return m

    def run(self, ctx, *inputs):
        spec = self.spec
        assert len(inputs) == spec.n_inputs
        for x, s in zip(inputs, spec.in_shapes):
            assert tuple(np.shape(x)) == tuple(s), (np.shape(x), s)
        full_ok = "full" in spec.modes and (not spec.check_modes or Mode.FULL in ctx.modes)
        pay_ok = bool({"pay", "comp"} & spec.modes) and (
            not spec.check_modes or Mode.PAY in ctx.modes or Mode.COMP in ctx.modes)
        for call in spec.calls:
            if full_ok:
                self._emit_full(ctx, call)
            if pay_ok:
                self._emit_pay(ctx, call)
        return np.arange(size_of(spec.out_shape), dtype=np.float64).reshape(spec.out_shape)

    # -- map_p ---------------------------------------------------------------------
    def map_p(self, cells, payload, i, ctx):
        return self._map_p(cells, payload, i, ctx.input_shape(i))

    def _map_p(self, cells, payload, i, shape):
        cells = np.asarray(cells, dtype=np.int64)
        assert cells.ndim == 2 and cells.shape[1] == len(self.spec.out_shape), cells.shape
        tag = payload[:1]
        if tag == b"E":
            flat = _decode_explicit(payload, i)
            if flat.size == 0:
                return np.zeros((0, len(shape)), np.int64)
            return np.stack(np.unravel_index(flat, shape), axis=1)
        if tag == b"R":
            if len(cells) == 0:
                return np.zeros((0, len(shape)), np.int64)
            return subzero.window(project(cells, shape), payload[1], shape)
        if tag == b"B":
            if len(cells) == 0:
                return np.zeros((0, len(shape)), np.int64)
            p = project(cells, shape)
            r = payload[1]
            lo = np.maximum(p.min(axis=0) - r, 0)
            hi = np.minimum(p.max(axis=0) + r + 1, np.asarray(shape))
            grids = np.meshgrid(*[np.arange(a, b) for a, b in zip(lo, hi)], indexing="ij")
            return np.stack([g.ravel() for g in grids], axis=1)
        if tag == b"X":      # deliberately broken: cells outside the input
            return project(cells, shape) + np.asarray(shape)
        raise AssertionError(f"unknown payload {payload!r}")

    # -- default mapping (only on MapSpecOp) --------------------------------------------
    def _shift(self, cells, i, sign):
        kind, offs = self.spec.default
        cells = np.asarray(cells, dtype=np.int64).reshape(-1, len(self.spec.out_shape))
        if kind == "identity":
            return cells
        shape = np.asarray(self.spec.in_shapes[i] if sign < 0 else self.spec.out_shape)
        res = cells + sign * np.asarray(offs[i], dtype=np.int64)
        if kind == "roll":
            return res % shape
        return res[np.all((res >= 0) & (res < shape), axis=1)]

    # -- emission -----------------------------------------------------------------------
    # Cell arrays of a pair depend only on the spec: computed once per instance
    # (re-execution re-runs the operator many times).  Callers must not modify them.
    def _out(self, pair: Pair) -> np.ndarray:
        key = ("out", id(pair))
        a = self._memo.get(key)
        if a is None:
            a = self._memo[key] = cells_of(pair.out, self.spec.out_shape)
            a.flags.writeable = False        # subzero must not modify the caller's cells
        return a

    def _ins(self, ctx, pair: Pair, i: int) -> np.ndarray:
        key = ("in", id(pair), i)
        a = self._memo.get(key)
        if a is None:
            shape = self.spec.in_shapes[i]
            if pair.pkind is None:
                a = cells_of(pair.ins[i], shape)
            else:
                a = np.array(self._map_p(self._out(pair), encode_payload(pair), i, shape), np.int64)
            a.flags.writeable = False
            self._memo[key] = a
        return a

    def _emit_full(self, ctx, call: Call) -> None:
        n_in = self.spec.n_inputs
        ndim = len(self.spec.out_shape)
        if call.form == "single":
            p = call.pairs[0]
            ctx.lwrite(_as_style(self._out(p), call.style),
                       *[_as_style(self._ins(ctx, p, i), call.style + i) for i in range(n_in)])
        elif call.form == "each":
            out = np.concatenate([self._out(p) for p in call.pairs]) if call.pairs \
                else np.zeros((0, ndim), np.int64)
            ins = []
            for i in range(n_in):
                rows = [self._ins(ctx, p, i) for p in call.pairs]
                lens = {len(r) for r in rows}
                if call.style % 4 == 1 and len(lens) == 1 and rows:
                    ins.append(np.stack(rows))                       # (N, K, ndim)
                elif call.style % 4 == 2 and lens == {1}:
                    ins.append(np.concatenate(rows))                 # (N, ndim): one cell per row
                elif call.style % 4 == 3:
                    ins.append(tuple(rows))
                else:
                    ins.append(rows)
            ctx.lwrite(out, *ins, each=True)
        else:
            out, lab = self._group_out(call)
            ins = []
            for i in range(n_in):
                cells = [self._ins(ctx, p, i) for p in call.pairs]
                labs = [np.full(len(c), l, np.int64) for c, l in zip(cells, call.labels)]
                junk = call.junk[i] if call.junk else ()
                cells.append(cells_of([f for f, _ in junk], self.spec.in_shapes[i]))
                labs.append(np.array([l for _, l in junk], np.int64))
                c, l = np.concatenate(cells), np.concatenate(labs)
                perm = np.random.default_rng(call.seed + 1 + i).permutation(len(c))
                ins.append((c[perm], l[perm] if call.style % 2 else l[perm].tolist()))
            ctx.lwrite_groups(out, lab, *ins)

    def _group_out(self, call: Call):
        outs = [self._out(p) for p in call.pairs]
        labs = [np.full(len(o), l, np.int64) for o, l in zip(outs, call.labels)]
        out = np.concatenate(outs) if outs else np.zeros((0, len(self.spec.out_shape)), np.int64)
        lab = np.concatenate(labs) if labs else np.zeros(0, np.int64)
        perm = np.random.default_rng(call.seed).permutation(len(out))
        return out[perm], lab[perm]

    def _emit_pay(self, ctx, call: Call) -> None:
        pays = [encode_payload(p) for p in call.pairs]
        same = len(set(pays)) == 1
        if call.form == "single":
            ctx.lwrite(_as_style(self._out(call.pairs[0]), call.style), payload=pays[0])
        elif call.form == "each":
            out = np.concatenate([self._out(p) for p in call.pairs]) if call.pairs \
                else np.zeros((0, len(self.spec.out_shape)), np.int64)
            if same and call.style % 3 == 0:
                payload = pays[0]
            elif call.style % 3 == 1:
                payload = tuple(pays)
            else:
                payload = pays
            ctx.lwrite(out, payload=payload, each=True)
        else:
            out, lab = self._group_out(call)
            by_label = dict(zip(call.labels, pays))
            present = sorted(set(lab.tolist()))
            if same and call.style % 3 == 0:
                payload = pays[0]
            elif call.style % 3 == 1:
                payload = dict(by_label)                 # may hold labels without cells
                payload[max(call.labels, default=0) + 1000] = b"E\x00"
            else:
                payload = [by_label[l] for l in present]
            ctx.lwrite_groups(out, lab, payload=payload)


class SpecOp(UndeclaredSpecOp):
    """A spec operator that declares its output shape."""

    def output_shape(self, *input_shapes):
        return self.spec.out_shape


class _Mapped:
    """A default relation (identity, clipped shift or cyclic roll)."""

    def map_b(self, cells, i, ctx):
        return self._shift(cells, i, -1)     # type: ignore[attr-defined]

    def map_f(self, cells, i, ctx):
        return self._shift(cells, i, +1)     # type: ignore[attr-defined]


class MapSpecOp(_Mapped, SpecOp):
    """A SpecOp with a default relation."""


class UndeclaredMapSpecOp(_Mapped, UndeclaredSpecOp):
    """An UndeclaredSpecOp with a default relation."""


class _PairsAtOnce:
    """A ``map_p_pairs`` of its own, as a vectorized operator has: a backward step over
    pairs that mostly have payloads of their own then calls it once for all of them
    instead of ``map_p`` per payload (``subzero.query.relation.per_payload``), and must
    answer the same."""

    def map_p_pairs(self, cells, offsets, payloads, pay_ids, i, ctx):
        shape = ctx.input_shape(i)
        outs = [np.asarray(self._map_p(cells[offsets[k]:offsets[k + 1]],  # type: ignore[attr-defined]
                                       payloads[pay_ids[k]], i, shape), np.int64).reshape(-1, len(shape))
                for k in range(len(offsets) - 1)]
        owners = [np.full(len(c), k, np.int64) for k, c in enumerate(outs)]
        if not outs:
            return np.zeros((0, len(shape)), np.int64), np.zeros(0, np.int64)
        return np.concatenate(outs), np.concatenate(owners)


class PairsSpecOp(_PairsAtOnce, SpecOp):
    """A SpecOp with its own map_p_pairs."""


class PairsMapSpecOp(_PairsAtOnce, MapSpecOp):
    """A MapSpecOp with its own map_p_pairs."""


class PairsUndeclaredSpecOp(_PairsAtOnce, UndeclaredSpecOp):
    """An UndeclaredSpecOp with its own map_p_pairs."""


class PairsUndeclaredMapSpecOp(_PairsAtOnce, UndeclaredMapSpecOp):
    """An UndeclaredMapSpecOp with its own map_p_pairs."""


def make_op(spec: OpSpec) -> UndeclaredSpecOp:
    if spec.pairs_at_once:
        if spec.declared:
            return PairsMapSpecOp(spec) if spec.has_mapping else PairsSpecOp(spec)
        return PairsUndeclaredMapSpecOp(spec) if spec.has_mapping else PairsUndeclaredSpecOp(spec)
    if spec.declared:
        return MapSpecOp(spec) if spec.has_mapping else SpecOp(spec)
    return UndeclaredMapSpecOp(spec) if spec.has_mapping else UndeclaredSpecOp(spec)


# --------------------------------------------------------------------------- oracle

def _box(lo, hi):
    return itertools.product(*[range(a, b) for a, b in zip(lo, hi)])


def oracle_pair_inputs(spec: OpSpec, pair: Pair, i: int) -> set[int]:
    """Flat input-i cells of one pair (pure Python)."""
    shape = spec.in_shapes[i]
    if pair.pkind is None:
        return set(pair.ins[i])
    nd_out = len(spec.out_shape)
    proj = [tuple(unflat(o, spec.out_shape)[d % nd_out] % shape[d] for d in range(len(shape)))
            for o in pair.out]
    res = set()
    if not proj:
        return res
    r = pair.r
    if pair.pkind == "radius":
        for p in proj:
            lo = [max(0, c - r) for c in p]
            hi = [min(n, c + r + 1) for c, n in zip(p, shape)]
            res.update(flat_of(c, shape) for c in _box(lo, hi))
    else:
        lo = [max(0, min(p[d] for p in proj) - r) for d in range(len(shape))]
        hi = [min(shape[d], max(p[d] for p in proj) + r + 1) for d in range(len(shape))]
        res.update(flat_of(c, shape) for c in _box(lo, hi))
    return res


def oracle_default(spec: OpSpec, o: int, i: int) -> list[int]:
    """Input-i cells output cell ``o`` depends on under the default mapping."""
    kind, offs = spec.default
    cell = unflat(o, spec.out_shape)
    shape = spec.in_shapes[i]
    if kind == "identity":
        return [flat_of(cell, shape)]
    src = [c - s for c, s in zip(cell, offs[i])]
    if kind == "roll":
        return [flat_of([c % n for c, n in zip(src, shape)], shape)]
    if all(0 <= c < n for c, n in zip(src, shape)):
        return [flat_of(src, shape)]
    return []


def relation(spec: OpSpec, kind: str) -> list[np.ndarray]:
    """Dependency matrices (out_size x in_size_i) for a relation kind:
    ``pairs`` (FULL/PAY), ``comp`` (pairs where covered, default elsewhere),
    ``map`` (default only), ``all`` (all-to-all)."""
    n_out = size_of(spec.out_shape)
    mats = [np.zeros((n_out, size_of(s)), bool) for s in spec.in_shapes]
    if kind == "all":
        return [~m for m in mats]
    covered = set()
    if kind in ("pairs", "comp"):
        for call in spec.calls:
            for pair in call.pairs:
                covered.update(pair.out)
                for i in range(spec.n_inputs):
                    ins = sorted(oracle_pair_inputs(spec, pair, i))
                    for o in set(pair.out):
                        mats[i][o, ins] = True
    if kind in ("comp", "map"):
        for o in range(n_out):
            if kind == "comp" and o in covered:
                continue
            for i in range(spec.n_inputs):
                mats[i][o, oracle_default(spec, o, i)] = True
    return mats


def reexec_kind(spec: OpSpec) -> str:
    """Relation a black-box re-run reproduces (the richest mode the op has)."""
    if "comp" in spec.modes and spec.has_mapping:
        return "comp"
    if "full" in spec.modes or "pay" in spec.modes:
        return "pairs"
    return "map" if spec.has_mapping else "all"


_KIND = {"full": "pairs", "pay": "pairs", "comp": "comp", "map": "map"}


def method_kind(spec: OpSpec, strategies: list[str], prefer: str | None, backward: bool) -> str | None:
    """Relation kind a trace step uses, following the documented planner rule
    (stored lineage indexed in the step's direction, then mapping functions, then
    stored lineage indexed the other way, then re-execution).  None when two
    candidates of equal rank mean different relations (the answer is then
    implementation-defined)."""
    stored = [s for s in strategies if s.count(":") == 2]
    if prefer == "reexec":
        return reexec_kind(spec)
    if prefer == "map" and spec.has_mapping:
        return "map"
    if prefer in stored:
        return _KIND[prefer.split(":")[0]]
    want = "backward" if backward else "forward"
    for group in ([s for s in stored if s.endswith(want)], None,
                  [s for s in stored if not s.endswith(want)]):
        if group is None:
            if "map" in strategies and spec.has_mapping:
                return "map"
            continue
        kinds = {_KIND[s.split(":")[0]] for s in group}
        if len(kinds) > 1:
            return None
        if kinds:
            return kinds.pop()
    return reexec_kind(spec)


def step(mat: np.ndarray, q: np.ndarray, backward: bool) -> np.ndarray:
    """One oracle step over a dependency matrix; q is a flat bool vector."""
    if backward:
        return mat[q].any(axis=0)
    return mat[:, q].any(axis=1)
