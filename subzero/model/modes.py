"""The five lineage modes of the SubZero paper."""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    """How an operator's lineage is made available at query time.

    FULL      explicit region pairs written with ``ctx.lwrite(out, *ins)``
    MAP       mapping functions ``map_b``/``map_f``; nothing stored
    PAY       payload pairs ``ctx.lwrite(out, payload=...)`` + ``map_p``
    COMP      mapping functions by default, payload pairs override them
    BLACKBOX  nothing stored; the operator is re-run at query time
    """

    FULL = "full"
    MAP = "map"
    PAY = "pay"
    COMP = "comp"
    BLACKBOX = "blackbox"

    def __str__(self) -> str:
        return self.value
