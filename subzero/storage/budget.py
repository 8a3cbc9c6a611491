"""A run's lineage disk budget."""

from __future__ import annotations

from dataclasses import dataclass, field

from subzero.model.strategy import Strategy


@dataclass
class DiskBudget:
    """A run's lineage disk budget, enforced while lineage is written.

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

    def fits(self, nbytes: int) -> bool:
        return self.used + int(nbytes) <= self.max_bytes

    def downgrade(self, op: str, s: Strategy, predicted: int | None, needed: int | None) -> None:
        left = self.max_bytes - self.used
        size = needed if needed is not None else predicted
        self.downgrades.append({
            "op": op, "strategy": str(s), "predicted_bytes": predicted, "needed_bytes": needed,
            "reason": f"operator {op!r}: {s} needs {size} bytes but only {left} of the "
                      f"{self.max_bytes}-byte disk budget are left; not stored"})
