"""Large arrays a workflow's code holds, kept out of ``workflow.pkl``.

A workflow module may build arrays as it runs -- a calibration frame as an input's
default, a lookup table read from a data file into an operator, a kernel in a
module global -- and pickling the workflow would copy each into every run's
``workflow.pkl`` (12 MB for the LSST demo, for three calibration frames).  The
pickle holds code and small parameters only:

* an array given as an **input's default** is the run's input, which the run stores
  once and checksums like any input (:mod:`.shared`): the pickle keeps a
  :class:`~subzero.model.workflow.KeptInput` in its place, naming its content digest;
* any other array over :data:`~subzero.tuning.PICKLE_CONSTANT_BYTES` is a
  **constant rebuilt from code**: the pickle keeps its SHA-256, shape and dtype (a
  pickle *persistent id*), and loading the pickle runs the workflow module again
  (from where the run loaded it, with its parameters) and takes the array whose
  digest is that one.  A module whose code or data changed since the run no longer
  builds it, and loading fails with :class:`~subzero.errors.ChangedConstant`, never
  with operators that would give another answer.  A workflow built in Python has no
  module to run again: its constants stay in the pickle (with a warning that says
  how to avoid it).
"""

from __future__ import annotations

import hashlib
import io
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from subzero.errors import ChangedConstant
from subzero.tuning import PICKLE_CONSTANT_BYTES

#: the first element of a constant's persistent id in a pickle
TAG = "subzero-constant"


@dataclass(frozen=True)
class Constant:
    """An array left out of a pickle: its digest (of shape, dtype and bytes), shape, dtype."""

    sha256: str
    shape: tuple[int, ...]
    dtype: str

    def describe(self) -> str:
        return f"a {'x'.join(map(str, self.shape)) or 'scalar'} {np.dtype(self.dtype)} array " \
               f"(sha256 {self.sha256[:16]})"


def constant_of(a: np.ndarray) -> Constant:
    """The digest of an array's values as the operators see them (shape, dtype, bytes in C
    order: a copy or a different memory layout has the same digest)."""
    h = hashlib.sha256(f"{a.shape}|{a.dtype.str}|".encode())
    h.update(np.ascontiguousarray(a).data)
    return Constant(h.hexdigest(), tuple(int(n) for n in a.shape), a.dtype.str)


def is_constant(obj: object) -> bool:
    """Whether a pickle leaves ``obj`` out: a numeric array of at least the bound."""
    return (type(obj) is np.ndarray and obj.dtype != object
            and obj.nbytes >= PICKLE_CONSTANT_BYTES)


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle, with each large array replaced by its :class:`Constant` (once per
    array object), which it collects in ``found``."""

    def __init__(self, file: io.BytesIO, found: dict[str, np.ndarray]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.found = found
        self._seen: dict[int, tuple[Any, ...]] = {}

    def persistent_id(self, obj: Any) -> tuple[Any, ...] | None:
        if not is_constant(obj):
            return None
        pid = self._seen.get(id(obj))
        if pid is None:
            c = constant_of(obj)
            self.found.setdefault(c.sha256, obj)
            pid = self._seen[id(obj)] = (TAG, c.sha256, c.shape, c.dtype)
        return pid


def dumps(obj: Any) -> tuple[bytes, dict[str, np.ndarray]]:
    """``obj`` pickled (cloudpickle) without its large arrays, and those arrays by digest."""
    buf, found = io.BytesIO(), dict[str, np.ndarray]()
    _Pickler(buf, found).dump(obj)
    return buf.getvalue(), found


def built(obj: Any) -> dict[str, np.ndarray]:
    """The large arrays ``obj`` holds, by digest: what a pickle of it would leave out."""
    return dumps(obj)[1]


class Unpickler(pickle.Unpickler):
    """Loads a pickle whose constants are given back by ``rebuild()``: a mapping of
    digests to arrays, asked for (once) at the first constant; ``where`` names the run
    in the error; ``place(module, name)``: where a global the pickle names lives now."""

    def __init__(self, data: bytes, rebuild: Callable[[], Mapping[str, np.ndarray]] | None,
                 where: str, place: Callable[[str, str], tuple[str, str]]):
        super().__init__(io.BytesIO(data))
        self._rebuild, self._where, self._place = rebuild, where, place
        self._arrays: Mapping[str, np.ndarray] | None = None

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(*self._place(module, name))

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 4 and pid[0] == TAG):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        c = Constant(str(pid[1]), tuple(pid[2]), str(pid[3]))
        if self._rebuild is None:
            raise ChangedConstant(f"{self._where} used {c.describe()} that is rebuilt from "
                                  f"its workflow module, and nothing says which module")
        if self._arrays is None:
            self._arrays = self._rebuild()
        a = self._arrays.get(c.sha256)
        if a is None:
            raise ChangedConstant(f"{self._where} used {c.describe()} that its workflow module "
                                  f"no longer builds: the module or a file it reads changed "
                                  f"since the run; restore them, or run the workflow again")
        return a
