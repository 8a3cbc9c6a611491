# The two commands of the README's Quickstart, and the checks `make test` runs.
.PHONY: demo test check setup clean

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

# mypy over the subzero package and ruff over every Python folder
check: setup
	@scripts/check.sh

# two worker processes, a test file each at a time (its module fixtures built once):
# the suite is mostly one core's work, and a CI machine has two
test: check
	@.venv/bin/python -m pytest -n 2 --dist loadfile

clean:
	rm -rf .subzero .subzero-demo demo-trace.png demo-*.png build
