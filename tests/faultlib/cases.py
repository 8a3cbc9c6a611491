"""Fault cases: draw one from (seed, number), run it in a forked child, classify it.

A case copies one fixture store, damages one target, opens the copy with
``subzero.open_store`` and traces every query of the fixture through
``Run.trace`` (default options, plus ``prefer`` to make each stored strategy and
re-execution answer).  Each query's outcome is ``exact``, ``clear error``,
``internal error`` or ``wrong``; the case's outcome is the worst of them, or
``crash`` / ``hang`` for the whole child.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from faultlib.damage import FILE_KINDS, VALUE_KINDS, Damage, Target, apply, draw_damage
from faultlib.fixtures import Answer, Fixture, Query, answer_of, same
from faultlib.forking import ChildOutcome, fork_map
from faultlib.moves import LINEAGE_MOVES, MOVE_KINDS, after_checks, draw_move, family

#: per-query outcomes, best first; a case takes the worst of its queries
QUERY_ORDER = ("exact", "clear error", "internal error", "wrong", "data lost")
#: the kinds whose bytes are damaged (the campaign of issue 11), and every kind, in
#: the order a case draws from
DAMAGE_KINDS = (*FILE_KINDS, *VALUE_KINDS)
ALL_KINDS = (*DAMAGE_KINDS, *MOVE_KINDS)
#: ``--family`` of benchmarks/faults.py -> the kinds drawn
FAMILIES = {"all": ALL_KINDS, "damage": DAMAGE_KINDS, "moves": MOVE_KINDS}


@dataclass(frozen=True)
class Case:
    seed: int
    number: int
    fixture: str
    target: Target
    damage: Damage
    queries: tuple[str, ...] = ()     # labels of the fixture's queries this case traces

    def describe(self) -> str:
        return (f"seed {self.seed} case {self.number}: fixture {self.fixture}, {self.target.kind} "
                f"{self.target.describe()}: {self.damage.describe()}")


@dataclass
class CaseResult:
    case: Case
    outcome: str
    query: str = ""                 # the query that gave the outcome
    detail: str = ""
    seconds: float = 0.0
    cpu: float = 0.0
    warnings: list[str] = field(default_factory=list)
    queries: dict[str, list[str]] = field(default_factory=dict)   # label -> [outcome, detail]
    log: str = ""
    kept: str = ""                  # the damaged copy, when asked to keep it

    @property
    def failed(self) -> bool:
        return self.outcome not in ("exact", "clear error")

    def describe(self) -> str:
        q = f" in {self.query}" if self.query else ""
        return f"{self.case.describe()} -> {self.outcome}{q}: {self.detail}"


# -- drawing ----------------------------------------------------------------------------------
def make_case(seed: int, number: int, fixtures: list[Fixture], kind: str | None = None,
              damage: str | None = None, kinds: tuple[str, ...] = ALL_KINDS) -> Case:
    """Case ``number`` of ``seed``: a fixture, a kind of target (uniform over the
    ``kinds`` the fixture has, so the catalog is hit as often as R-tree files), a
    target of that kind and a damage (or a move, :mod:`.moves`); ``kind``/``damage``
    force them."""
    rng = np.random.default_rng([seed, number])
    pool_fx = fixtures
    if kind is not None:       # a forced kind: among the fixtures that have it
        pool_fx = [f for f in fixtures if any(t.kind == kind for t in f.targets)] or fixtures
    fx = pool_fx[int(rng.integers(len(pool_fx)))]
    present = {t.kind for t in fx.targets}
    drawn = [k for k in kinds if k in present]
    pick = drawn[int(rng.integers(len(drawn)))]
    if kind is not None:
        pick = kind
    pool = [t for t in fx.targets if t.kind == pick]
    if not pool:
        raise ValueError(f"fixture {fx.name} has nothing of kind {pick!r}")
    t = pool[int(rng.integers(len(pool)))]
    if pick in MOVE_KINDS:
        d = draw_move(rng, fx, t, damage)
    else:
        d = draw_damage(rng, t.size, damage)
    return Case(seed, number, fx.name, t, d, pick_queries(rng, fx, t))


#: stored-strategy queries a case traces beside the default and re-execution ones
EXTRA_QUERIES = 3


def target_strategy(t: Target) -> str | None:
    """The stored strategy a target belongs to (an LMDB value's sub-database, an
    R-tree file's name ``<op>_<mode>_<encoding>_<direction>-<hash>.<space>``)."""
    if t.db is not None:
        return t.db.split("|", 1)[-1]
    if t.kind in ("rtree-dat", "rtree-idx"):
        parts = Path(t.path).name.split("-", 1)[0].split("_")
        return ":".join(parts[-3:]) if len(parts) >= 4 else None
    return None


def pick_queries(rng: np.random.Generator, fx: Fixture, t: Target) -> tuple[str, ...]:
    """Every query in the default order and by re-execution, every query preferring the
    damaged target's strategy, and a few other stored-strategy queries at random: a
    case costs a dozen traces, and every method meets every damage over many cases."""
    base = [q.label for q in fx.queries if q.prefer in (None, "reexec")]
    owned = target_strategy(t)
    mine = [q.label for q in fx.queries if owned is not None and q.prefer == owned]
    others = [q.label for q in fx.queries if q.label not in base and q.label not in mine]
    k = min(EXTRA_QUERIES, len(others))
    extra = [others[int(j)] for j in sorted(rng.choice(len(others), k, replace=False))] if k else []
    return tuple(q.label for q in fx.queries if q.label in {*base, *mine, *extra})


def make_cases(seed: int, count: int, fixtures: list[Fixture], start: int = 0,
               kinds: tuple[str, ...] = ALL_KINDS) -> list[Case]:
    return [make_case(seed, n, fixtures, kinds=kinds) for n in range(start, start + count)]


# -- running (in the child) -------------------------------------------------------------------
def classify_error(e: BaseException) -> tuple[str, str]:
    from subzero import SubZeroError
    msg = str(e)
    if isinstance(e, SubZeroError):
        if msg and "\n" not in msg.strip():
            return "clear error", f"{type(e).__name__}: {msg}"
        return "internal error", f"{type(e).__name__} that is not one line: {msg!r}"
    return "internal error", f"{type(e).__name__}: {msg}"


def compare(got: Answer, want: Answer) -> tuple[str, str]:
    if same(got, want):
        return "exact", ""
    if not (got.cells.shape == want.cells.shape and np.array_equal(got.cells, want.cells)):
        g = set(map(tuple, got.cells.tolist()))
        w = set(map(tuple, want.cells.tolist()))
        return "wrong", (f"{len(g)} cells instead of {len(w)} ({len(w - g)} missing, "
                         f"{len(g - w)} extra)")
    return "wrong", "the right cells with other values"


#: damage to these cannot change an array's values (stored lineage never feeds them),
#: so their cases compare cells only and skip reading the target arrays (the larger
#: part of a case's cost)
LINEAGE_KINDS = ("lmdb-data", "lmdb-lock", "rtree-dat", "rtree-idx", "lineage-shard")


def checks_values(t: Target) -> bool:
    return not (t.kind in LINEAGE_KINDS or t.kind in LINEAGE_MOVES or t.kind.startswith("lmdb:"))


def trace_all(store_dir: Path, fx: Fixture, queries: list[Query] | None = None,
              values: bool = True) -> dict:
    """Open the (damaged) store and trace every query; per-query outcomes and warnings.
    ``values``: also compare the target array's values at the result cells."""
    import subzero
    results: list[tuple[str, str, str]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = run = None
        try:
            store = subzero.open_store(store_dir, create=False)
            run = store.get(fx.run_id)
        except Exception as e:
            results.append(("open", *classify_error(e)))
        if run is not None:
            for q in queries or fx.queries:
                try:
                    outcome, detail = compare(answer_of(run, q, values), fx.answers[q.label])
                except Exception as e:
                    outcome, detail = classify_error(e)
                results.append((q.label, outcome, detail))
        if store is not None:
            try:
                store.close()
            except Exception as e:
                results.append(("close", *classify_error(e)))
        msgs = [f"{w.category.__name__}: {w.message}" for w in caught
                if issubclass(w.category, subzero.SubZeroWarning)]
    return {"queries": results, "warnings": msgs}


def case_dir(workdir: Path, case: Case) -> Path:
    """The folder of a case's damaged copy: named by its number and its kind (forced
    cases of several kinds share numbers, and may run at the same time)."""
    kind = case.target.kind.replace(":", "-")
    return workdir / f"case-{case.seed}-{case.number}-{kind}"


def _run_in_child(task: tuple[Case, Fixture, Path, bool]) -> dict:
    case, fx, workdir, keep = task
    dst = case_dir(workdir, case)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(fx.store, dst, copy_function=shutil.copyfile)
    apply(dst, case.target, case.damage, fx)
    by_label = {q.label: q for q in fx.queries}
    queries = [by_label[x] for x in case.queries] if case.queries else fx.queries
    out = trace_all(dst, fx, queries, values=checks_values(case.target))
    fam = family(case.target.kind)
    if fam != "damage":        # nothing lost by runs, clean and fsck; catalogs traced again
        out["queries"] += after_checks(dst, fx, queries, checks_values(case.target),
                                       retrace=fam == "catalog")
    if keep:
        out["kept"] = str(dst)
    else:
        shutil.rmtree(dst, ignore_errors=True)
    return out


def _result(case: Case, o: ChildOutcome, workdir: Path, keep: bool) -> CaseResult:
    if o.status != "ok":
        if not keep:
            shutil.rmtree(case_dir(workdir, case), ignore_errors=True)
        return CaseResult(case, o.status, "", o.detail, o.seconds, log=o.log)
    assert o.result is not None
    queries = {label: [outcome, detail] for label, outcome, detail in o.result["queries"]}
    worst = max(o.result["queries"], key=lambda r: QUERY_ORDER.index(r[1]))
    return CaseResult(case, worst[1], worst[0] if worst[1] != "exact" else "", worst[2], o.seconds,
                      o.cpu, o.result["warnings"], queries, kept=o.result.get("kept", ""))


def run_cases(cases: list[Case], fixtures: list[Fixture], workdir: str | Path, jobs: int = 2,
              timeout: float = 20.0, keep: bool = False,
              on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Run the cases in forked children, ``jobs`` at a time; results in case order."""
    workdir = Path(workdir)
    by_name = {f.name: f for f in fixtures}
    tasks = [(c, by_name[c.fixture], workdir, keep) for c in cases]
    done: dict[int, CaseResult] = {}

    def collect(task, o: ChildOutcome) -> None:
        r = _result(task[0], o, workdir, keep)
        done[id(task)] = r
        if on_result is not None:
            on_result(r)
    fork_map(tasks, _run_in_child, workdir, jobs=jobs, timeout=timeout, on_done=collect)
    return [done[id(t)] for t in tasks]


def run_one(case: Case, fixtures: list[Fixture], workdir: str | Path, timeout: float = 60.0,
            keep: bool = False) -> CaseResult:
    """One case (forked, so a crash is reported rather than suffered)."""
    return run_cases([case], fixtures, workdir, jobs=1, timeout=timeout, keep=keep)[0]
