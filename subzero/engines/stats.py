"""Per-operator statistics of a run, as the engines report them to the catalog."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def as_dict(self) -> dict:
        return {"name": self.name, "class": self.cls, "inputs": self.inputs,
                "strategies": self.strategies, "shape": list(self.shape), "run_s": self.run_s,
                "lwrite_s": self.lwrite_s, "lineage_s": self.lineage_s, "pairs": self.pairs,
                "lineage_bytes": self.lineage_bytes, "per_strategy": self.per_strategy}
