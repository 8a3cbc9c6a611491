"""What a re-run reads of its parent run: its arrays, and the lineage it stored,
as the pairs the operators wrote.

A re-run keeps the parent's tiles that its change cannot reach; their lineage
is the parent's, read back from the parent's stored backward strategies (keyed
by output cells, so a pair's output cells and what they depend on come back
whole) and handed to the driver with the pairs of the tiles that ran again, so
the re-run stores the relation a full run would.  Everything is read through
the parent's checked readers: lineage that fails its checks is
:class:`ParentUnavailable`, and the operator then runs every tile again (what cannot
be verified in the parent is recomputed, never reused).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from subzero.capture.buffer import Pairs, empty_pairs
from subzero.capture.tiles import concat_pairs
from subzero.errors import ParentUnavailable, StoreError
from subzero.model.cells import csr_rows, csr_take, lengths_to_offsets
from subzero.model.modes import Mode
from subzero.model.strategy import Direction, Strategy, modes_needed
from subzero.storage.arrays import ArrayStore
from subzero.storage.lineage import LineageStore, Prepared, StoredCopy
from subzero.storage.reader import StrategyReader
from subzero.storage.shards import ShardedReader

if TYPE_CHECKING:
    from subzero.model.workflow import Workflow

#: Which output cells (packed ids) a re-run keeps from the parent: a boolean per cell.
Keep = Callable[[np.ndarray], np.ndarray]


def keep_all(cells: np.ndarray) -> np.ndarray:
    """The :data:`Keep` of a re-run that keeps every output cell of the parent's."""
    return np.ones(len(cells), bool)
#: What reads a stored strategy back (the run's LMDB, or the shards Spark tasks wrote).
Reader = StrategyReader | ShardedReader


@dataclass
class Parent:
    """The parent run of a re-run, opened and verified by its caller."""

    run_id: int
    arrays: ArrayStore
    lineage: LineageStore | None
    #: per operator, the strategies the parent kept (after its disk budget)
    strategies: Mapping[str, tuple[Strategy, ...]]
    shapes: Mapping[str, tuple[int, ...]]
    #: per operator, the digest of its statistic's value as the parent's record gives it
    statistics: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: per operator, the digest of the file of its statistic's merged states
    rounds: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: (operator, mode) -> pairs captured in this process from a run of the operator on
    #: the parent's inputs (its profiler's: :mod:`subzero.runs.planned`): of a mode the
    #: parent did not store, or the pairs its own step captured and stored; used before
    #: reading the parent's lineage back
    side: Mapping[tuple[str, str], Pairs] = dataclasses.field(default_factory=dict)
    #: operator -> strategy -> what the parent's verified record says of its stored
    #: lineage (pairs, space sizes, write seconds): the strategies it can be copied from
    stored: Mapping[str, Mapping[str, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    #: (operator, strategy) -> that strategy of ``side``'s pairs encoded already, in
    #: another process, or None (the run encodes it): :mod:`subzero.runs.ahead`
    ahead: Callable[[str, Strategy], Prepared | None] | None = None

    @property
    def dir(self) -> Path:
        """The parent run's folder."""
        return self.arrays.dir.parent

    def pairs(self, op: str, wanted: tuple[Strategy, ...], n_inputs: int, keep: Keep
              ) -> tuple[Pairs | None, Pairs | None]:
        """The parent's (full, payload) pairs of operator ``op`` whose output cells
        ``keep`` keeps (a pair keeps those of its output cells), for the modes the
        strategies ``wanted`` capture; (None, None) when they capture none."""
        modes = modes_needed(wanted)
        if not modes:
            return None, None
        pay_modes = modes & {Mode.PAY, Mode.COMP}
        if len(pay_modes) > 1:
            raise ParentUnavailable(f"{op!r} captures both Pay and Comp pairs")
        if self.lineage is None and any((op, m.value) not in self.side for m in modes):
            raise ParentUnavailable(f"run {self.run_id} stored no lineage")
        full = pay = None
        for mode in modes:
            given = self.side.get((op, mode.value))
            try:
                s = None if given is not None else self._stored(op, mode)
                if s is not None:
                    assert self.lineage is not None      # _stored found a strategy in it
                    reader = self.lineage.reader(op, s)
                    got = _read_pairs(reader, s.payload, n_inputs, keep) \
                        if s.direction is Direction.BACKWARD else _read_forward(reader, n_inputs, keep)
                elif given is not None:
                    got = _cut_pairs(given, keep)
                else:
                    raise ParentUnavailable(f"run {self.run_id} keeps no {mode} lineage of "
                                            f"{op!r} it can read back")
            except (StoreError, OSError, ValueError) as e:
                raise ParentUnavailable(f"the lineage of {op!r} in run {self.run_id} cannot be "
                                        f"read ({e})") from e
            if mode is Mode.FULL:
                full = got
            else:
                pay = got
        return full, pay

    def copies(self, op: str, wanted: tuple[Strategy, ...], run_uid: str | None
               ) -> dict[str, StoredCopy]:
        """The strategies of ``wanted`` that a run with uid ``run_uid`` stores as copies of
        the parent's lineage of the whole operator ``op`` (strategy text -> the copy, read
        and checked): those the parent stored and its record describes, in a form
        :meth:`LineageStore.stored_copy` copies.  Copying them skips decoding the pairs and
        encoding them again (at genomics 10,000x, encoding ``extract``'s FullOne backward
        took 10 s of the run made from its profiling run; it holds 3 MB).  A strategy
        whose lineage fails its checks is not copied: its pairs are read back, and what
        cannot be read is recomputed."""
        if self.lineage is None or run_uid is None:
            return {}
        out = {}
        for s in wanted:
            rec = self.stored.get(op, {}).get(str(s))
            if not s.stored or rec is None or s not in self.strategies.get(op, ()):
                continue
            copy = self.lineage.stored_copy(op, s)
            if copy is not None:
                copy.record = dict(rec)
                out[str(s)] = copy
        return out

    def _stored(self, op: str, mode: Mode) -> Strategy | None:
        """The parent's strategy of ``mode`` to read pairs back from: a backward one (a
        pair comes back whole), else, for Full pairs, a forward one (each input's space
        gives its part of the relation; payload pairs stored forward keep no payloads);
        None when it keeps none."""
        kept = [s for s in self.strategies.get(op, ()) if s.stored and s.mode is mode
                and self.lineage is not None and self.lineage.meta(op, s) is not None]
        for s in kept:
            if s.direction is Direction.BACKWARD:
                return s
        for s in kept:
            if not s.payload:
                return s
        return None


def _cut(cells: np.ndarray, off: np.ndarray, keep: Keep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pair's cells (CSR ``cells``/``off``) cut to those ``keep`` keeps: (the cells
    kept, their offsets, the pairs that keep any)."""
    m = keep(cells)
    n_keep = np.bincount(csr_rows(off)[m], minlength=len(off) - 1)
    live = np.flatnonzero(n_keep > 0)
    return cells[m], lengths_to_offsets(n_keep[live]), live


def _cut_pairs(p: Pairs, keep: Keep) -> Pairs:
    """``p`` with each pair's output cells cut to those ``keep`` keeps (pairs left without
    any dropped)."""
    out, out_off, live = _cut(p.out, p.out_off, keep)
    if p.pay_ids is not None:
        return Pairs(out, out_off, pay_ids=np.asarray(p.pay_ids, np.int64)[live],
                     payloads=list(p.payloads or ()))
    return Pairs(out, out_off, [csr_take(c, o, live) for c, o in zip(p.ins, p.in_offs)],
                 [lengths_to_offsets(np.diff(o)[live]) for o in p.in_offs])


def _read_pairs(reader: Reader, payload: bool, n_inputs: int, keep: Keep) -> Pairs:
    """Every pair of a backward strategy's key space, its output cells cut to ``keep``."""
    pids = reader.all_pairs("b")
    if pids.size == 0:
        return empty_pairs(n_inputs, payload)
    keys, koff = reader.scan_keys("b", pids)
    fields = ["pay"] if payload else [f"v{i}" for i in range(n_inputs)]
    recs = reader.records("b", pids, fields)
    if payload:
        ids, table = recs["pay"]
        return _cut_pairs(Pairs(keys, koff, pay_ids=np.asarray(ids, np.int64),
                                payloads=list(table)), keep)
    return _cut_pairs(Pairs(keys, koff, [recs[f"v{i}"][0] for i in range(n_inputs)],
                            [recs[f"v{i}"][1] for i in range(n_inputs)]), keep)


def _read_forward(reader: Reader, n_inputs: int, keep: Keep) -> Pairs:
    """The pairs of a forward Full strategy, one input's space at a time: pair k of space
    ``f{i}`` relates its value cells (output) to its key cells of input i.  Together
    they are the relation the operator stored (a pair without cells of an input has no
    edge there, as a forward strategy stores it)."""
    parts: list[Pairs | None] = []
    for i in range(n_inputs):
        space = f"f{i}"
        if not reader.has_space(space):
            continue
        pids = reader.all_pairs(space)
        if pids.size == 0:
            continue
        keys, koff = reader.scan_keys(space, pids)
        out, ooff = reader.records(space, pids, ["v"])["v"]
        out, out_off, live = _cut(out, ooff, keep)
        ins = [np.zeros(0, np.int64)] * n_inputs
        offs = [np.zeros(len(live) + 1, np.int64)] * n_inputs
        ins[i] = csr_take(keys, koff, live)
        offs[i] = lengths_to_offsets(np.diff(koff)[live])
        parts.append(Pairs(out, out_off, ins, offs))
    return concat_pairs(parts, n_inputs) or empty_pairs(n_inputs, False)


@dataclass
class ParentPlan:
    """A parent run as plain data (what a Spark task gets to open it): its folder, uid,
    the input digests and strategies of its verified record, and what its statistics
    were.  The driver verified the run's signature before making this; the arrays and
    lineage opened from it check that every byte read is bound to that uid and those
    inputs."""

    run_id: int
    dir: str
    uid: str | None
    #: input name -> content digest, from the verified record (None: an unsigned run,
    #: whose references are checked against their own seal only)
    digests: dict[str, str | None] | None
    #: operator -> strategies (their text), as the parent kept them
    strategies: dict[str, list[str]]
    shapes: dict[str, tuple[int, ...]]
    statistics: dict[str, str]
    rounds: dict[str, str]
    tile: int
    #: how the parent's catalog row describes each input
    described: dict[str, str]
    #: operator -> strategy -> its record's pairs, space sizes and write seconds (from
    #: the verified record; empty for a journal written before it was kept)
    stored: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data (a re-run's journal keeps it, to resume as a re-run)."""
        d = dataclasses.asdict(self)
        d["shapes"] = {k: list(v) for k, v in self.shapes.items()}
        return d

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> ParentPlan:
        """A plan from :meth:`as_dict`'s data."""
        # a field with a default may be missing (a journal written before it existed)
        kw = {f.name: d[f.name] for f in dataclasses.fields(cls)
              if f.name in d or (f.default is dataclasses.MISSING
                                 and f.default_factory is dataclasses.MISSING)}
        kw["shapes"] = {k: tuple(int(n) for n in v) for k, v in d["shapes"].items()}
        return cls(**kw)

    def strategy_map(self) -> dict[str, tuple[Strategy, ...]]:
        from subzero.model.strategy import parse
        return {n: parse("+".join(ss)) for n, ss in self.strategies.items()}

    def open(self, wf: Workflow | None = None) -> Parent:
        """The parent's arrays and lineage, opened for reading (close its lineage).
        ``wf``: the parent's workflow (trusted by the caller), which makes the arrays
        the parent did not keep again when the re-run reads them."""
        arrays = ArrayStore(self.dir, run_uid=self.uid, inputs=self.digests)
        if wf is not None:
            from subzero.engines.remake import chunk_remaker, remaker
            arrays.recompute = remaker(wf, arrays.read_value)
            arrays.recompute_chunk = chunk_remaker(wf, arrays.describe, arrays.read_region)
        lin = Path(self.dir) / "lineage"
        lineage = LineageStore(lin, readonly=True, run_uid=self.uid) if lin.is_dir() else None
        return Parent(self.run_id, arrays, lineage, self.strategy_map(), self.shapes,
                      dict(self.statistics), dict(self.rounds), stored=self.stored)

    def inputs(self, parent: Parent, names: list[str], given: Mapping[str, Any]) -> dict[str, Any]:
        """A re-run's input values: the ``given`` ones, and the parent's own for the
        others (a DataArray as a DataArray, with its labels; else read region by region
        from the parent's verified store)."""
        values: dict[str, Any] = {}
        for name in names:
            if name in given:
                values[name] = given[name]
                continue
            _, _, numpy = parent.arrays.describe(name)
            values[name] = StoredInput(parent.arrays, name) if numpy else parent.arrays.read_value(name)
        return values

    def share_unchanged(self, parent: Parent, arrays: ArrayStore, names: list[str],
                        given: Mapping[str, Any]) -> None:
        """The re-run reads each unchanged input from the store's copy the parent reads
        (one copy still), when the parent has one in this store."""
        for name in names:
            if name in given:
                continue
            ref = parent.arrays.ref(name)
            if ref is not None and ref.store == arrays.store_uid():
                arrays.refer(name, ref.digest, ref.form, ref.numpy)


class StoredInput:
    """An input of the parent run, read region by region from its verified store (with
    the dims and attributes it was stored with, so the re-run stores it in the same
    form, and shares the store's one copy of it)."""

    def __init__(self, arrays: ArrayStore, name: str):
        self.arrays, self.name = arrays, name
        shape, dtype, _ = arrays.describe(name)
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        dims, _, attrs = arrays.grid_parts(name)
        self.dims, self.attrs = tuple(dims), dict(attrs)

    def read_region(self, region: tuple[slice, ...]) -> np.ndarray:
        return self.arrays.read_region(self.name, region)

    def __repr__(self) -> str:
        return f"StoredInput({self.name!r} of {self.arrays.label(self.name)})"
