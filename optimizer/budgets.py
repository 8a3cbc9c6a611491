"""Budgets in the user's terms: disk sizes ("500KB", "20MB", "1.5GB") and
runtime factors ("1.5" = a run with lineage may take 1.5x the no-lineage run).

Sizes are decimal (1 MB = 10**6 bytes), as disks and ``du --si`` count them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from subzero.errors import BudgetError, OptimizerError

__all__ = ["BudgetError", "Budgets", "OptimizerError", "fmt_size", "parse_factor", "parse_size"]


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text) -> int:
    """Bytes of a size such as ``500KB``, ``20MB``, ``1.5GB`` or ``1000`` (bytes)."""
    if isinstance(text, bool):
        raise BudgetError(f"invalid disk budget {text!r}; write a size such as 500KB, 20MB or 1.5GB")
    if isinstance(text, (int, float)):
        if not math.isfinite(text) or text < 0:
            raise BudgetError(f"invalid disk budget {text!r}; it must be a size of 0 or more")
        return int(text)
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise BudgetError(f"invalid disk budget {text!r}; write a size such as 500KB, 20MB or "
                          f"1.5GB (units B, KB, MB, GB, TB; KiB, MiB, GiB)")
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value):
        raise BudgetError(f"invalid disk budget {text!r}; it must be a size of 0 or more, "
                          f"such as 500KB, 20MB or 1.5GB")
    return int(round(value))


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
