"""A command's process reuses the memory of numpy's temporaries alike, whatever it
freed before (subzero.heap): with the thresholds fixed, a block of a few MB comes from
the heap, not from fresh kernel pages mapped for it -- glibc's own mallinfo2 says where
the bytes live.  Each case runs in a fresh process (this one's history is the point)."""

import ctypes
import json
import subprocess
import sys

import pytest

CODE = """
import ctypes, json, sys
import numpy as np
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
if sys.argv[1] == "steady":
    from subzero.heap import steady
    assert steady()
before = libc.mallinfo2().hblkhd
held = np.ones(4 * 2**20 // 8)          # 4 MB, above glibc's first threshold (128 KB)
print(json.dumps({"mapped": libc.mallinfo2().hblkhd - before}))
"""


def _mapped(mode: str) -> int:
    p = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])["mapped"]


def _glibc_with_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "mallinfo2") and sys.platform.startswith("linux")
    except OSError:
        return False


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc 2.33+ on Linux (mallinfo2)")
def test_a_steady_process_takes_temporaries_from_the_heap_not_fresh_pages():
    assert _mapped("default") >= 4 * 2**20          # glibc maps a fresh block for it
    assert _mapped("steady") < 2**20                # the heap holds it


def test_the_command_line_makes_its_process_steady(monkeypatch, tmp_path):
    """`subzero` (its own process: ``main()`` without arguments) fixes the thresholds
    before the command runs; a call with arguments (a test, a library) leaves the
    process as it is."""
    import subzero.cli as cli
    import subzero.heap as heap
    calls = []
    monkeypatch.setattr(heap, "steady", lambda: calls.append(1) or True)
    args = ["runs", "--store", str(tmp_path / "no-store")]      # fails in one line, exit 2
    monkeypatch.setattr(sys, "argv", ["subzero", *args])
    assert cli.main(args) == 2 and calls == []
    monkeypatch.setattr(cli, "_not_waiting_for_threads", lambda code: None)
    assert cli.main() == 2 and calls == [1]


RELEASE = """
import json, sys
import numpy as np
from subzero.heap import release, steady
assert steady()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
blocks = [np.ones(16 * 2**20 // 8) for _ in range(4)]     # 64 MB of heap, touched
del blocks                                                # freed, kept by the process
kept = rss()
if sys.argv[1] == "release":
    release()
print(json.dumps({"freed": kept - rss()}))
"""


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc 2.33+ on Linux")
def test_release_gives_the_kept_heap_back():
    """A steady process keeps freed heap (its trim threshold); ``release`` -- what a
    forked profiling child calls before it allocates -- gives it back, so the child's
    next blocks are fresh pages of its own, not copies of its parent's."""
    def freed(mode):
        p = subprocess.run([sys.executable, "-c", RELEASE, mode], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.strip().splitlines()[-1])["freed"]
    assert freed("keep") < 8 * 2**20
    assert freed("release") >= 48 * 2**20
