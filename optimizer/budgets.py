"""Budgets in the user's terms: disk sizes ("500KB", "20MB", "1.5GB") and
runtime factors ("1.5" = a run with lineage may take 1.5x the no-lineage run).

Sizes are decimal (1 MB = 10**6 bytes), as disks and ``du --si`` count them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from subzero.errors import BudgetError, OptimizerError
from subzero.storage.budget import parse_size

__all__ = ["BudgetError", "Budgets", "OptimizerError", "fmt_size", "parse_factor", "parse_size"]


def parse_factor(text) -> float:
    """A runtime budget: the allowed (run with lineage) / (run without) ratio, >= 1."""
    raw = text
    if isinstance(text, str):
        text = text.strip().lower().removesuffix("x")
    try:
        f = float(text)
    except (TypeError, ValueError) as err:
        raise BudgetError(f"invalid runtime budget {raw!r}; give a factor such as 1.5 (the run "
                          f"with lineage may take 1.5x the run without)") from err
    if not math.isfinite(f) or f < 1:
        raise BudgetError(f"invalid runtime budget {raw!r}: a run with lineage cannot be faster "
                          f"than one without; give a factor of at least 1, e.g. 1.5")
    return f


def fmt_size(n: float | None) -> str:
    if n is None:
        return "unbounded"
    n = float(n)
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class Budgets:
    """MaxDISK in bytes and MaxRUNTIME as a factor (None = unbounded)."""

    max_disk: int | None = None
    max_runtime: float | None = None

    @classmethod
    def parse(cls, max_disk=None, max_runtime=None) -> "Budgets":
        return cls(None if max_disk is None else parse_size(max_disk),
                   None if max_runtime is None else parse_factor(max_runtime))

    def runtime_seconds(self, base_s: float) -> float | None:
        """The runtime budget as seconds of lineage overhead on top of ``base_s``."""
        return None if self.max_runtime is None else (self.max_runtime - 1.0) * base_s

    def describe(self) -> str:
        rt = "unbounded" if self.max_runtime is None else f"{self.max_runtime:g}x"
        return f"disk {fmt_size(self.max_disk)}, runtime {rt}"
