"""Statistics of a run, as the engines report them to the catalog: plain data,
so that a run made inside a Spark task (an instance run) can send them back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from subzero.storage.inputs import is_region_source


@dataclass
class OpStats:
    name: str
    cls: str
    inputs: list[str]
    strategies: list[str]
    shape: tuple[int, ...]
    dtype: str = ""
    nbytes: int = 0
    run_s: float = 0.0          # operator wall time, lwrite calls included
    lwrite_s: float = 0.0       # time spent inside lwrite (buffering)
    lineage_s: float = 0.0      # validation, encoding and writing of lineage
    pairs: int = 0
    lineage_bytes: int = 0
    per_strategy: list[dict] = field(default_factory=list)
    tiles: int = 1              # tasks the engine ran the operator as
    #: the digest of its statistic's value, when the engine computed one over tiles
    statistic: str | None = None
    #: the digest of the file keeping its statistic's merged states, when kept
    rounds: str | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "class": self.cls, "inputs": self.inputs,
                "strategies": self.strategies, "shape": list(self.shape), "run_s": self.run_s,
                "lwrite_s": self.lwrite_s, "lineage_s": self.lineage_s, "pairs": self.pairs,
                "lineage_bytes": self.lineage_bytes, "per_strategy": self.per_strategy}


@dataclass(frozen=True)
class ArrayInfo:
    """An input array as the catalog records it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    @classmethod
    def of(cls, name: str, value: Any) -> ArrayInfo:
        if is_region_source(value):       # an input read region by region: never loaded here
            shape = tuple(int(n) for n in value.shape) or (1,)
            dtype = np.dtype(value.dtype)
            return cls(name, shape, str(dtype), int(np.prod(shape)) * dtype.itemsize)
        a = np.asarray(value)
        shape = tuple(int(n) for n in a.shape) or (1,)
        return cls(name, shape, str(a.dtype), int(a.nbytes))


@dataclass
class RunStats:
    """What one run did: its inputs, and every operator in the order it ran."""

    inputs: list[ArrayInfo] = field(default_factory=list)
    ops: list[OpStats] = field(default_factory=list)
    #: a re-run's parent and what it recomputed (:mod:`subzero.runs.rerun`); None otherwise
    rerun: dict[str, Any] | None = None
