#!/usr/bin/env bash
# Chromium for the explorer's browser tests (tests/test_explore.py drives it with
# Playwright; Playwright's own browser download is never used): Debian's package,
# with a font but without its other recommended extras (printer tools, udev).  Only the tests need it: `make test` runs this,
# `make demo` does not.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .venv
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Chromium for the explorer's browser tests: apt-get install chromium" >&2
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation; } >.venv/apt-chromium.log 2>&1; then
      tail -5 .venv/apt-chromium.log >&2
      echo "setup: warning: could not install chromium (log in .venv/apt-chromium.log); tests/test_explore.py will fail until /usr/bin/chromium exists (apt-get install chromium)" >&2
    fi
  else
    echo "setup: warning: /usr/bin/chromium is missing and this is not root with apt-get; tests/test_explore.py needs it: install Debian's chromium (sudo apt-get install chromium)" >&2
  fi
fi

