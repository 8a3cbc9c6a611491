"""A run's lineage disk budget, and disk sizes in the user's terms ("500KB", "20MB",
"1.5GB"; decimal, as disks and ``du --si`` count them)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from subzero.errors import BudgetError
from subzero.model.strategy import Strategy


@dataclass
class DiskBudget:
    """A run's disk budget (``--max-disk``): its arrays and its lineage together.

    ``arrays_reserve`` of ``max_bytes`` is set aside for the arrays the run must keep
    (its outputs, as the plan predicted them); lineage gets the rest, enforced while
    it is written, and once the last operator ran the arrays kept and the lineage
    must fit ``max_bytes`` together (:func:`subzero.runs.keep.fit`).

    Operators are written in workflow order.  A strategy that would take the
    total over ``max_bytes`` is not kept: the operator is downgraded to its
    other strategies, else to mapping functions or black-box re-execution, and
    the event is kept in ``downgrades`` (the catalog records it).  Lineage
    already written is never dropped, so earlier operators keep what they got.
    ``predicted`` maps (operator, strategy) to the plan's predicted bytes, so
    an overflow is usually seen before anything is encoded.
    """

    max_bytes: int
    predicted: dict[tuple[str, str], int] = field(default_factory=dict)
    used: int = 0
    downgrades: list[dict] = field(default_factory=list)
    arrays_reserve: int = 0
    #: the intermediate arrays the plan chose not to keep (``--keep auto`` drops them;
    #: None: a plan that did not choose, the policy decides)
    drops: tuple[str, ...] | None = None
    #: the arrays the plan kept, those its workload would miss least per byte first: what
    #: a run over its budget at its end drops first (:func:`subzero.runs.keep.fit`)
    spare: tuple[str, ...] = ()

    @property
    def lineage_allowance(self) -> int:
        """What lineage may take: the budget less what is set aside for arrays."""
        return max(self.max_bytes - self.arrays_reserve, 0)

    def fits(self, nbytes: int) -> bool:
        return self.used + int(nbytes) <= self.lineage_allowance

    def downgrade(self, op: str, s: Strategy, predicted: int | None, needed: int | None) -> None:
        left = self.lineage_allowance - self.used
        size = needed if needed is not None else predicted
        self.downgrades.append({
            "op": op, "strategy": str(s), "predicted_bytes": predicted, "needed_bytes": needed,
            "reason": f"operator {op!r}: {s} needs {size} bytes but only {left} of the "
                      f"{self.max_bytes}-byte disk budget are left"
                      + (f" ({self.arrays_reserve} are set aside for its arrays)"
                         if self.arrays_reserve else "") + "; not stored"})


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: object) -> int:
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
