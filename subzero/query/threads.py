"""One native thread for an operator re-run on a small box.

Operators compute with native libraries that keep thread pools of their own: OpenMP
(astroscrappy's L.A.Cosmic in the astronomy workflow's ``cr_j``) and BLAS (numpy's and
scipy's OpenBLAS).  Over a whole image the threads pay.  A trace re-runs an operator on
the box its query spans -- a star's ~90x90 pixels -- where a parallel region lasts less
than it takes to wake a thread: the threads wait for each other at the end of every
region, and on a machine whose cores are busy, a thread that lost its core holds the
others for a time slice.  A black-box star trace at 16 Mpix took a median 4.43 s with
astroscrappy's OpenMP threads and 0.64 s with ``OMP_NUM_THREADS=1`` (benchmarks/RESULTS.md,
"Black-box at CCD scale"), which no user should have to know to set.

So a re-run on a box of at most :data:`~subzero.tuning.SERIAL_BOX_CELLS` cells runs
every native pool on one thread (threadpoolctl), and gives each pool back the threads
it had when the re-run ends, also when it raises.  Whole re-runs and the engines' runs
keep every thread.  A library first loaded during the re-run (an operator that imports
astroscrappy on its first run) is held to one thread as soon as its extension module is
loaded, and given back its own default after.  Nothing else of the process changes: its
environment variables, which would set every later thread's default, are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.machinery
import sys
from collections.abc import Callable, Iterator
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from subzero.tuning import SERIAL_BOX_CELLS

__all__ = ["one_native_thread", "one_thread_for"]


@contextlib.contextmanager
def one_thread_for(cells: int) -> Iterator[None]:
    """:func:`one_native_thread` around a re-run whose box (its read region) holds
    ``cells`` cells, when that is at most SERIAL_BOX_CELLS; nothing otherwise."""
    if cells > SERIAL_BOX_CELLS:
        yield
        return
    with one_native_thread():
        yield


@contextlib.contextmanager
def one_native_thread() -> Iterator[None]:
    """Within it, every native thread pool of this process runs one thread: those loaded
    when it starts, and those loaded inside it (as their extension module loads); after
    it, each has the threads it had before (or, loaded inside, its own default)."""
    held: list[Any] = []        # threadpoolctl limiters, in the order they were set
    seen: set[str] = set()

    def hold(controller: Any) -> None:
        """One thread for every pool of ``controller`` not held yet."""
        fresh = [lib.filepath for lib in controller.lib_controllers if lib.filepath not in seen]
        if fresh:
            seen.update(fresh)
            held.append(controller.select(filepath=fresh).limit(limits=1))

    def loaded() -> None:               # an extension module (and its libraries) loaded
        hold(_pools())

    watch = _ExtensionWatch(loaded)
    hold(_pools())
    sys.meta_path.insert(0, watch)
    try:
        yield
    finally:
        sys.meta_path.remove(watch)
        watch.then = _nothing          # a loader it made outlives it (as a __loader__)
        for limiter in reversed(held):
            limiter.restore_original_limits()


def _pools() -> Any:
    """The native thread pools of this process (a threadpoolctl controller).  Finding
    them reads the process's memory map (1-2 ms, as much as some box re-runs), so it is
    done again only when the count of loaded shared libraries (:func:`_libraries`)
    changed: a pool is a shared library of its own (libgomp, libopenblas)."""
    libraries = _libraries()
    if libraries is None:
        from threadpoolctl import ThreadpoolController
        return ThreadpoolController()
    return _scan(libraries)


@functools.lru_cache(maxsize=1)
def _scan(libraries: int) -> Any:
    """The pools found when ``libraries`` shared libraries were loaded (see _pools)."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


_EXTENSIONS = tuple(s.encode() for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


class _PhdrInfo(ctypes.Structure):
    """The start of glibc's ``struct dl_phdr_info``: where an object is, and its path."""

    _fields_ = [("dlpi_addr", ctypes.c_void_p), ("dlpi_name", ctypes.c_char_p)]


def _libraries() -> int | None:
    """How many shared libraries this process has loaded, Python's extension modules
    left out (each import of one would count); None where the C library cannot list
    them (no ``dl_iterate_phdr``).  A walk over the loaded objects: some 30 us."""
    try:
        walk = ctypes.CDLL(None).dl_iterate_phdr
    except (AttributeError, OSError):
        return None
    n = 0

    def count(info: int, size: int, data: int) -> int:
        nonlocal n
        name = ctypes.cast(info, ctypes.POINTER(_PhdrInfo)).contents.dlpi_name or b""
        n += not name.endswith(_EXTENSIONS)
        return 0
    walk(_CALLBACK(count), None)
    return n


class _ExtensionWatch:
    """A finder that finds only extension modules, as the path finder would, and loads
    them with :class:`_Holding`: put first, it sees every native library an import
    brings in (an extension module's shared libraries load with it).  Any other module
    it leaves to the finders after it."""

    def __init__(self, then: Callable[[], None]):
        self.then = then

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or type(spec.loader) is not importlib.machinery.ExtensionFileLoader:
            return None
        spec.loader = _Holding(spec.loader.name, spec.loader.path, self)
        return spec


class _Holding(importlib.machinery.ExtensionFileLoader):
    """An extension module's loader that tells its watch once the module (and the
    shared libraries it needs) is loaded."""

    def __init__(self, name: str, path: str, watch: _ExtensionWatch):
        super().__init__(name, path)
        self.watch = watch

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = super().create_module(spec)
        self.watch.then()
        return module


def _nothing() -> None:
    pass
