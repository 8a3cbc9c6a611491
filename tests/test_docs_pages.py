"""The quick tier of the documentation's code blocks for the pages that take longest
(``ELSEWHERE`` in test_docs.py): a file of their own, so that two test workers share
the pages (pytest-xdist gives each file to one worker)."""

import pytest
from docblocks import PAGES, ROOT
from test_docs import ELSEWHERE, built_stores, run_page  # noqa: F401 - built_stores: a fixture

MINE = [p for p in PAGES if p.relative_to(ROOT).as_posix() in ELSEWHERE]


@pytest.mark.parametrize("page", MINE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_blocks_run(page, tmp_path, built_stores):  # noqa: F811 - the fixture
    """Every block of the page but those marked slow or skip."""
    run_page(page, tmp_path, built_stores, slow=False)
