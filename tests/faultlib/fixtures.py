"""Fixture stores: small real runs of ``workflows/example.py`` on the LocalEngine.

Each fixture is a store whose run 1 is the run the cases trace; its strategies
make it write a different set of files: FullOne, FullMany (R-trees), PayOne, PayMany (payload
tables and R-trees), COMP (covered cells), MAP (nothing stored) and BLACKBOX
(re-execution from the stored arrays).  Arrays are stored in 32 x 32 tiles, so
each 64 x 96 array has six Zarr chunks and damage to one chunk hits part of it.

Every query is traced on the undamaged store with each method that can answer
it (``prefer`` = each stored strategy on its route, re-execution, or the default
order); all must agree with the re-execution-only answer, which becomes the
correct answer a damaged copy is judged against.

Beside run 1, each fixture store holds run 2, the same workflow and strategies on
another sky (:data:`OTHER_SKY`: the stars elsewhere, so a piece of run 2 read as
run 1's answers wrongly), a copy of its catalog taken before run 2 (an *older
catalog*), and a *twin* store of its own: another store whose run 1 is that same
workflow on :data:`OTHER_SKY` (same run id, same paths, another store).  The
placement, link and catalog cases of :mod:`.moves` take their pieces from them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from faultlib.damage import Target, list_targets

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "workflows" / "example.py")
TILE = 32
RUN_ID = 1
#: run 2 of every fixture store (and run 1 of its twin store)
OTHER_RUN_ID = 2


def other_sky() -> np.ndarray:
    """The other runs' sky: the example's sky with its stars moved (as tests/test_binding.py)."""
    from subzero.workflows.example import synthetic_sky
    return np.roll(synthetic_sky(), (5, -7), axis=(0, 1))

#: fixture name -> strategies of the example workflow's operators (calib and smooth
#: keep their mapping functions unless named).
SPECS: dict[str, dict[str, str]] = {
    "fullone": {"stars": "full:fullone:backward+full:fullone:forward",
                "clean": "comp:payone:backward", "smooth": "blackbox"},
    "fullmany": {"stars": "full:fullmany:backward+full:fullmany:forward",
                 "clean": "comp:paymany:backward+comp:paymany:forward"},
    "payone": {"stars": "pay:payone:backward+pay:payone:forward",
               "clean": "comp:payone:forward+full:fullone:backward"},
    "paymany": {"stars": "pay:paymany:backward+pay:paymany:forward",
                "clean": "full:fullmany:backward+full:fullmany:forward"},
    "blackbox": {"stars": "blackbox", "clean": "blackbox", "smooth": "blackbox",
                 "calib": "blackbox"},
}


#: fixtures written by another engine than the in-process one (only in the campaign:
#: ``benchmarks/faults.py --spark``): the Spark engine in local mode writes lineage
#: shards (``lineage/shards/<op>.../*.szs``) and its tasks write the arrays
SPARK_SPECS: dict[str, dict[str, str]] = {
    "spark": {"stars": "full:fullone:backward+full:fullone:forward",
              "clean": "comp:payone:backward"},
}
ENGINES: dict[str, dict] = {"spark": {"engine": "spark", "master": "local[2]"}}
SPECS.update(SPARK_SPECS)
#: the fixtures built unless named (the fast suite's): the in-process ones
DEFAULT_FIXTURES = [n for n in SPECS if n not in ENGINES]


@dataclass(frozen=True)
class Query:
    """One trace through the public API: ``run.trace(start, cells, to=, path=, prefer=)``."""

    name: str
    start: str
    cells: tuple[tuple[int, ...], ...]
    to: str | None = None
    path: tuple[tuple[str, int], ...] | None = None
    prefer: str | None = None

    @property
    def label(self) -> str:
        return f"{self.name}[{self.prefer or 'default'}]"

    def kwargs(self) -> dict:
        return {"to": self.to, "path": None if self.path is None else [tuple(p) for p in self.path],
                "prefer": self.prefer}

    def with_prefer(self, prefer: str | None) -> "Query":
        return Query(self.name, self.start, self.cells, self.to, self.path, prefer)


def _box(y0: int, y1: int, x0: int, x1: int) -> tuple[tuple[int, int], ...]:
    return tuple((y, x) for y in range(y0, y1) for x in range(x0, x1))


#: (query, operators on its route): star pixels, hot pixels covered by composite
#: payloads, plain pixels, the blurred image, forward from both inputs.
BASE: list[tuple[Query, tuple[str, ...]]] = [
    (Query("B-star", "stars", ((40, 70), (12, 20)), to="raw"), ("stars", "clean", "calib")),
    (Query("B-star-flat", "stars", _box(36, 44, 66, 74), to="flat"), ("stars", "clean", "calib")),
    (Query("B-hot", "clean", ((30, 40), (5, 5), (33, 10)), path=(("clean", 0),)), ("clean",)),
    (Query("B-plain", "clean", _box(0, 4, 50, 56), path=(("clean", 0),)), ("clean",)),
    (Query("B-smooth", "smooth", ((40, 70), (0, 0)), to="raw"), ("smooth", "calib")),
    (Query("F-raw", "raw", _box(38, 42, 68, 72), to="stars"), ("calib", "clean", "stars")),
    (Query("F-flat", "flat", ((5, 5), (50, 15)), to="stars"), ("calib", "clean", "stars")),
    (Query("F-hot", "calib", ((30, 40), (29, 40), (31, 41)), path=(("clean", 0),)), ("clean",)),
]
#: queries also traced by re-execution alone in every case (it reads the stored arrays)
REEXEC = ("B-star", "F-raw")


@dataclass(frozen=True)
class Answer:
    cells: np.ndarray
    values: np.ndarray | None


@dataclass
class Fixture:
    """A built fixture: its pristine store, the queries a case traces, their correct
    answers, and every file and LMDB value a case may damage."""

    name: str
    store: Path
    strategies: dict[str, str]
    queries: list[Query]
    answers: dict[str, Answer] = field(repr=False)
    targets: list[Target] = field(repr=False)
    run_id: int = RUN_ID
    #: another store whose run 1 is this workflow on the other sky (None: not built)
    twin: Path | None = None
    #: a copy of the store's catalog taken before run 2 (None: not built)
    old_catalog: Path | None = None


def queries_for(strategies: dict[str, str]) -> list[Query]:
    """Each base query with the default order, with each stored strategy of an operator
    on its route preferred, and (for a few) re-execution alone."""
    out = []
    for q, route in BASE:
        prefers: list[str | None] = [None]
        for op in route:
            prefers += [s for s in strategies.get(op, "").split("+")
                        if s and s not in ("map", "blackbox")]
        if q.name in REEXEC:
            prefers.append("reexec")
        out += [q.with_prefer(p) for p in dict.fromkeys(prefers)]
    return out


def answer_of(run, q: Query, values: bool = True) -> Answer:
    """The query's cells and (``values``) the target array's values at them; without
    values, ``Answer.values`` is None."""
    res = run.trace(q.start, [list(c) for c in q.cells], **q.kwargs())
    return Answer(np.asarray(res.cells), np.asarray(res.values) if values else None)


def same(a: Answer, b: Answer) -> bool:
    """Same cells, and same values where both have them."""
    if not (a.cells.shape == b.cells.shape and np.array_equal(a.cells, b.cells)):
        return False
    if a.values is None or b.values is None:
        return True
    return a.values.shape == b.values.shape and bool(np.array_equal(a.values, b.values,
                                                                     equal_nan=True))


def make_stores(root: str | Path, name: str) -> None:
    """The fixture's store (run 1, then run 2 on the other sky), the copy of its catalog
    taken between them, and its twin store, written by the fixture's engine."""
    import subzero
    root = Path(root)
    path, twin = root / name, root / f"{name}-twin"
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(twin, ignore_errors=True)
    strategies = SPECS[name]
    how = {"strategies": strategies, "tile": TILE, "progress": False, **ENGINES.get(name, {})}
    with warnings.catch_warnings():
        warnings.simplefilter("error", subzero.SubZeroWarning)   # a pristine store warns of nothing
        with subzero.open_store(path) as store:
            run = store.run(EXAMPLE, **how)
            assert run.id == RUN_ID, run.id
            run.close()
        _no_junk(path, name)
        shutil.copyfile(path / "catalog.sqlite", root / f"{name}.catalog-before-run-2.sqlite")
        with subzero.open_store(path) as store:
            other = store.run(EXAMPLE, inputs={"raw": other_sky()}, **how)
            assert other.id == OTHER_RUN_ID, other.id
            other.close()
        with subzero.open_store(twin) as store:
            other = store.run(EXAMPLE, inputs={"raw": other_sky()}, **how)
            assert other.id == RUN_ID, other.id
            other.close()
    _no_junk(path, name)


def build_fixture(root: Path, name: str) -> Fixture:
    """Write the fixture's stores (a fixture on another engine than the local one in a
    subprocess, so that no JVM lives in the process that forks the cases) and
    compute every answer of run 1."""
    import subzero
    if name in ENGINES:
        import subprocess
        import sys
        code = f"from faultlib.fixtures import make_stores; make_stores({str(root)!r}, {name!r})"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=900, env=env)
        if p.returncode != 0:
            raise AssertionError(f"fixture {name}: its runs failed (exit {p.returncode}):\n"
                                 f"{p.stderr[-3000:]}")
    else:
        make_stores(root, name)
    path = root / name
    strategies = SPECS[name]
    queries = queries_for(strategies)
    answers: dict[str, Answer] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", subzero.SubZeroWarning)   # a pristine store warns of nothing
        with subzero.open_store(path) as store:
            run = store.get(RUN_ID)
            truths: dict[str, Answer] = {}
            for q in queries:
                answers[q.label] = a = answer_of(run, q)
                truth = truths.get(q.name)
                if truth is None:
                    truth = truths[q.name] = answer_of(run, q.with_prefer("reexec"))
                if not same(a, truth):
                    raise AssertionError(f"fixture {name}: {q.label} gives {len(a.cells)} cells, "
                                         f"re-execution {len(truth.cells)}: the undamaged store "
                                         f"disagrees with itself")
                if not len(a.cells):
                    raise AssertionError(f"fixture {name}: {q.label} is empty: a useless query")
            run.close()
    _no_junk(path, name)
    from faultlib.moves import list_moves
    fx = Fixture(name, path, dict(strategies), queries, answers, list_targets(path),
                 twin=root / f"{name}-twin", old_catalog=root / f"{name}.catalog-before-run-2.sqlite")
    fx.targets += list_moves(fx)
    return fx


def _no_junk(path: Path, name: str) -> None:
    for junk in ("catalog.sqlite-wal", "catalog.sqlite-shm", "catalog.sqlite-journal"):
        if (path / junk).exists():
            raise AssertionError(f"fixture {name}: {junk} left behind by a closed store")


def scratch_dir(prefix: str = "subzero-faults-") -> Path:
    """A fresh folder for fixtures and case copies: in /dev/shm when it is there (a
    case copies a store of about a megabyte and traces it; on a disk the directory
    operations cost more than the traces), else the temp folder.  Remove it after."""
    shm = Path("/dev/shm")
    where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=where))


def build_fixtures(root: str | Path, names: list[str] | None = None) -> list[Fixture]:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    return [build_fixture(root, n) for n in (names or DEFAULT_FIXTURES)]
