"""Write docs/reference/cli.md from the CLI's own parser (subzero.cli.build_parser).

Usage: .venv/bin/python scripts/cli_reference.py [--check]
tests/test_docs.py compares the page with what this writes, so it cannot go stale:
after changing a command's flags or help, run this script and commit the page.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
WIDTH = "100"   # the help's line width, fixed so the page does not depend on the terminal

HEAD = """# Command-line reference

Every `subzero` command and its flags, as `subzero COMMAND --help` prints them.
This page is generated from the parser itself by `scripts/cli_reference.py`
(do not edit it by hand: `tests/test_docs.py` fails when it differs from the
parser). The [user guide](../index.md#user-guide) explains what each command is for.
"""


def render() -> str:
    os.environ["COLUMNS"] = WIDTH
    from subzero.cli import build_parser
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = [HEAD, "## subzero\n", "```text", parser.format_help().rstrip(), "```\n"]
    for name, sp in subs.choices.items():
        if sp.prog.split()[-1] != name:      # an alias of a command listed under its own name
            continue
        parts += [f"## subzero {name}\n", "```text", sp.format_help().rstrip(), "```\n"]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale: run .venv/bin/python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
