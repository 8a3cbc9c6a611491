"""Writing an export file: never over an existing one unless asked, never half-written.

Every format writes into a temporary sibling of its path and renames it into
place, so a reader never sees a partial file and a failed export leaves
nothing behind.  File-system problems become one line naming the path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from subzero.errors import ExportError


def check_target(path: str | os.PathLike, force: bool) -> Path:
    """The output path, checked before any work: its folder exists and it does not
    (unless ``force``)."""
    p = Path(path)
    if p.exists() and not force:
        raise ExportError(f"{p} already exists; remove it or pass `force=True` to replace it")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ExportError(f"cannot write {p}: {parent} is not a folder")
    if not parent.is_dir():
        raise ExportError(f"cannot write {p}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write {p}: the folder {parent} is not writable")
    return p


@contextmanager
def _replacing(p: Path) -> Iterator[Path]:
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if p.exists() or p.is_symlink():
            _remove(p)
        os.replace(tmp, p)
    except OSError as e:
        _remove(tmp)
        raise ExportError(f"cannot write {p}: {e.strerror or e}") from e
    except BaseException:
        _remove(tmp)
        raise


def write_atomic(path: str | os.PathLike, write: Callable[[Path], object], force: bool = False) -> Path:
    """``write(tmp)`` creates the file or folder ``tmp``; it then becomes ``path``."""
    p = check_target(path, force)
    with _replacing(p) as tmp:
        write(tmp)
    return p


def write_text(path: str | os.PathLike, text: str, force: bool = False) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), force)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except FileNotFoundError:
            pass
