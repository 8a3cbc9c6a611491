"""Scratch folders a killed process leaves are swept; a living one's never
(``subzero.scratch``).  Processes are real and killed with SIGKILL: nothing of
theirs runs after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from subzero.scratch import HELD, scratch, sweep

ROOT = Path(__file__).resolve().parents[1]


def _holder(base: Path, kind: str = "t", fork: bool = False) -> tuple[subprocess.Popen, Path, int]:
    """A process that makes a scratch folder of ``kind`` in ``base`` and sleeps (``fork``: a
    child forked after the folder is made sleeps too): the process, the folder and the
    child's pid (1 without one)."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from subzero.scratch import scratch
        held = scratch({kind!r}, {str(base)!r})
        child = os.fork() if {fork!r} else 1
        if child == 0:
            time.sleep(120); os._exit(0)
        print(held.path, child, flush=True)
        time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout is not None
    line = p.stdout.readline().split()
    return p, Path(line[0]), int(line[1])


def _kill(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait()


def _gone(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    until = time.monotonic() + 10
    while time.monotonic() < until:          # not our child: wait until the kernel reaps it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").exists() and \
                Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return                           # a zombie holds no file
        time.sleep(0.02)


def test_a_killed_process_folder_is_swept_by_the_next_scratch(tmp_path):
    p, folder = _holder(tmp_path)[:2]
    assert (folder / HELD).exists() and folder.name.startswith("subzero-t-")
    (folder / "data").write_bytes(b"x" * 1000)
    _kill(p)
    assert folder.exists()                   # a kill removes nothing by itself
    with scratch("t", tmp_path) as held:
        assert not folder.exists()
        assert held.path.exists() and held.path != folder
    assert not held.path.exists()


def test_a_living_process_folder_is_never_swept(tmp_path):
    p, folder = _holder(tmp_path)[:2]
    try:
        assert sweep("t", tmp_path) == []
        with scratch("t", tmp_path):
            assert folder.exists() and (folder / HELD).exists()
    finally:
        _kill(p)
    assert sweep("t", tmp_path) == [folder]


def test_a_forked_child_keeps_the_folder_after_its_parent_is_killed(tmp_path):
    p, folder, child = _holder(tmp_path, fork=True)
    _kill(p)
    try:
        assert sweep(None, tmp_path) == [] and folder.exists()
    finally:
        _gone(child)
    assert sweep(None, tmp_path) == [folder]


def test_only_its_own_kind_is_swept_when_asked(tmp_path):
    p, folder = _holder(tmp_path, kind="other")[:2]
    _kill(p)
    assert sweep("t", tmp_path) == [] and folder.exists()
    assert sweep(None, tmp_path) == [folder]


def test_a_new_scratch_sweeps_every_kind_and_unswept_ones_are_not_left_for_good(tmp_path):
    """A shard's folder is made without a sweep (one per tile); the next scratch of any
    kind made with one removes it once its process is gone."""
    p, folder = _holder(tmp_path, kind="shard")[:2]
    _kill(p)
    with scratch("t", tmp_path, swept=False):
        assert folder.exists()
    with scratch("profile", tmp_path):
        assert not folder.exists()


def test_folders_not_made_by_scratch_and_links_are_left_alone(tmp_path):
    plain = tmp_path / "subzero-t-plain"          # no held file: someone else's
    plain.mkdir()
    (plain / "keep").write_text("mine")
    p, folder = _holder(tmp_path, kind="x")[:2]
    _kill(p)
    link = tmp_path / "subzero-t-link"           # a link to an abandoned scratch folder
    link.symlink_to(folder)
    assert sweep("t", tmp_path) == []
    assert (plain / "keep").read_text() == "mine" and folder.exists() and link.is_symlink()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make another user's folder")
def test_another_users_abandoned_folder_is_left_alone(tmp_path):
    p, folder = _holder(tmp_path)[:2]
    _kill(p)
    os.chown(folder, 65534, 65534)
    assert sweep("t", tmp_path) == [] and folder.exists()


def test_close_removes_the_folder_and_a_second_close_does_nothing(tmp_path):
    held = scratch("t", tmp_path)
    (held.path / "f").write_text("x")
    held.close()
    held.close()
    assert list(tmp_path.iterdir()) == []


def test_a_budget_run_killed_outright_leaves_nothing_after_the_next(tmp_path, calibration):
    """``run --max-disk`` killed (SIGKILL, with its children) while it profiles leaves its
    scratch folder; the next budget run sweeps it and leaves none of its own."""
    from conftest import subzero_exe

    import subzero
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    stores = []
    for k in range(2):
        st = subzero.open_store(tmp_path / f"store{k}")
        st.catalog.add_calibration(os.uname().nodename, calibration["seconds"], calibration)
        st.close()
        stores.append(tmp_path / f"store{k}")
    args = [subzero_exe(), "run", str(ROOT / "workflows" / "genomics.py"), "--max-disk",
            "100MB", "-q", "--store"]
    env = {**os.environ, "TMPDIR": str(tmp)}
    p = subprocess.Popen(args + [str(stores[0])], env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until = time.monotonic() + 120
    while not list(tmp.glob("subzero-profile-*")) and p.poll() is None and time.monotonic() < until:
        time.sleep(0.005)
    left = list(tmp.glob("subzero-profile-*"))
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert left and all(f.exists() for f in left), "the run ended before it profiled"
    done = subprocess.run(args + [str(stores[1])], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert [f.name for f in tmp.iterdir() if f.name.startswith("subzero-")] == [], (left, list(tmp.rglob("*")))


def test_a_folder_left_half_made_is_swept_only_once_old(tmp_path):
    """A maker killed between making its folder and taking its lock leaves a hidden
    folder: it may be one being made right now, so it is swept only once it is old."""
    from subzero.scratch import MAKING_GRACE_S
    half = tmp_path / ".subzero-t-half"
    half.mkdir()
    (half / HELD).touch()
    assert sweep("t", tmp_path) == [] and half.exists()
    old = time.time() - MAKING_GRACE_S - 5
    os.utime(half, (old, old))
    assert sweep("t", tmp_path) == [half] and not half.exists()
    bare = tmp_path / ".subzero-t-bare"         # killed before it made its file
    bare.mkdir()
    assert sweep("t", tmp_path) == [] and bare.exists()
    os.utime(bare, (old, old))
    assert sweep("t", tmp_path) == [bare] and not bare.exists()
