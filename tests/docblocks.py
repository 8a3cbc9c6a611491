"""Reads the code blocks of the documentation (docs/**/*.md and README.md) with the
marks that say how tests/test_docs.py runs them (see its docstring)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
RUNNABLE = {"bash", "sh", "python", "json"}
MARK = re.compile(r"^<!--\s*test:\s*(\w+)\s*(.*?)\s*-->\s*$", re.S)
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int           # of the opening fence (1-based)
    lang: str           # "" for a block without a language
    code: str
    mark: str = ""      # "", "slow", "skip", "file" (written to a file the next blocks use),
                        # "setup" (hidden shell lines), "store" (page-wide)
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def runs(self) -> bool:
        """A code block a test runs (in some tier), as opposed to output or a listing."""
        return self.lang in RUNNABLE and self.mark in ("", "slow", "file")


def pending(page: Path) -> str:
    """Why a page's blocks do not run yet ("" when they all run)."""
    return next((b.reason for b in blocks_of(page) if b.mark == "pending"), "")


@cache
def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out: list[Block] = []
    pending: tuple[str, str, int] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- test:"):
            j = i
            while "-->" not in lines[j]:
                j += 1
            m = MARK.match("\n".join(lines[i:j + 1]))
            if not m:
                raise ValueError(f"{page}:{i + 1}: a test mark must read <!-- test: KIND REASON -->")
            kind, text = m.group(1), m.group(2)
            if kind == "pending":        # a page whose blocks do not run yet (listed by the test)
                out.append(Block(page, i + 1, "", "", "pending", text))
            elif kind == "store":
                out.append(Block(page, i + 1, "", "", "store", text))
            elif kind == "setup":
                out.append(Block(page, i + 1, "bash", text, "setup", text))
            elif kind in ("slow", "skip", "file"):
                pending = (kind, text, i + 1)
            else:
                raise ValueError(f"{page}:{i + 1}: unknown test mark {kind!r}")
            i = j + 1
            if pending and not (i < len(lines) and FENCE.match(lines[i])):
                raise ValueError(f"{page}:{pending[2]}: a '{pending[0]}' mark must be on the line before a block")
            continue
        m = FENCE.match(line)
        if m:
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            kind, text = (pending[0], pending[1]) if pending else ("", "")
            out.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n", kind, text))
            pending = None
            i = j + 1
            continue
        i += 1
    return out
