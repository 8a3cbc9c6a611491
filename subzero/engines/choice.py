"""Engine names, resolved in one place: which engine a run uses, and its class.

The API (``Store.run(engine=...)``) and the CLI (``--engine``, ``--master``...)
both describe what the user asked as an :class:`EngineRequest` and get a
:class:`Choice` from :func:`choose_engine` (or :func:`resume_engine`); the
engine itself comes from :func:`make_engine`, its Spark session from
:func:`open_session`.  Nowhere else compares engine
names, as xarray resolves a backend's name in one function.

Spark pays for itself only past a size: a SparkSession takes seconds to start
and every job costs a fraction of a second of scheduling, while the in-process
engine streams tile by tile with no start-up at all.  So a run that does not
name its engine goes to Spark when any Spark setting is given (a master, Spark
configuration, a session, instances per manifest row) or when its largest
input reaches :data:`subzero.tuning.SPARK_PAYS_CELLS` (a provisional value, see
its note), and runs in-process otherwise.  The choice and its reason are said
in the run's first line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from subzero.errors import UsageError
from subzero.tuning import SPARK_PAYS_CELLS, SPARK_PAYS_RUNS

if TYPE_CHECKING:
    from subzero.engines.base import Engine
    from subzero.storage.arrays import ArrayStore

#: the engines, by the name the catalog records
ENGINES = ("local", "spark")
#: what may be asked for: an engine, or "auto" (choose)
REQUESTS = (*ENGINES, "auto")

JavaVersion = Callable[[], "int | None"]


@dataclass(frozen=True)
class EngineRequest:
    """Where the user asked a run to run: plain data, from the API's arguments or the
    CLI's flags (the CLI adds ``$SUBZERO_ENGINE`` as a default)."""

    engine: str | None = None            # "local", "spark", "auto"; None: auto
    master: str | None = None            # a Spark master URL
    conf: Mapping[str, str] = field(default_factory=dict)   # Spark configuration
    session: Any = None                  # a SparkSession the user made
    instances: bool = False              # one instance per manifest row, as Spark tasks

    def spark_settings(self) -> list[str]:
        """The Spark settings given, by parameter name."""
        return [n for n, v in (("master", self.master), ("conf", self.conf),
                               ("spark", self.session), ("manifest", self.instances)) if v]

    def check(self) -> None:
        """An unknown engine name, or Spark settings for the in-process engine."""
        if self.engine is not None and self.engine not in REQUESTS:
            raise UsageError(f"unknown engine {self.engine!r}; use `engine='local'`, "
                             f"`engine='spark'` or `engine='auto'`")
        given = self.spark_settings()
        if self.engine == "local" and given:
            names = " and ".join(f"`{n}`" for n in given)
            raise UsageError(f"{names} need{'s' if len(given) == 1 else ''} the Spark engine "
                             f"(`engine='spark'`), not `engine='local'`")


@dataclass(frozen=True)
class Choice:
    engine: str          # "local" or "spark"
    reason: str          # why, in the user's terms
    fallback: bool = False   # Spark was wanted but Java is missing
    asked: bool = False      # the user named the engine (nothing to announce)

    def line(self, master: str | None = None) -> str:
        """The run's first line: which engine, and why."""
        what = (f"Spark ({master or 'local[*]'})" if self.engine == "spark"
                else "the in-process engine")
        return f"engine: {what} - {self.reason}"


def choose_engine(request: EngineRequest | str | None, master: str | None = None,
                  input_cells: Iterable[int] = (), java_version: JavaVersion | None = None,
                  profiling: bool = False) -> Choice:
    """The engine for a new run: the one asked for (``engine`` "local" or "spark");
    else Spark when Spark settings are given; else Spark for inputs of at least
    ``SPARK_PAYS_CELLS`` cells (the largest input counts), else in-process.  Spark
    chosen by size without Java 17+ falls back to in-process (``fallback``); one
    instance per manifest row needs Java.  A ``profiling`` run (the optimizer's)
    runs in-process.  ``request`` may be just the engine's name (then ``master`` is
    the master)."""
    if not isinstance(request, EngineRequest):
        request = EngineRequest(request, master)
    request.check()
    java = java_version if java_version is not None else _java_version
    if profiling:
        if request.engine not in (None, "auto", "local"):
            raise UsageError("profiling runs use the local engine (`engine='local'`)")
        return Choice("local", "profiling runs in-process", asked=request.engine == "local")
    if request.engine in ENGINES:
        return Choice(str(request.engine), "as asked (`engine`)", asked=True)
    if request.master:
        return Choice("spark", f"a Spark master is configured ({request.master})")
    if request.session is not None:
        return Choice("spark", "your SparkSession was given")
    if request.instances:
        v = java()
        if v is None or v < 17:
            raise UsageError("instances per manifest row run as Spark tasks, which needs Java 17+: "
                             "install it (e.g. 'apt-get install openjdk-17-jre-headless')")
        return Choice("spark", "instances per manifest row run as Spark tasks")
    if request.conf:
        return Choice("spark", "Spark configuration (`conf`) is given")
    biggest = max(input_cells, default=0)
    size, limit = _mpix(biggest), _mpix(SPARK_PAYS_CELLS)
    if biggest < SPARK_PAYS_CELLS:
        return Choice("local", f"the largest input ({size}) is under the {limit} at which Spark "
                               f"pays; `engine='spark'` to use it anyway")
    v = java()
    if v is None or v < 17:
        return Choice("local", f"the largest input ({size}) is big enough for Spark, but Java 17+ "
                               f"was not found; install it for the Spark engine", fallback=True)
    return Choice("spark", f"the largest input ({size}) reaches the {limit} at which Spark pays; "
                           f"`engine='local'` to run in-process")


def impact_engine(request: EngineRequest | str | None, runs: int,
                  java_version: JavaVersion | None = None) -> Choice:
    """Where an impact query answers its ``runs`` runs: the engine asked for; else
    Spark when Spark settings are given, or for at least
    :data:`~subzero.tuning.SPARK_PAYS_RUNS` runs when Java 17+ is there; else in this
    process (a pool of its forks when there are runs for more than one)."""
    if not isinstance(request, EngineRequest):
        request = EngineRequest(request)
    request.check()
    if request.engine in ENGINES:
        return Choice(str(request.engine), "as asked (`engine`)", asked=True)
    given = request.spark_settings()
    if given:
        return Choice("spark", f"Spark settings are given ({', '.join(f'`{g}`' for g in given)})")
    if runs < SPARK_PAYS_RUNS:
        return Choice("local", f"{runs} runs are under the {SPARK_PAYS_RUNS} at which Spark pays; "
                               f"`engine='spark'` to use it anyway")
    v = (java_version or _java_version)()
    if v is None or v < 17:
        return Choice("local", f"{runs} runs are enough for Spark, but Java 17+ was not found; "
                               f"install it for the Spark engine", fallback=True)
    return Choice("spark", f"{runs} runs reach the {SPARK_PAYS_RUNS} at which Spark pays; "
                           f"`engine='local'` to answer them in-process")


def resume_engine(request: EngineRequest, recorded: str) -> Choice:
    """The engine that finishes an interrupted run: the one asked for, else Spark when
    Spark settings are given, else the one it began with (``recorded``)."""
    request.check()
    if request.engine in ENGINES:
        return Choice(str(request.engine), "as asked (`engine`)", asked=True)
    if request.spark_settings():
        return Choice("spark", "Spark settings are given")
    if recorded not in ENGINES:
        raise UsageError(f"the run was made by an engine this SubZero does not have "
                         f"({recorded!r}); give `engine='local'` or `engine='spark'`")
    return Choice(recorded, "the engine the run began with")


def make_engine(name: str, arrays: ArrayStore, *, spark: Any = None,
                log: Callable[[str], None] | None = None, lineage_dir: str | os.PathLike | None = None,
                profiling: bool = False) -> Engine:
    """The engine called ``name`` over one run's array store: the in-process engine
    (``profiling``: every operator whole, its values handed to the profiler), or the
    Spark engine on the session ``spark``, its tasks writing lineage shards into
    ``lineage_dir`` and telling ``log`` what its jobs do.  The run's uid travels with
    ``arrays`` (:attr:`ArrayStore.run_uid`): both engines bind what they write to it,
    the Spark engine's tasks get it as an argument."""
    if name == "spark":
        from subzero.engines.spark.engine import SparkEngine
        return SparkEngine(spark, arrays, log=log, lineage_dir=lineage_dir)
    if name == "local":
        from subzero.engines.local import LocalEngine
        return LocalEngine(arrays, profiling=profiling)
    raise UsageError(f"unknown engine {name!r}; use `engine='local'` or `engine='spark'`")


def open_session(choice: Choice, request: EngineRequest, store: str | os.PathLike) -> Any:
    """The SparkSession a run on Spark uses (the one given, else one made from the
    request's master and conf), with its workers checked against ``store``; None for
    the in-process engine.  Before the run is recorded: a cluster that cannot run it
    leaves no failed run behind."""
    if choice.engine != "spark":
        return None
    from subzero.engines.spark.session import check_workers, session
    spark = request.session if request.session is not None else session(request.master, request.conf)
    check_workers(spark, store)
    return spark


def _java_version() -> int | None:
    from subzero.engines.spark.session import java_version
    return java_version()


def _mpix(cells: int) -> str:
    return f"{cells / 1e6:.1f} Mpix" if cells >= 100_000 else f"{cells:,} cells"
