# The two commands of the README's Quickstart, and the checks `make test` runs.
.PHONY: demo test test-slow test-all check setup browser clean

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

# Chromium for the explorer's browser tests only (installed as root with apt-get when
# missing; the demo never needs it)
browser:
	@scripts/browser.sh

# mypy over the subzero package and ruff over every Python folder
check: setup
	@scripts/check.sh

# two worker processes, a test file each at a time (its module fixtures built once):
# the suite is mostly one core's work, and a CI machine has two.  `test` leaves out
# the long end-to-end sweeps (marked slow in tests/conftest.py); `test-slow` runs
# them; CI (.ci/run) runs both: every test.  Bytecode is written (beside the sources,
# git ignores it) even where the environment says not to: otherwise each worker
# rewrote the asserts of every test module again (16 s before the first test) and
# every `subzero` the tests start compiled what it imports
PYTEST = env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest -n 2 --dist loadfile

test: check browser
	@$(PYTEST) -m "not slow"

test-slow: setup browser
	@$(PYTEST) -m slow

test-all: check browser
	@$(PYTEST)

clean:
	rm -rf .subzero .subzero-demo demo-trace.png demo-*.png build
