"""Workflows: a DAG of operator instances, defined in a plain Python module.

Every node is an array named by the node: workflow inputs (bound at run
time) and operator outputs.  Edge (P -> P', i) makes P's output the i-th
input of P'.  A module defines ``workflow(**params) -> Workflow``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from subzero.errors import StrategyError, WorkflowError
from subzero.model.exits import described, ends_process
from subzero.model.operator import Operator, lineage_reproducible, rerun_mode
from subzero.model.strategy import Strategy, reexecuted

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Node:
    """Handle of an array in a workflow; pass it to ``wf.add`` as an input."""

    name: str
    workflow: str

    def __str__(self) -> str:
        return self.name


@dataclass
class Step:
    name: str
    operator: Operator
    inputs: tuple[str, ...]


@dataclass
class InputDecl:
    name: str
    default: Any = None


@dataclass(frozen=True)
class KeptInput:
    """An input's array default, as a run's ``workflow.pkl`` keeps it: by its content
    digest, not its values (the run stores its inputs once, checksummed).  ``used``:
    whether the run's input was this default (else the run was given another)."""

    name: str
    digest: str
    shape: tuple[int, ...]
    dtype: str
    used: bool
    run: int | None = None

    def __repr__(self) -> str:
        return f"KeptInput({self.name!r}, {self.digest[:20]})"


class Workflow:
    """A DAG of operators.  Build it with :meth:`input` and :meth:`add`."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise WorkflowError("a workflow needs a non-empty name")
        self.name = name
        self.inputs: dict[str, InputDecl] = {}
        self.steps: dict[str, Step] = {}
        self.base_dir: Path | None = _caller_dir()
        self.source: str | None = None       # module path or name it was loaded from
        self.params: dict[str, Any] = {}

    # -- building ---------------------------------------------------------------
    def _check_new(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise WorkflowError(f"workflow {self.name!r}: invalid array name {name!r} "
                                f"(use letters, digits, _ . -)")
        if name in self.inputs or name in self.steps:
            raise WorkflowError(f"workflow {self.name!r}: duplicate name {name!r}")

    def input(self, name: str, default: Any = None) -> Node:
        """Declare a workflow input; ``default`` may be an array or a path
        (relative paths are resolved against the workflow module's folder)."""
        self._check_new(name)
        self.inputs[name] = InputDecl(name, default)
        return Node(name, self.name)

    def add(self, name: str, operator: Operator, *inputs: Node | str) -> Node:
        """Add an operator whose output array is called ``name``.

        Inputs are Nodes or array names; a name may refer to a step added
        later (checked, with cycles, by :meth:`validate`)."""
        self._check_new(name)
        if not isinstance(operator, Operator):
            raise WorkflowError(f"workflow {self.name!r}: step {name!r} needs an Operator instance, "
                                f"got {type(operator).__name__}")
        names = []
        for x in inputs:
            n = x.name if isinstance(x, Node) else x
            if not isinstance(n, str):
                raise WorkflowError(f"workflow {self.name!r}: step {name!r} input must be a Node "
                                    f"or an array name, got {type(x).__name__}")
            names.append(n)  # names may refer to later steps; validate() checks them
        want = operator.n_inputs()
        if want is not None and want != len(names):
            raise WorkflowError(f"workflow {self.name!r}: operator {name!r} "
                                f"({type(operator).__name__}) takes {want} inputs, got {len(names)}")
        self.steps[name] = Step(name, operator, tuple(names))
        return Node(name, self.name)

    # -- structure ----------------------------------------------------------------
    def arrays(self) -> list[str]:
        return list(self.inputs) + list(self.steps)

    def order(self) -> list[str]:
        """Operator names in a topological order; raises on a cycle."""
        indeg = {s: 0 for s in self.steps}
        users: dict[str, list[str]] = {a: [] for a in self.arrays()}
        for s in self.steps.values():
            for i in s.inputs:
                if i not in users:
                    raise WorkflowError(f"workflow {self.name!r}: step {s.name!r} uses unknown input {i!r}")
                users[i].append(s.name)
                if i in self.steps:
                    indeg[s.name] += 1
        ready = [s for s in self.steps if indeg[s] == 0]
        out = []
        while ready:
            n = ready.pop(0)
            out.append(n)
            for u in users[n]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    ready.append(u)
        if len(out) != len(self.steps):
            cyc = [s for s in self.steps if indeg[s] > 0]
            raise WorkflowError(f"workflow {self.name!r} has a cycle through {', '.join(sorted(cyc))}")
        return out

    def consumers(self, array: str) -> list[tuple[str, int]]:
        """(operator, input index) pairs that read ``array``."""
        return [(s.name, i) for s in self.steps.values() for i, a in enumerate(s.inputs) if a == array]

    def validate(self) -> None:
        self.order()
        if not self.steps:
            raise WorkflowError(f"workflow {self.name!r} has no operators")

    def resolve_default(self, name: str) -> Any:
        d = self.inputs[name].default
        if isinstance(d, KeptInput):      # a workflow loaded from a run's workflow.pkl
            run = f"run {d.run}" if d.run is not None else "the run"
            where = (f"it is the input {run} stored: `inputs={{{name!r}: run.array({name!r})}}`"
                     if d.used else f"{run} was given another input in its place")
            raise WorkflowError(f"workflow {self.name!r}, loaded from {run}, keeps its default "
                                f"for input {name!r} by content only ({d.digest}); give the "
                                f"input: {where}, or load the workflow from its module")
        if isinstance(d, (str, os.PathLike)) and self.base_dir is not None:
            p = Path(d)
            if not p.is_absolute():
                return self.base_dir / p
        return d

    def fingerprint(self) -> str:
        """Hash of the structure (names, operator classes, edges)."""
        h = hashlib.sha256(self.name.encode())
        for s in self.steps.values():
            h.update(f"{s.name}:{type(s.operator).__qualname__}:{','.join(s.inputs)};".encode())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, inputs={list(self.inputs)}, steps={list(self.steps)})"


def check_reexecution(wf: Workflow, strategies: Mapping[str, tuple[Strategy, ...]]) -> None:
    """Refuse, before anything runs, an operator declared not deterministic whose
    strategies leave its traces to re-execution alone (blackbox, for an operator with
    lineage a re-run would have to regenerate): every such trace would fail later.
    Operators with no lwrite lineage are never re-run (mapping functions or all-to-all
    answer), so any of them may be non-deterministic."""
    for name, step in wf.steps.items():
        op = step.operator
        mode = rerun_mode(op)
        strat = strategies.get(name, ())
        if lineage_reproducible(op) or mode is None or not reexecuted(strat):
            continue
        if step.inputs and all(op.is_all_to_all(i) for i in range(len(step.inputs))):
            continue
        what = "not deterministic" if not op.deterministic else \
            "not deterministic in its lineage (`deterministic_lineage = False`)"
        raise StrategyError(
            f"operator {name!r} ({type(op).__name__}) is declared {what}, so its "
            f"lineage cannot be recomputed by re-running it, but strategy "
            f"{'+'.join(str(s) for s in strat) or 'blackbox'} stores none; store it instead "
            f"(e.g. `strategies={{{name!r}: {mode.value!r}}}`)")


def _caller_dir() -> Path | None:
    """Folder of the module that constructs the Workflow (for relative defaults)."""
    frame = inspect.currentframe()
    try:
        f = frame.f_back.f_back if frame and frame.f_back else None
        fn = f.f_globals.get("__file__") if f else None
        return Path(fn).resolve().parent if fn else None
    finally:
        del frame


def _module_from_path(path: Path) -> ModuleType:
    name = "subzero_wf_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise WorkflowError(f"cannot load workflow file {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise WorkflowError(f"workflow file {path} has a syntax error at line {e.lineno}: {e.msg}") from e
    except Exception as e:
        sys.modules.pop(name, None)
        raise WorkflowError(f"workflow file {path} failed to import: {type(e).__name__}: {e}") from e
    except (SystemExit, KeyboardInterrupt) as e:
        sys.modules.pop(name, None)
        if not ends_process(e):
            raise                                  # a real Ctrl-C
        raise WorkflowError(f"workflow file {path} {described(e)} while it was imported; a "
                            f"workflow module defines workflow() and must not end the "
                            f"process") from e
    return mod


def load_workflow(ref: str | os.PathLike | Workflow, params: dict[str, Any] | None = None) -> Workflow:
    """Load a workflow from a ``.py`` path or an importable module name.

    The module must define ``workflow()``; ``params`` are passed to it as
    keyword arguments.
    """
    if isinstance(ref, Workflow):
        ref.validate()
        return ref
    params = dict(params or {})
    ref_s = os.fspath(ref)
    path = Path(ref_s)
    if ref_s.endswith(".py") or os.sep in ref_s or path.exists():
        if not path.is_file():
            raise WorkflowError(f"workflow file not found: {ref_s}")
        mod = _module_from_path(path.resolve())
        source = str(path.resolve())
    else:
        try:
            mod = importlib.import_module(ref_s)
        except ModuleNotFoundError as e:
            raise WorkflowError(f"workflow {ref_s!r} is neither a file nor an importable module "
                                f"({e.msg})") from e
        except SyntaxError as e:
            raise WorkflowError(f"workflow module {ref_s!r} has a syntax error at line {e.lineno}: "
                                f"{e.msg}") from e
        except Exception as e:
            raise WorkflowError(f"workflow module {ref_s!r} failed to import: "
                                f"{type(e).__name__}: {e}") from e
        except (SystemExit, KeyboardInterrupt) as e:
            if not ends_process(e):
                raise
            raise WorkflowError(f"workflow module {ref_s!r} {described(e)} while it was imported; "
                                f"a workflow module defines workflow() and must not end the "
                                f"process") from e
        source = ref_s
    fn = getattr(mod, "workflow", None)
    if not callable(fn):
        raise WorkflowError(f"workflow module {ref_s!r} does not define workflow()")
    try:
        wf = fn(**params)
    except TypeError as e:
        raise WorkflowError(f"workflow() of {ref_s!r} rejected the parameters {params}: {e}") from e
    except WorkflowError:
        raise
    except Exception as e:
        raise WorkflowError(f"workflow() of {ref_s!r} raised {type(e).__name__}: {e}") from e
    except (SystemExit, KeyboardInterrupt) as e:
        if not ends_process(e):
            raise
        raise WorkflowError(f"workflow() of {ref_s!r} {described(e)}; it must return a "
                            f"Workflow") from e
    if not isinstance(wf, Workflow):
        raise WorkflowError(f"workflow() of {ref_s!r} returned {type(wf).__name__}, not a Workflow")
    file: str | None = getattr(mod, "__file__", None)     # a namespace package has none
    if wf.base_dir is None and file:
        wf.base_dir = Path(file).resolve().parent
    wf.source = source
    wf.params = params
    wf.validate()
    return wf
