"""The documentation site (docs/, mkdocs.yml) and the README: the site builds with
warnings as errors (broken links and anchors included), the CLI reference is the
parser's own help, and every code block runs.

How blocks run (tests/docblocks.py reads them): each page runs in a temporary
folder of its own that holds links to the repository's workflows/ (with their
data), its blocks in order, so a page is one session:

* ``bash``/``sh`` blocks run in bash (``set -euo pipefail``) with the installed
  ``.venv/bin`` first on PATH, so ``subzero ...`` is the installed command;
* ``python`` blocks run in one namespace per page, in a fresh interpreter per page
  (a child process), in the page's folder;
* ``json`` blocks are parsed, and a block with ``"queries"`` is read as a workload;
* ``text`` blocks and blocks without a language are output or listings: counted,
  not run.

A comment on the line before a block changes that: ``<!-- test: slow REASON -->``
runs it in the slow tier only (the quick tier runs the page without it),
``<!-- test: file NAME -->`` writes it to the file NAME, which the blocks after it
use (a workflow module they run), ``<!-- test: skip REASON -->`` never runs it (it cannot run in a test; the reason
says why, and test_blocks_not_run_are_few_and_say_why lists them). A page may start
with ``<!-- test: store astronomy -->`` (or ``example``): its folder then begins
with a copy of a store holding one run of that workflow, made once per session
here. ``<!-- test: setup ... -->`` holds hidden shell lines run where they stand
(to make a file a block names); they are listed too.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import PAGES, ROOT, Block, blocks_of, pending

VENV_BIN = Path(sys.executable).parent


def test_site_builds_strict_with_no_warning(tmp_path):
    """`mkdocs build --strict`: any warning (a link to a missing page or anchor, a page
    left out of the nav) fails it.  Never with -q: mkdocs then drops warnings before
    --strict counts them."""
    p = subprocess.run([str(VENV_BIN / "mkdocs"), "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "howto" / "spark-cluster" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path):
    """The strict build is a real check: a link to a missing anchor or page fails it."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for bad in ("[x](guide/tracing.md#no-such-section)", "[x](guide/no-such-page.md)"):
        page = tmp_path / "docs" / "index.md"
        page.write_text((ROOT / "docs" / "index.md").read_text() + f"\n{bad}\n")
        p = subprocess.run([str(VENV_BIN / "mkdocs"), "build", "--strict", "-d", str(tmp_path / "site")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode != 0, bad


def test_cli_reference_is_the_parsers_help():
    """docs/reference/cli.md is generated from subzero.cli.build_parser; a changed flag
    or help text without regenerating it fails here."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    from subzero.cli import build_parser
    subs = build_parser()._subparsers._group_actions[0].choices   # type: ignore[union-attr]
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for name in subs:
        assert f"usage: subzero {name}" in page or f"## subzero {name}" in page, name


def test_every_page_is_in_the_nav_and_the_readme_stays_short():
    import yaml
    nav = json.dumps(yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!", ""))["nav"])
    for page in (ROOT / "docs").rglob("*.md"):
        assert page.relative_to(ROOT / "docs").as_posix() in nav, page
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    # the Quickstart keeps exactly its two commands
    quick = readme.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert [ln.split("#")[0].strip() for ln in quick.strip().splitlines()] == ["make demo", "make test"]


# ---- every block -------------------------------------------------------------------

ALL = [b for page in PAGES for b in blocks_of(page)]


def test_blocks_are_read_and_every_code_block_has_a_way_to_run():
    langs = {b.lang for b in ALL}
    assert langs <= {"bash", "sh", "python", "json", "text", ""}, langs
    assert sum(b.runs for b in ALL) >= 35


def test_blocks_not_run_are_few_and_say_why():
    """Blocks marked skip cannot run in a test: each names why, and they stay few.
    This prints them (pytest -s) so the list is visible."""
    skipped = [b for b in ALL if b.mark == "skip"]
    for b in skipped:
        assert len(b.reason) > 20, f"{b.where}: say why it cannot run"
        print(f"not run: {b.where}: {b.reason}")
    assert len(skipped) <= 20, [b.where for b in skipped]


#: Pages whose blocks do not run yet, each saying why at its top (<!-- test: pending
#: REASON -->): the work left on issue 31's item 7.  The list may only shrink.
PENDING: set[str] = set()


def test_pages_whose_blocks_do_not_run_yet_are_listed():
    marked = {p.relative_to(ROOT).as_posix() for p in PAGES if pending(p)}
    assert marked <= PENDING, f"a page newly marked pending: {sorted(marked - PENDING)}"
    assert marked == PENDING, f"these pages run now: take them off PENDING: {sorted(PENDING - marked)}"
    for p in PAGES:
        if pending(p):
            n = sum(b.runs for b in blocks_of(p))
            print(f"pending: {p.relative_to(ROOT).as_posix()}: {n} block(s) not run: {pending(p)}")


@pytest.fixture(scope="module")
def built_stores(tmp_path_factory):
    """One run of each workflow a page starts from, made once, copied per page."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            folder = tmp_path_factory.mktemp(f"docs-store-{name}")
            p = subprocess.run([str(VENV_BIN / "subzero"), "run", str(ROOT / "workflows" / f"{name}.py"),
                                "--engine", "local", "-q", "--store", str(folder / ".subzero")],
                               capture_output=True, text=True, timeout=600)
            assert p.returncode == 0, p.stderr
            made[name] = folder / ".subzero"
        return made[name]
    return get


CHILD = r"""
import json, sys, traceback
reply, sys.stdout = sys.stdout, sys.stderr      # what blocks print goes to the log
ns = {"__name__": "__main__"}
for line in sys.stdin:
    msg = json.loads(line)
    try:
        exec(compile(msg["code"], msg["where"], "exec"), ns)
        reply.write(json.dumps({"ok": True}) + "\n")
    except BaseException:
        reply.write(json.dumps({"ok": False, "error": traceback.format_exc()}) + "\n")
    reply.flush()
"""


class PythonSession:
    """One interpreter per page: its python blocks share one namespace, in order."""

    def __init__(self, cwd: Path, env: dict):
        self.log = open(cwd / "python-blocks.log", "w+")
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)

    def run(self, b: Block) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"code": b.code, "where": b.where}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        self.log.seek(0)
        log = self.log.read()[-4000:]
        assert line, f"{b.where}: the interpreter ended\n{log}"
        answer = json.loads(line)
        assert answer["ok"], f"{b.where}:\n{b.code}\n{answer['error']}\n{log}"

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_page(page: Path, tmp_path: Path, stores, slow: bool) -> list[str]:
    """Runs a page's blocks in order (the slow ones too when ``slow``); returns what ran."""
    if pending(page):
        pytest.skip(f"blocks not run yet: {pending(page)}")
    blocks = blocks_of(page)
    work = tmp_path / "page"
    work.mkdir()
    (work / "workflows").symlink_to(ROOT / "workflows")
    store = next((b.reason for b in blocks if b.mark == "store"), None)
    if store:
        shutil.copytree(stores(store), work / ".subzero")
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", MPLBACKEND="Agg",
               PYTHONPATH=str(ROOT / "tests"))
    python: PythonSession | None = None
    ran: list[str] = []
    try:
        for b in blocks:
            if not (b.runs or b.mark == "setup") or (b.mark == "slow" and not slow):
                continue
            if b.mark == "file":
                (work / b.reason).write_text(b.code)
            elif b.lang == "python":
                python = python or PythonSession(work, env)
                python.run(b)
            elif b.lang in ("bash", "sh"):
                p = subprocess.run(["bash", "-c", "set -euo pipefail\n" + b.code], cwd=work, env=env,
                                   capture_output=True, text=True, timeout=900)
                assert p.returncode == 0, (f"{b.where}: exit {p.returncode}\n{b.code}\n"
                                           f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
            elif b.lang == "json":
                data = json.loads(b.code)
                if "queries" in data:
                    from subzero.query.workload import parse_workload
                    assert parse_workload(data, b.where)
            ran.append(b.where)
    finally:
        if python:
            python.close()
    return ran


#: the pages whose blocks take longest, run by tests/test_docs_pages.py: a file of their
#: own, so that two test workers share the pages (xdist gives each file to one worker)
ELSEWHERE = {"docs/howto/astronomy-night.md", "README.md", "docs/tutorial.md",
             "docs/guide/store.md"}
HERE = [p for p in PAGES if p.relative_to(ROOT).as_posix() not in ELSEWHERE]


def test_every_page_is_run_by_one_file():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert ELSEWHERE <= names, sorted(ELSEWHERE - names)


@pytest.mark.parametrize("page", HERE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_blocks_run(page, tmp_path, built_stores):
    """The quick tier: every block of the page but those marked slow or skip."""
    run_page(page, tmp_path, built_stores, slow=False)


SLOW_PAGES = [p for p in PAGES if any(b.mark == "slow" for b in blocks_of(p))]


@pytest.mark.parametrize("page", SLOW_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_blocks_run_with_the_slow_ones(page, tmp_path, built_stores):
    """The slow tier: pages with blocks marked slow, run whole."""
    run_page(page, tmp_path, built_stores, slow=True)
