"""The Spark engine, one module per side of the process boundary.

* :mod:`~subzero.engines.spark.engine` — :class:`SparkEngine`, the driver's
  plan per operator (tile tasks, fused stages, aggregations, components);
* :mod:`~subzero.engines.spark.tasks` — what a task runs on an executor;
* :mod:`~subzero.engines.spark.jobs` — running a job from the driver: Ctrl-C,
  progress, and errors; :mod:`~subzero.engines.spark.failures` — a task's
  failure as a typed record;
* :mod:`~subzero.engines.spark.stages` — fusing tile operators into one job;
* :mod:`~subzero.engines.spark.session` — the SparkSession: Java, the master,
  the workers, the JVM's logs; :mod:`~subzero.engines.spark.standalone` — a
  standalone cluster on this machine (tests, benchmarks, trying it out);
* :mod:`~subzero.engines.spark.instances` — one workflow instance per Spark
  task (a night of exposures).

Nothing here imports pyspark at module level, and this package's face imports
nothing at all until :class:`SparkEngine` is asked for: checking Java or a
master (:mod:`~subzero.engines.spark.session`) stays cheap.
"""

from typing import Any

__all__ = ["SparkEngine"]


def __getattr__(name: str) -> Any:
    if name == "SparkEngine":
        from subzero.engines.spark.engine import SparkEngine
        return SparkEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
