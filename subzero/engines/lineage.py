"""Encode and write one operator's captured lineage under the run's disk budget,
with the size statistics the cost model needs."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from subzero.capture.buffer import Pairs, empty_pairs
from subzero.capture.runner import mapping_context
from subzero.engines.stats import OpStats
from subzero.errors import LineageError
from subzero.model.cells import as_cells, first_out_of_bounds, fmt_cell, pack, unique, unpack
from subzero.model.modes import Mode
from subzero.model.operator import Operator, own_code
from subzero.model.reach import check, declared
from subzero.model.strategy import BLACKBOX, MAP, Direction, Encoding, Strategy, reexecuted
from subzero.storage.budget import DiskBudget
from subzero.storage.encodings import KEY_BITS, MapPPairs
from subzero.storage.lineage import (
    LineageStore,
    Prepared,
    ShardWrite,
    StoredCopy,
    commit_shard_files,
    write_shard,
)
from subzero.storage.space import full_disk_named


def store_lineage(name: str, op: Operator, strategies: tuple[Strategy, ...], full: Pairs | None,
                  pay: Pairs | None, out_shape: tuple[int, ...], in_shapes: list[tuple[int, ...]],
                  lineage: LineageStore, stats: OpStats, budget: DiskBudget | None = None,
                  copies: Mapping[str, StoredCopy] | None = None,
                  ahead: Callable[[Strategy], Prepared | None] | None = None) -> None:
    """Encode and write every stored strategy of one operator; with a ``budget``, a
    strategy that would overflow it is not kept (see :class:`DiskBudget`).  ``copies``:
    strategies stored as copies of another run's lineage of the operator (a re-run's
    parent's), not encoded from ``full`` / ``pay``; their statistics are the other run's
    record's, write seconds included (what storing them costs, for the cost model).
    ``ahead(s)``: ``s`` of these pairs encoded already in another process, or None
    (:mod:`subzero.runs.ahead`); its write seconds count that encoding's."""
    counted, expanded = map_p_counting(name, op, in_shapes, out_shape)
    copies = copies or {}
    encoded = tuple(s for s in strategies if str(s) not in copies)
    reach = checked_reach(name, op, encoded, pay, out_shape, in_shapes)

    def write(s: Strategy) -> dict:
        copy = copies.get(str(s))
        if copy is not None:
            rec = copy.record
            with full_disk_named(lineage.path, f"the lineage of operator {name!r} ({s})"):
                w = lineage.write_copy(name, s, copy, int(rec["pairs"]))
            return {"strategy": str(s), "bytes": w.bytes, "write_s": float(rec["write_s"]),
                    "pairs": w.pairs, "spaces": rec["spaces"]}
        pairs = pay if s.payload else full
        if pairs is None:
            pairs = empty_pairs(len(in_shapes), s.payload)
        expanded.clear()
        prepared = ahead(s) if ahead is not None else None
        if prepared is not None:          # what map_p expanded to where it was encoded
            expanded.update(prepared.expanded)
        with full_disk_named(lineage.path, f"the lineage of operator {name!r} ({s})"):
            w = lineage.write(name, s, pairs, out_shape, in_shapes, counted,
                              reach if s.payload else None, prepared)
        return {"strategy": str(s), "bytes": w.bytes, "write_s": w.seconds, "pairs": w.pairs,
                "spaces": space_stats(s, pairs, out_shape, in_shapes, expanded)}

    _under_budget(name, op, strategies, lineage, stats, budget, write)


def _under_budget(name: str, op: Operator, strategies: tuple[Strategy, ...], lineage: LineageStore,
                  stats: OpStats, budget: DiskBudget | None, write: Callable[[Strategy], dict],
                  discard: Callable[[Strategy], object] = lambda s: None) -> None:
    """Every stored strategy of one operator written (``write(s)``: its statistics
    record, ``bytes`` included) and kept while the run's disk budget holds: one its
    prediction already overflows is not written (``discard(s)`` removes what the
    operator's tasks left of it), one whose bytes overflow is dropped again -- this
    operator's own write, never earlier lineage."""
    dropped = []
    for s in strategies:
        if not s.stored:
            continue
        predicted = budget.predicted.get((name, str(s))) if budget is not None else None
        if budget is not None and predicted is not None and not budget.fits(predicted):
            discard(s)
            budget.downgrade(name, s, predicted, None)
            dropped.append(s)
            continue
        rec = write(s)
        if budget is not None and not budget.fits(rec["bytes"]):
            lineage.drop(name, s)
            budget.downgrade(name, s, predicted, rec["bytes"])
            dropped.append(s)
            continue
        if budget is not None:
            budget.used += rec["bytes"]
        stats.per_strategy.append(rec)
        stats.lineage_bytes += rec["bytes"]
    _keep(op, strategies, dropped, stats)


def _keep(op: Operator, strategies: tuple[Strategy, ...], dropped: list[Strategy], stats: OpStats) -> None:
    """The strategies the operator keeps once ``dropped`` did not fit the budget."""
    if dropped:
        kept = [s for s in strategies if s not in dropped]
        if reexecuted(kept):
            kept = [MAP if Mode.MAP in op.supported_modes() and op.has_mapping() else BLACKBOX]
        stats.strategies = [str(s) for s in kept]


def checked_reach(name: str, op: Operator, strategies: Sequence[Strategy], pay: Pairs | None,
                  out_shape: tuple[int, ...], in_shapes: Sequence[tuple[int, ...]],
                  ) -> tuple[int | None, ...] | None:
    """The operator's declared payload reach, checked on every payload pair it wrote
    (:func:`subzero.model.reach.check` raises a :class:`LineageError` naming the first
    pair that reaches farther), or None when it declares none or stores no payload
    strategy.  What this returns is recorded with the lineage, and only that: a
    forward trace never trusts a reach that was not checked."""
    if not any(s.stored and s.payload for s in strategies):
        return None
    reach = declared(op, len(in_shapes), name)
    if reach is None or pay is None or pay.n == 0:
        return reach
    assert pay.pay_ids is not None and pay.payloads is not None, "payload pairs carry payloads"
    mctx = mapping_context(name, op, in_shapes, out_shape)

    def map_p_pairs(cells: np.ndarray, off: np.ndarray, payloads: Sequence[bytes],
                    pay_ids: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
        with own_code(name, op, "map_p_pairs"):
            return op.map_p_pairs(cells, off, payloads, pay_ids, i, mctx)

    check(name, reach, unpack(pay.out, out_shape), pay.out_off, pay.payloads, pay.pay_ids,
          map_p_pairs, out_shape, in_shapes)
    return reach


def map_p_counting(name: str, op: Operator, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...],
                    ) -> tuple[MapPPairs, dict[int, dict[str, int]]]:
    """``map_p`` at capture time (forward-keyed payload strategies), checked like at
    query time, and counting what it expands to per input (for the cost model's
    statistics): returns (the callback, the counts it fills)."""
    mctx = mapping_context(name, op, in_shapes, out_shape)
    expanded: dict[int, dict[str, int]] = {}

    def counted(cells: np.ndarray, off: np.ndarray, payloads: Sequence[bytes], pay_ids: np.ndarray,
                i: int) -> tuple[np.ndarray, np.ndarray]:
        with own_code(name, op, "map_p_pairs"):
            res, owner = op.map_p_pairs(cells, off, payloads, pay_ids, i, mctx)
        res = as_cells(res, len(in_shapes[i])) if len(res) else np.zeros((0, len(in_shapes[i])), np.int64)
        bad = first_out_of_bounds(res, in_shapes[i])
        if bad is not None:
            raise LineageError(f"operator {name!r}: map_p returned cell {fmt_cell(res[bad])} outside "
                               f"input {i} (shape {tuple(in_shapes[i])})")
        owner = np.asarray(owner, np.int64)
        packed = pack(res, in_shapes[i]) if len(res) else np.zeros(0, np.int64)
        expanded[i] = {"key_cells": int(packed.size), "key_blocks": _key_blocks(packed),
                       "pairs": _distinct(owner)}
        return res, owner

    return counted, expanded


@dataclass
class TileShard:
    """What a Spark task wrote of one stored strategy: the shard (under its attempt's
    name) and the statistics of its pairs."""

    strategy: str
    write: ShardWrite
    spaces: dict


def write_tile_shards(lineage_dir: str, stem: str, attempt: int, name: str, op: Operator,
                      strategies: tuple[Strategy, ...], full: Pairs | None, pay: Pairs | None,
                      out_shape: tuple[int, ...], in_shapes: Sequence[tuple[int, ...]],
                      run_uid: str | None = None) -> list[TileShard]:
    """On an executor: encode one task's captured pairs of each stored strategy into
    its own shard (:func:`subzero.storage.lineage.write_shard`), bound to the run
    ``run_uid`` when it has one."""
    out = []
    out_shape, in_shapes = tuple(out_shape), [tuple(s) for s in in_shapes]
    reach = checked_reach(name, op, strategies, pay, out_shape, in_shapes)
    for s in strategies:
        if not s.stored:
            continue
        pairs = pay if s.payload else full
        if pairs is None or pairs.n == 0:
            continue
        counted, expanded = map_p_counting(name, op, in_shapes, out_shape)
        with full_disk_named(lineage_dir, f"the lineage of operator {name!r} ({s})"):
            w = write_shard(lineage_dir, stem, attempt, name, s, pairs, out_shape, in_shapes,
                            counted, run_uid, reach if s.payload else None)
        if w is not None:
            out.append(TileShard(str(s), w, space_stats(s, pairs, out_shape, in_shapes, expanded)))
    return out


def commit_tile_shards(name: str, op: Operator, strategies: tuple[Strategy, ...], shards: list[TileShard],
                       out_shape: tuple[int, ...], in_shapes: list[tuple[int, ...]], lineage: LineageStore,
                       stats: OpStats, budget: DiskBudget | None = None) -> None:
    """On the driver, once an operator's tasks succeeded: commit the shards of the
    attempts whose results came back and record each strategy as sharded, under the
    disk budget like :func:`store_lineage` (a strategy that does not fit is not kept,
    and its shards are removed)."""

    def write(s: Strategy) -> dict:
        t0 = time.perf_counter()
        mine = [t for t in shards if t.strategy == str(s)]
        with full_disk_named(lineage.path, f"the lineage of operator {name!r} ({s})"):
            metas = commit_shard_files(lineage.path, name, s, [t.write.meta for t in mine])
            # every task checked its pairs against the declared reach before writing them
            size = lineage.commit_shards(name, s, out_shape, in_shapes, metas,
                                         declared(op, len(in_shapes), name) if s.payload else None)
        return {"strategy": str(s), "bytes": size,
                "write_s": sum(t.write.seconds for t in mine) + time.perf_counter() - t0,
                "pairs": sum(t.write.pairs for t in mine),
                "spaces": _sum_spaces([t.spaces for t in mine], s, out_shape, in_shapes)}

    _under_budget(name, op, strategies, lineage, stats, budget, write,
                  discard=lambda s: commit_shard_files(lineage.path, name, s, []))


def _sum_spaces(parts: list[dict], s: Strategy, out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]],
                ) -> dict:
    """The shards' space statistics as one strategy's: counts added up (key blocks and
    distinct payloads may count twice where tiles share them)."""
    if not parts:
        from subzero.capture.buffer import empty_pairs
        return space_stats(s, empty_pairs(len(in_shapes), s.payload), out_shape, in_shapes)
    out: dict = {}
    for part in parts:
        for space, d in part.items():
            acc = out.setdefault(space, {})
            for k, v in d.items():
                acc[k] = v if k == "key_size" else acc.get(k, 0) + v
    return out


def _distinct(owner: np.ndarray) -> int:
    """How many pairs ``owner`` (a pair index per expanded cell) names: one bincount
    where the indices are pair numbers, as they are (a hashed unique was 1.2 s of the
    1.6 s of encoding genomics' ``model`` at 1,000x, 7.7M cells of 70 pairs)."""
    if owner.size == 0:
        return 0
    if int(owner.min()) < 0:
        return int(unique(owner).size)
    return int(np.count_nonzero(np.bincount(owner)))


def _key_blocks(packed: np.ndarray) -> int:
    """Key-index blocks (2**KEY_BITS consecutive cells) that packed key cells fall in."""
    return int(np.count_nonzero(np.bincount(packed >> KEY_BITS))) if packed.size else 0


def space_stats(s: Strategy, pairs: Pairs, out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]],
                expanded: dict[int, dict[str, int]] | None = None) -> dict:
    """Sizes of what one stored strategy holds, per key side ("b", "f0", ...): pairs,
    key cells and the key blocks they fall in, value cells, record cells, distinct
    payloads.  The query cost model prices lookups and scans from these; they are
    counts only (one bincount per key side), cheap enough to take at every capture."""
    nonempty = np.diff(pairs.out_off) > 0
    many = s.encoding in (Encoding.FULLMANY, Encoding.PAYMANY)
    if s.direction is Direction.BACKWARD:
        vals = 0 if s.payload else int(sum(a.size for a in pairs.ins))
        rec = vals + (int(pairs.out.size) if (many or s.payload) else 0)
        d = {"pairs": int(np.count_nonzero(nonempty)), "key_cells": int(pairs.out.size),
             "key_blocks": _key_blocks(pairs.out), "key_size": int(np.prod(out_shape)),
             "value_cells": vals, "record_cells": rec}
        if s.payload:
            assert pairs.pay_ids is not None        # a payload strategy holds payload pairs
            d["payloads"] = _distinct(pairs.pay_ids) if pairs.n else 0
            d["covered"] = int(pairs.out.size)
        return {"b": d}
    out = {}
    lens_out = np.diff(pairs.out_off)
    for i, shp in enumerate(in_shapes):
        if s.payload:
            e = (expanded or {}).get(i, {"key_cells": 0, "key_blocks": 0, "pairs": 0})
            kc, kb, p = e["key_cells"], e["key_blocks"], e["pairs"]
            vals = int(lens_out.sum())
        else:
            has = (np.diff(pairs.in_offs[i]) > 0) & nonempty
            kc, kb, p = int(pairs.ins[i].size), _key_blocks(pairs.ins[i]), int(np.count_nonzero(has))
            vals = int(lens_out[has].sum())
        out[f"f{i}"] = {"pairs": p, "key_cells": kc, "key_blocks": kb,
                        "key_size": int(np.prod(shp)), "value_cells": vals,
                        "record_cells": vals + (kc if many or s.payload else 0)}
    return out
