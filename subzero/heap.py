"""How a command's process reuses the memory of numpy's temporaries.

glibc hands out an allocation above its *mmap threshold* as fresh pages from the
kernel, which the kernel zeroes on first touch, and returns them when freed.  The
threshold starts at 128 KB and rises to the size of each such block freed (up to
32 MB), so how much of a step's work is page faults depends on what the process
freed before: in a fresh ``subzero trace`` a 64-cell stored read took 5.5 ms, in a
process that had freed one 8 MB array 2.8 ms; 1,024 cells 45 against 28 ms
(genomics 1,000x, alternated processes).  The calibration and the profiler measure
in long-running processes, the user's traces run in fresh ones, and so the same
read cost one thing when the model was made and another when it was used.

:func:`steady` fixes both thresholds when a command starts: blocks under
``HEAP_MMAP_BYTES`` come from the heap, and up to ``HEAP_TRIM_BYTES`` of freed heap
stays with the process.  A step then costs the same whatever ran before it in its
process.  Larger blocks (a whole image) are still mapped and returned.
"""

from __future__ import annotations

import sys

from .tuning import HEAP_MMAP_BYTES, HEAP_TRIM_BYTES

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def _libc(name: str, *argtypes):
    """The C library's function ``name`` taking ``argtypes`` and returning an int (glibc
    on Linux), or None where there is no such function (another C library or system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):       # e.g. musl, which has no mallopt
        return None
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


def steady() -> bool:
    """Fix this process's allocator thresholds (glibc on Linux); False where there is no
    such allocator (another C library or system), which changes nothing else."""
    import ctypes
    mallopt = _libc("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_BYTES)) and \
        bool(mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_BYTES))


def release() -> bool:
    """Give the free memory of this process's heap back to the system (glibc's
    ``malloc_trim``), so that what it allocates next comes from fresh pages.  A forked
    child calls it first: the heap it inherited is shared with its parent page by page,
    and every block it reused from there would first be copied (the profiler's samples
    in a child wrote 1.3-2x slower than the same writes in the parent)."""
    import ctypes
    trim = _libc("malloc_trim", ctypes.c_size_t)
    return trim is not None and bool(trim(0))
