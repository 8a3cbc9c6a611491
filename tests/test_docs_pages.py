"""The quick tier of the documentation's code blocks for the pages that take longest
(``ELSEWHERE`` in test_docs.py): a file of their own, so that two test workers share
the pages (pytest-xdist gives each file to one worker).  The two longest sessions
(``LONG``: a store's whole life, a night of exposures) run in the slow tier
(tests/conftest.py SLOW), every block of them as before."""

import pytest
from docblocks import PAGES, ROOT
from test_docs import ELSEWHERE, built_stores, run_page  # noqa: F401 - built_stores: a fixture

#: the pages whose blocks take longest of all (half a minute each on 2 cores): whole
#: command-line sessions, runs, a killed and resumed run, gc, a night of real exposures
LONG = {"docs/guide/store.md", "docs/howto/astronomy-night.md"}
MINE = [p for p in PAGES if p.relative_to(ROOT).as_posix() in ELSEWHERE - LONG]
MINE_LONG = [p for p in PAGES if p.relative_to(ROOT).as_posix() in LONG]


def test_the_long_pages_are_pages_of_this_file():
    assert LONG <= ELSEWHERE and len(MINE_LONG) == len(LONG)


@pytest.mark.parametrize("page", MINE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_blocks_run(page, tmp_path, built_stores):  # noqa: F811 - the fixture
    """Every block of the page but those marked slow or skip."""
    run_page(page, tmp_path, built_stores, slow=False)


@pytest.mark.parametrize("page", MINE_LONG, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_long_page_blocks_run(page, tmp_path, built_stores):  # noqa: F811 - the fixture
    """The same for the longest pages (slow tier)."""
    run_page(page, tmp_path, built_stores, slow=False)
