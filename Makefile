# The two commands of the README's Quickstart.
.PHONY: demo test setup clean

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

test: setup
	@.venv/bin/python -m pytest

clean:
	rm -rf .subzero .subzero-demo demo-trace.png
