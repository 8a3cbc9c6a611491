# The two commands of the README's Quickstart, and the checks `make test` runs.
.PHONY: demo test check setup clean

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

# mypy over the subzero package and ruff over every Python folder
check: setup
	@scripts/check.sh

test: check
	@.venv/bin/python -m pytest

clean:
	rm -rf .subzero .subzero-demo demo-trace.png demo-*.png build
