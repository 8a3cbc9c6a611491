"""Which engine a run uses when none is asked for.

Spark pays for itself only past a size: a SparkSession takes seconds to start
and every job costs a fraction of a second of scheduling, while the in-process
engine streams tile by tile with no start-up at all.  So a run without
``--engine`` goes to Spark when a master is configured (the user has a
cluster) or when its largest input reaches :data:`subzero.tuning.SPARK_PAYS_CELLS`
(a provisional value, see its note), and runs in-process otherwise.
The choice and its reason are said in the run's first line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from subzero.tuning import SPARK_PAYS_CELLS

ENGINES = ("local", "spark")


@dataclass(frozen=True)
class Choice:
    engine: str          # "local" or "spark"
    reason: str          # why, in the user's terms
    fallback: bool = False   # Spark was wanted but Java is missing

    def line(self, master: str | None = None) -> str:
        """The run's first line: which engine, and why."""
        what = (f"Spark ({master or 'local[*]'})" if self.engine == "spark"
                else "the in-process engine")
        return f"engine: {what} - {self.reason}"


def choose_engine(requested: str | None, master: str | None, input_cells: Iterable[int],
                  java_version: Callable[[], int | None]) -> Choice:
    """The engine for a run: ``requested`` when given ("local", "spark"; "auto" or None
    choose), else Spark for a configured ``master`` or inputs of at least
    ``SPARK_PAYS_CELLS`` cells (the largest input counts), else in-process.  Spark
    chosen by size without Java 17+ falls back to in-process (``fallback``)."""
    if requested in ENGINES:
        return Choice(str(requested), "as asked (--engine)")
    if master:
        return Choice("spark", f"a Spark master is configured ({master})")
    biggest = max(input_cells, default=0)
    size, limit = _mpix(biggest), _mpix(SPARK_PAYS_CELLS)
    if biggest < SPARK_PAYS_CELLS:
        return Choice("local", f"the largest input ({size}) is under the {limit} at which Spark "
                               f"pays; --engine spark to use it anyway")
    v = java_version()
    if v is None or v < 17:
        return Choice("local", f"the largest input ({size}) is big enough for Spark, but Java 17+ "
                               f"was not found; install it for the Spark engine", fallback=True)
    return Choice("spark", f"the largest input ({size}) reaches the {limit} at which Spark pays; "
                           f"--engine local to run in-process")


def _mpix(cells: int) -> str:
    return f"{cells / 1e6:.1f} Mpix" if cells >= 100_000 else f"{cells:,} cells"
