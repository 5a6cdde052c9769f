# Relaunch — `make demo` runs the main story, `make test` every test tier (the real stack included).
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: deps demo test test-unit test-quick lint typecheck bench bench-quick bench-adapter bench-recovery bench-attribution up down status clean

deps:
	@bash scripts/install-deps.sh

demo: deps
	$(PY) examples/demo.py

# Two pytest workers, each with its own stack; the PostgreSQL-outage test (10 minutes, most of
# it waiting) has a worker to itself while the other runs the rest.
test: deps lint typecheck
	$(PY) -m pytest -q -n 2 --dist loadgroup $(PYTEST_ARGS)

# The inner loop: unit tests only, no stack (seconds).
test-unit test-quick: deps
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

lint: deps
	$(VENV)/bin/ruff check relaunch tests bench examples
	$(VENV)/bin/ruff format --check relaunch tests bench examples

typecheck: deps
	$(VENV)/bin/mypy

# The fault-injection benchmark (bench/faults): every fault class against Slurm on its own,
# a burst of interruptions, the watcher's cost; writes bench/results/REPORT.md and PNGs.
bench: deps
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) bench/run.py $(BENCH_ARGS)

bench-quick: BENCH_ARGS = --quick
bench-quick: bench

bench-adapter: deps
	$(PY) bench/adapter.py

bench-recovery: deps
	$(PY) bench/recovery.py

bench-attribution: deps
	$(PY) bench/attribution.py

up: deps
	$(VENV)/bin/relaunch dev up

down: deps
	$(VENV)/bin/relaunch dev down

status: deps
	$(VENV)/bin/relaunch dev status

clean: down
	rm -rf .relaunch
