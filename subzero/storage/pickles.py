"""A run's operators, kept as ``workflow.pkl`` so traces can re-run them later,
even from another process.

Operators defined in workflow files loaded by path live in made-up modules
(``subzero_wf_*``) that another process cannot import, so those modules are
pickled by value.  Runs written before SubZero had one import namespace name
their classes ``subzero.cells``, ``operators.elementwise`` and so on; reading
maps those names to where the classes live now.

A pickle is code: :func:`load_workflow_pickle` is called only for runs whose
signature verifies (``storage.trust``).  :func:`pickle_code` tells a user what a
pickle would import and define by reading its opcodes, without loading it.
"""

from __future__ import annotations

import copy
import importlib
import pickletools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np

from subzero.model.labelled import is_dataarray
from subzero.model.workflow import InputDecl, KeptInput, Workflow
from subzero.storage import constants
from subzero.storage.inputs import input_digest

FILE = "workflow.pkl"

#: modules of the core that moved into subpackages (old name -> new name); the
#: top-level packages operators, optimizer and workflows moved under ``subzero.``
_RENAMED = {
    "subzero.modes": "subzero.model.modes", "subzero.strategy": "subzero.model.strategy",
    "subzero.cells": "subzero.model.cells", "subzero.operator": "subzero.model.operator",
    "subzero.workflow": "subzero.model.workflow", "subzero.context": "subzero.capture.context",
    "subzero.capture": "subzero.capture.buffer", "subzero.tiles": "subzero.capture.tiles",
    "subzero.codec": "subzero.storage.codec", "subzero.encodings": "subzero.storage.encodings",
    "subzero.lineagestore": "subzero.storage.lineage", "subzero.arraystore": "subzero.storage.arrays",
    "subzero.catalog": "subzero.storage.catalog", "subzero.inputs": "subzero.storage.inputs",
    "subzero.engine": "subzero.engines.local", "subzero.spark_engine": "subzero.engines.spark",
    "subzero.spark": "subzero.engines.spark.session",
    "subzero.instances": "subzero.engines.spark.instances",
    # the Spark engine's modules moved into its package, run orchestration into subzero.runs
    "subzero.engines.session": "subzero.engines.spark.session",
    "subzero.engines.stages": "subzero.engines.spark.stages",
    "subzero.engines.standalone": "subzero.engines.spark.standalone",
    "subzero.engines.instances": "subzero.engines.spark.instances",
    "subzero.engines.transaction": "subzero.runs.transaction",
    "subzero.engines.journal": "subzero.runs.journal",
    "subzero.executor": "subzero.query.executor", "subzero.relation": "subzero.query.relation",
    "subzero.reexec": "subzero.query.reexec", "subzero.workload": "subzero.query.workload",
}


def current_module(name: str) -> str:
    """Where a module of an older layout lives now (``name`` itself if it did not move)."""
    if name in _RENAMED:
        return _RENAMED[name]
    head, _, tail = name.partition(".")
    if head in ("operators", "optimizer", "workflows"):
        return f"subzero.{name}"
    return name


#: a module that became a package: its names now live in these of its modules
_SPLIT = {"subzero.engines.spark": ("subzero.engines.spark.engine", "subzero.engines.spark.tasks",
                                    "subzero.engines.spark.jobs")}


def current_place(module: str, name: str) -> str:
    """The module that defines ``name`` of an older layout's ``module`` now."""
    module = current_module(module)
    for part in _SPLIT.get(module, ()):
        mod = importlib.import_module(part)
        if hasattr(mod, name) or hasattr(mod, name.lstrip("_")):
            return part
    return module


def _place(module: str, name: str) -> tuple[str, str]:
    """Where a global a pickle names (of an older layout, perhaps) lives now."""
    place = current_place(module, name)
    if place != current_module(module) and not hasattr(importlib.import_module(place), name):
        name = name.lstrip("_")         # the task functions became public in the split
    return place, name


def slim(wf: Workflow, digests: Mapping[str, str | None], run: int | None = None) -> Workflow:
    """``wf`` as its pickle holds it: each input's array default replaced by a
    :class:`~subzero.model.workflow.KeptInput` naming its content (the run stores the
    input itself); ``digests``: the run's inputs' content digests."""
    kept = {}
    for name, decl in wf.inputs.items():
        d = decl.default
        if isinstance(d, np.ndarray) or is_dataarray(d):
            digest = input_digest(d, name)
            shape = tuple(int(n) for n in np.shape(d))
            d = KeptInput(name, digest, shape, str(np.dtype(d.dtype)), digests.get(name) == digest,
                          run)
        kept[name] = InputDecl(name, d)
    out = copy.copy(wf)
    out.inputs = kept
    return out


def save_workflow(wf: Workflow, run_dir: Path, digests: Mapping[str, str | None] | None = None,
                  run: int | None = None) -> bool:
    """Write ``workflow.pkl``: the operators' code and small parameters, never large
    arrays (see :mod:`.constants`: input defaults are kept by content, other large
    arrays rebuilt from the workflow module; a workflow built in Python, which has no
    module, keeps them).  False when the operators cannot be pickled (traces then
    reload the workflow from its source file)."""
    mods = [m for n, m in list(sys.modules.items()) if n.startswith("subzero_wf_")]
    registered = []
    for m in mods:
        try:
            cloudpickle.register_pickle_by_value(m)
            registered.append(m)
        except Exception:
            pass
    try:
        small = slim(wf, digests or {}, run)
        data, found = constants.dumps(small)
        if found and wf.source is None:
            data = cloudpickle.dumps(small)
        (Path(run_dir) / FILE).write_bytes(data)
        return True
    except Exception:
        return False
    finally:
        for m in registered:
            try:
                cloudpickle.unregister_pickle_by_value(m)
            except Exception:
                pass


def built_constants(wf: Workflow) -> dict[str, np.ndarray]:
    """The large arrays a freshly built ``wf`` holds, by digest, pickled as
    :func:`save_workflow` pickles it (its module by value): what a pickle's constants
    are looked up in."""
    mods = [m for n, m in list(sys.modules.items()) if n.startswith("subzero_wf_")]
    for m in mods:
        cloudpickle.register_pickle_by_value(m)
    try:
        return constants.built(slim(wf, {}))
    finally:
        for m in mods:
            cloudpickle.unregister_pickle_by_value(m)


def load_workflow_pickle(data: bytes, rebuild: Callable[[], Mapping[str, np.ndarray]] | None = None,
                         where: str = "the run") -> Any:
    """The workflow of a ``workflow.pkl`` (cloudpickle's format is pickle's; what it
    unpickles is whatever was pickled, so its type is the caller's to check).  Its
    constants (:mod:`.constants`) come from ``rebuild()``, asked for only if it has any;
    ``where`` names the run in the error when they differ."""
    return constants.Unpickler(data, rebuild, where, _place).load()


# -- what a pickle would run, read without running it -------------------------------------------
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
            "SHORT_BINSTRING"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_SILENT = {"PROTO", "FRAME", "MARK", "STOP", "POP", "POP_MARK"}
_HELPERS = ("subimport", "dynamic_subimport", "_make_skeleton_class")
_CLOUDPICKLE = ("cloudpickle.cloudpickle", "cloudpickle.cloudpickle_fast", "cloudpickle",
                "pyspark.cloudpickle.cloudpickle")


@dataclass(frozen=True)
class Global:
    module: str
    name: str


@dataclass
class PickleCode:
    """What unpickling would import and define: the globals it looks up (classes and
    functions by module), modules cloudpickle imports by name, and the functions and
    classes whose code travels inside the pickle (defined in a workflow file)."""

    globals: list[Global] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    unreadable: str = ""              # why the opcodes could not all be read, if so
    constants: int = 0                # arrays left out, rebuilt by running the module (.constants)

    def modules(self) -> dict[str, list[str]]:
        """Names looked up per module (``current_module`` spelling), sorted."""
        out: dict[str, set[str]] = {}
        for g in self.globals:
            out.setdefault(current_module(g.module), set()).add(g.name)
        for m in self.imports:
            out.setdefault(m, set())
        return {m: sorted(out[m]) for m in sorted(out)}


def pickle_code(data: bytes) -> PickleCode:
    """Read a pickle's opcodes (``pickletools.genops``; nothing is unpickled) for the
    code it refers to.  The pickle stack is followed only as far as naming needs:
    strings, the memo, and GLOBAL / STACK_GLOBAL / INST lookups."""
    code = PickleCode()
    ops: list[tuple[str, Any]]
    try:
        ops = [(op.name, arg) for op, arg, _pos in pickletools.genops(data)]
    except Exception as e:       # truncated or malformed: list what could be read
        code.unreadable = f"{type(e).__name__}: {e}"
        ops = []
        try:
            for op, arg, _pos in pickletools.genops(data):
                ops.append((op.name, arg))
        except Exception:
            pass
    # the two names each STACK_GLOBAL consumes are not arguments of anything else
    consumed: set[int] = set()
    for g, (name, _) in enumerate(ops):
        if name == "STACK_GLOBAL":
            j, need = g - 1, 2
            while j >= 0 and need:
                if ops[j][0] not in _PUTS and ops[j][0] != "MEMOIZE":
                    consumed.add(j)
                    need -= 1
                j -= 1
    seen: set[Global] = set()
    stack: list[object] = []          # strings, Globals, or None for anything else
    memo: dict[int, object] = {}
    helper: Global | None = None      # the cloudpickle helper whose arguments come next

    def found(g: Global) -> Global:
        if g not in seen:
            seen.add(g)
            code.globals.append(g)
        return g

    code.constants = sum(1 for name, _ in ops if name in ("BINPERSID", "PERSID"))
    for k, (name, arg) in enumerate(ops):
        if name in _STRINGS:
            stack.append(arg)
        elif name in _GETS:
            stack.append(memo.get(arg))
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else None
            continue
        elif name in _PUTS:
            memo[arg] = stack[-1] if stack else None
            continue
        elif name in ("GLOBAL", "INST"):
            mod, _, attr = str(arg).partition(" ")
            stack.append(found(Global(mod, attr)))
        elif name == "STACK_GLOBAL":
            attr_o = stack.pop() if stack else None
            mod_o = stack.pop() if stack else None
            if isinstance(mod_o, str) and isinstance(attr_o, str):
                stack.append(found(Global(mod_o, attr_o)))
            else:
                stack.append(None)
                code.unreadable = "a global whose module or name is computed"
        elif name in _SILENT:
            continue
        else:
            stack.append(None)
        if k in consumed:
            continue
        top = stack[-1]
        if isinstance(top, Global):
            if top.module in _CLOUDPICKLE and top.name in _HELPERS:
                helper = top
            continue        # e.g. the type a by-value class is made with
        if isinstance(top, str) and len(stack) >= 2 and stack[-2] == "__qualname__":
            code.functions.append(top)
        elif helper is not None:
            if isinstance(top, str):
                if helper.name == "_make_skeleton_class":
                    code.classes.append(top)
                elif top not in code.imports:
                    code.imports.append(top)
            helper = None
    return code


#: Modules whose functions can run commands, load code or reach the network: a pickle
#: of a workflow has no business calling them (shown by `subzero trust`, as a hint only).
_RISKY_MODULES = {"os", "posix", "nt", "subprocess", "shutil", "sys", "importlib", "socket",
                  "ctypes", "pty", "runpy", "code", "codeop", "marshal", "pickle", "_pickle",
                  "webbrowser", "multiprocessing", "signal", "urllib", "http", "ftplib", "asyncio"}
_RISKY_BUILTINS = {"eval", "exec", "compile", "__import__", "open", "getattr", "setattr",
                   "delattr", "globals", "locals", "vars", "breakpoint", "input"}


def risky(module: str, name: str) -> bool:
    """Whether a looked-up global can run commands or code by itself (a hint for the
    reader of ``subzero trust``: any code can do harm, flagged or not)."""
    head = module.partition(".")[0]
    if head in ("builtins", "__builtin__"):
        return name in _RISKY_BUILTINS
    return head in _RISKY_MODULES
