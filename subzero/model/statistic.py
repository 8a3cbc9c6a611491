"""Whole-array statistics that operators run per tile need before they start.

Some operators are local except for one number taken over the whole array: a
noise level for a detection threshold, the sky's median as a fill value.  Run
per tile, each tile would compute its own number and the tiles would not
agree with the whole-array run.  Such an operator declares a
:class:`Statistic`; an engine computes it first, in *rounds* of per-tile
partials merged in a tree (plain data, no global state: the same code runs in
a Spark task), and hands the finished value to every tile as
``ctx.statistic``.  The in-process engine computes it from the whole array
the same way (one block), so both engines see the same value.

A statistic is exact when merging the partials of any tiling gives what the
whole array's single partial gives.  :class:`ExactMedian` shows a statistic
that needs more than one round: an exact order statistic by radix selection,
16 bits of the value per round, never more than a histogram per tile;
:class:`ExactMAD` chains two such selections (the median, then the median of
the distances to it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import numpy as np

Slices = tuple[slice, ...]
#: A box of an array: ``(lo, hi)`` per axis, half-open.
Box = tuple[tuple[int, int], ...]


class Statistic:
    """A whole-array statistic computed over tiles.

    ``halo``: cells around each tile's core that :meth:`partial` reads (a value
    decided by a neighbourhood, such as a dilated mask).  ``rounds``: passes
    over the tiles; each round's :meth:`finish` result is handed to the next
    round's partials as ``prior``, and the last round's is the statistic.
    The statistic is taken over the operator's first input.
    """

    halo: int = 0
    rounds: int = 1
    #: :meth:`merge` is a sum that :meth:`subtract` undoes exactly (integer counts): a
    #: re-run then updates the parent's merged state with the tiles that changed only
    subtractive: bool = False

    def partial(self, block: np.ndarray, core: Slices, origin: tuple[int, ...],
                shape: tuple[int, ...], prior: Any) -> Any:  # pragma: no cover - abstract
        """This tile's partial state.  ``block`` is the tile's core plus ``halo``
        (clipped at the array's edges), starting at array cell ``origin``;
        ``block[core]`` is the core; ``shape`` is the whole array's."""
        raise NotImplementedError(f"{type(self).__name__} must implement partial()")

    def merge(self, a: Any, b: Any) -> Any:  # pragma: no cover - abstract
        """Two partials merged (associative: Spark merges them in a tree)."""
        raise NotImplementedError(f"{type(self).__name__} must implement merge()")

    def finish(self, state: Any, prior: Any) -> Any:
        """The round's result from the merged partials."""
        return state

    def subtract(self, a: Any, b: Any) -> Any:
        """``a`` without the partial ``b`` merged into it (for :attr:`subtractive` ones)."""
        raise NotImplementedError(f"{type(self).__name__} is not subtractive")

    def prepared(self, block: np.ndarray, core: Slices, origin: tuple[int, ...],
                 shape: tuple[int, ...]) -> Any:
        """What of a tile every round's partial starts from (None: nothing; each round
        calls :meth:`partial`).  A re-run keeps it for the few tiles that changed, so a
        costly step before the partial (a mask) is taken once, not once per round."""
        return None

    def partial_of(self, prepared: Any, prior: Any) -> Any:
        """This tile's partial from what :meth:`prepared` gave."""
        raise NotImplementedError(f"{type(self).__name__} keeps nothing between rounds")

    def partial_key(self, prior: Any) -> Any:
        """What of a round's ``prior`` its partials depend on (two priors with one key give
        every tile the same partial): a re-run updates a round's merged state as long as
        its new prior has the old one's key.  Default: all of it."""
        return prior


def value_digest(value: Any) -> str | None:
    """A statistic's value as a digest (SHA-256 of its pickle): two runs whose digests
    agree saw the same value, bit for bit.  (Digests that differ may still be one value
    pickled by two numpy versions: a re-run then only runs more than it must.)  None
    when the value cannot be pickled."""
    import hashlib
    import pickle
    try:
        return hashlib.sha256(pickle.dumps(value, protocol=5)).hexdigest()
    except Exception:
        return None


def whole(stat: Statistic, values: np.ndarray) -> Any:
    """The statistic of a whole array: every round over one block."""
    values = np.asarray(values)
    return over_blocks(stat, lambda box: values, [tuple((0, n) for n in values.shape)], values.shape)


def block_around(core: Box, halo: int, shape: Sequence[int]) -> tuple[Box, Slices]:
    """The block a partial reads for a tile's ``core`` (``(lo, hi)`` per axis): the core
    grown by ``halo``, clipped at the array's edges; and the core within that block."""
    box = tuple((max(0, a - halo), min(int(n), b + halo)) for (a, b), n in zip(core, shape))
    return box, tuple(slice(a - b0, b - b0) for (a, b), (b0, _) in zip(core, box))


def over_blocks(stat: Statistic, read: Callable[[Box], np.ndarray], cores: Sequence[Box],
                shape: tuple[int, ...], states: list | None = None) -> Any:
    """The statistic over tiles in one process: each round reads every core (``(lo,
    hi)`` per axis) grown by ``stat.halo`` through ``read`` and merges the partials,
    as the Spark engine does across its tasks.  ``states``, when given, receives each
    round's merged state (what a re-run updates: :func:`updated`)."""
    prior = None
    for _ in range(stat.rounds):
        acc = _merged(stat, read, cores, shape, prior)
        if states is not None:
            states.append(acc)
        prior = stat.finish(acc, prior)
    return prior


def _merged(stat: Statistic, read: Callable[[Box], np.ndarray], cores: Sequence[Box],
            shape: tuple[int, ...], prior: Any) -> Any:
    acc: Any = None
    for k, core in enumerate(cores):
        part = _partial(stat, read, core, shape, prior)
        acc = part if k == 0 else stat.merge(acc, part)
    return acc


def _partial(stat: Statistic, read: Callable[[Box], np.ndarray], core: Box, shape: tuple[int, ...],
             prior: Any) -> Any:
    box, inner = block_around(core, int(stat.halo), shape)
    return stat.partial(read(box), inner, tuple(a for a, _ in box), tuple(shape), prior)


class _Prepared:
    """A tile's :meth:`Statistic.prepared` data, taken once and used every round."""

    def __init__(self, stat: Statistic, read: Callable[[Box], np.ndarray], shape: tuple[int, ...]):
        self.stat, self.read, self.shape = stat, read, shape
        self.kept: dict[Box, Any] = {}

    def partial(self, core: Box, prior: Any) -> Any:
        if core not in self.kept:
            box, inner = block_around(core, int(self.stat.halo), self.shape)
            self.kept[core] = self.stat.prepared(self.read(box), inner, tuple(a for a, _ in box),
                                                 tuple(self.shape))
        data = self.kept[core]
        if data is None:
            return _partial(self.stat, self.read, core, self.shape, prior)
        return self.stat.partial_of(data, prior)


def updated(stat: Statistic, old_states: Sequence[Any], read_old: Callable[[Box], np.ndarray],
            read_new: Callable[[Box], np.ndarray], changed: Sequence[Box], cores: Sequence[Box],
            shape: tuple[int, ...], states: list | None = None) -> tuple[Any, Any]:
    """(the new value, the old value) of a :attr:`~Statistic.subtractive` statistic whose
    input changed only in the tiles ``changed`` (cores whose blocks, halo included, meet a
    change): each round's merged state is the old one (``old_states``, as
    :func:`over_blocks` gave them) without those tiles' old partials and with their new
    ones -- while the new rounds' priors are the old ones; from the first round whose
    prior differs, every tile (``cores``) of the new input is merged again.  ``states``
    receives the new merged states."""
    old_prior = new_prior = None
    same = True
    olds, news = _Prepared(stat, read_old, shape), _Prepared(stat, read_new, shape)
    for r in range(stat.rounds):
        if same:
            acc = old_states[r]
            for core in changed:
                acc = stat.subtract(acc, olds.partial(core, old_prior))
                acc = stat.merge(acc, news.partial(core, new_prior))
        else:
            acc = _merged(stat, read_new, cores, shape, new_prior)
        if states is not None:
            states.append(acc)
        old_prior = stat.finish(old_states[r], old_prior)
        new_prior = stat.finish(acc, new_prior)
        if r + 1 < stat.rounds:
            same = same and same_value(stat.partial_key(old_prior), stat.partial_key(new_prior))
    return new_prior, old_prior


def finished(stat: Statistic, states: Sequence[Any]) -> Any:
    """A statistic's value from its rounds' merged states (as :func:`over_blocks` gave
    them)."""
    prior = None
    for acc in states:
        prior = stat.finish(acc, prior)
    return prior


def same_value(a: Any, b: Any) -> bool:
    """Whether two statistic values (or priors) are the same, bit for bit: numbers,
    arrays, and the plain containers statistics are made of."""
    import pickle
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    try:
        return pickle.dumps(a, protocol=5) == pickle.dumps(b, protocol=5)
    except Exception:
        return False


# --- an exact order statistic in rounds of histograms ------------------------------------------

BITS = 16                      # bits of the value settled per round: 65,536-bin histograms


def order_keys(values: np.ndarray) -> np.ndarray:
    """Unsigned integer keys that sort as the floating-point values do (the sign
    bit flipped for positives, every bit for negatives)."""
    v = np.ascontiguousarray(values)
    if v.dtype.kind != "f" or v.dtype.itemsize not in (4, 8):
        raise TypeError(f"order statistics need float32 or float64 values, not {v.dtype}")
    bits = 8 * v.dtype.itemsize
    ut = np.uint32 if bits == 32 else np.uint64
    u: np.ndarray[Any, Any] = v.view(ut)
    # negatives (sign bit set) flip every bit, positives only the sign bit
    flip = (u >> ut(bits - 1)) * ut((1 << (bits - 1)) - 1) | ut(1 << (bits - 1))
    return np.bitwise_xor(u, flip)


def key_value(key: int, dtype: np.dtype) -> Any:
    """The float whose :func:`order_keys` key is ``key``."""
    ut = np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint64
    k = ut(key)
    top = ut(1) << ut(8 * np.dtype(dtype).itemsize - 1)
    u = k & np.invert(top) if k & top else np.invert(k)
    return np.array([u], ut).view(dtype)[0]


#: Between two rounds of :class:`ExactMedian`: (bits settled, their prefix, rank left)
MedianRound = tuple[int, int, int]


class MADRound(TypedDict):
    """Between two rounds of :class:`ExactMAD`."""

    #: the values' median once found (then the deviations' median is sought), else None
    center: Any
    #: bits of the order keys settled in this phase
    done: int
    #: per middle rank: (prefix of settled bits, rank left within it); None as a phase starts
    targets: list[tuple[int, int]] | None


class _RadixSelect(Statistic):
    """What :class:`ExactMedian` and :class:`ExactMAD` share: the values a tile's core
    takes part with, checked, and 65,536-bin histograms of their next 16 bits."""

    dtype: np.dtype = np.dtype(np.float64)
    subtractive = True

    def subtract(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a - b

    def values(self, block: np.ndarray, core: Slices, origin: tuple[int, ...],
               shape: tuple[int, ...]) -> np.ndarray:
        """The values of this tile's core that take part (default: all)."""
        return block[core]

    def _taking_part(self, block: np.ndarray, core: Slices, origin: tuple[int, ...],
                     shape: tuple[int, ...]) -> np.ndarray:
        v = np.asarray(self.values(block, core, origin, shape), self.dtype).ravel()
        if np.isnan(v).any():
            raise ValueError(f"{type(self).__name__}: NaN values have no median")
        return v

    def merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b


def digit_counts(keys: np.ndarray, done: int, prefix: int) -> np.ndarray:
    """Histogram of the 16 bits after the first ``done`` of the order keys whose first
    ``done`` bits are ``prefix``."""
    width = 8 * keys.dtype.itemsize
    if done:
        keys = keys[(keys >> keys.dtype.type(width - done)) == prefix]
    digit = (keys >> keys.dtype.type(width - done - BITS)) & keys.dtype.type((1 << BITS) - 1)
    return np.bincount(digit.astype(np.intp), minlength=1 << BITS).astype(np.int64)


class ExactMedian(_RadixSelect):
    """The element of rank ``(n - 1) // 2`` (the lower median, what quickselect
    returns) of the values :meth:`values` picks from each tile's core, exact on
    any tiling.  Radix selection: round ``r`` histograms the next 16 bits of the
    order keys of the values whose higher bits are the ones already settled,
    so a tile sends 65,536 counts per round, whatever its size: two rounds for
    float32, four for float64.  NaN values are refused (they have no rank).
    """

    dtype: np.dtype = np.dtype(np.float32)

    @property
    def rounds(self) -> int:  # type: ignore[override]
        return 8 * np.dtype(self.dtype).itemsize // BITS

    def partial(self, block: np.ndarray, core: Slices, origin: tuple[int, ...],
                shape: tuple[int, ...], prior: MedianRound | None) -> np.ndarray:
        return self.partial_of(self.prepared(block, core, origin, shape), prior)

    def prepared(self, block: np.ndarray, core: Slices, origin: tuple[int, ...],
                 shape: tuple[int, ...]) -> np.ndarray:
        return order_keys(self._taking_part(block, core, origin, shape))

    def partial_of(self, keys: np.ndarray, prior: MedianRound | None) -> np.ndarray:
        return digit_counts(keys, 0, 0) if prior is None else digit_counts(keys, prior[0], prior[1])

    def partial_key(self, prior: MedianRound | None) -> Any:
        """A round's histogram depends on the bits settled, not the rank left in them."""
        return None if prior is None else (prior[0], prior[1])

    def finish(self, counts: np.ndarray, prior: MedianRound | None) -> MedianRound | Any:
        """Round results: ``(bits settled, their prefix, rank left within it)``;
        the value after the last round."""
        if prior is None:
            n = int(counts.sum())
            if n == 0:
                raise ValueError(f"{type(self).__name__}: no values to take the median of")
            done, prefix, rank = 0, 0, (n - 1) // 2
        else:
            done, prefix, rank = prior
        cum = np.cumsum(counts)
        digit = int(np.searchsorted(cum, rank, side="right"))
        rank -= int(cum[digit - 1]) if digit else 0
        done, prefix = done + BITS, (prefix << BITS) | digit
        if done == 8 * np.dtype(self.dtype).itemsize:
            return key_value(prefix, self.dtype)
        return done, prefix, rank


def lower_median(values: Sequence[float] | np.ndarray) -> Any:
    """The rank ``(n - 1) // 2`` element, by sorting (the oracle of the tests)."""
    v = np.sort(np.asarray(values).ravel())
    return v[(len(v) - 1) // 2]


def _middle_ranks(n: int) -> list[int]:
    """The ranks ``np.median`` averages: the middle one, or the two middle ones."""
    if n == 0:
        raise ValueError("no values to take the median of")
    return [(n - 1) // 2] if n % 2 else [n // 2 - 1, n // 2]


class ExactMAD(_RadixSelect):
    """The median absolute deviation ``median(|v - median(v)|)`` of the values
    :meth:`values` picks from each tile's core, equal to numpy's on the whole
    array (``np.median`` semantics: the mean of the two middle values when their
    number is even), on any tiling, without any tile sending more than
    histograms: radix selection of the middle rank(s) as in :class:`ExactMedian`,
    first of the values, then of their distances to that median -- eight rounds
    for float64.  The driver's memory does not grow with the array (a sample
    gathered to the driver would).  NaN values are refused."""

    @property
    def rounds(self) -> int:  # type: ignore[override]
        return 2 * (8 * np.dtype(self.dtype).itemsize // BITS)

    def partial(self, block: np.ndarray, core: Slices, origin: tuple[int, ...],
                shape: tuple[int, ...], prior: MADRound | None) -> np.ndarray:
        return self.partial_of(self.prepared(block, core, origin, shape), prior)

    def prepared(self, block: np.ndarray, core: Slices, origin: tuple[int, ...],
                 shape: tuple[int, ...]) -> np.ndarray:
        return self._taking_part(block, core, origin, shape)

    def partial_key(self, prior: MADRound | None) -> Any:
        """A round's histograms depend on the centre, the bits settled and their prefixes,
        not the ranks left in them."""
        if prior is None:
            return None
        targets = prior["targets"]
        return (prior["center"], prior["done"],
                None if targets is None else tuple(sorted({p for p, _ in targets})))

    def partial_of(self, v: np.ndarray, prior: MADRound | None) -> np.ndarray:
        state: MADRound = prior or {"center": None, "done": 0, "targets": None}
        if state["center"] is not None:
            with np.errstate(invalid="ignore"):     # inf - inf: nan, as numpy gives
                v = np.abs(v - state["center"])
        keys = order_keys(v)
        prefixes = sorted({p for p, _ in state["targets"]}) if state["targets"] else [0]
        return np.stack([digit_counts(keys, state["done"], p) for p in prefixes])

    def finish(self, counts: np.ndarray, prior: MADRound | None) -> MADRound | Any:
        """Between rounds: ``{"center": the median once found, "done": bits settled,
        "targets": [(prefix, rank left)] per middle rank}``; the MAD at the end."""
        state: MADRound = prior or {"center": None, "done": 0, "targets": None}
        targets = state["targets"]
        if targets is None:              # a phase starts: one histogram of every value
            targets = [(0, r) for r in _middle_ranks(int(counts[0].sum()))]
        prefixes = sorted({p for p, _ in targets})
        settled = []
        for p, rank in targets:
            cum = np.cumsum(counts[prefixes.index(p)])
            digit = int(np.searchsorted(cum, rank, side="right"))
            settled.append(((p << BITS) | digit, rank - (int(cum[digit - 1]) if digit else 0)))
        done = state["done"] + BITS
        if done < 8 * np.dtype(self.dtype).itemsize:
            return {"center": state["center"], "done": done, "targets": settled}
        middle = [key_value(p, self.dtype) for p, _ in settled]
        median = middle[0] if len(middle) == 1 else np.mean(np.array(middle, self.dtype))
        if state["center"] is None:       # the median found: now the deviations' median
            return {"center": median, "done": 0, "targets": None}
        return median
