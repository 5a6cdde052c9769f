# Relaunch — `make demo` runs the main story, `make test` every test tier (the real stack included).
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: deps demo test test-22.05 test-24.11 test-unit test-quick lint typecheck bench bench-quick bench-burst bench-restart bench-lifecycle bench-silent bench-false-alarms bench-probe bench-adapter bench-recovery bench-attribution bench-xid up down status clean

deps:
	@bash scripts/install-deps.sh

demo: deps
	$(PY) examples/demo.py

# Three pytest workers, each with its own stack: the PostgreSQL-outage group (11 minutes, almost
# all of it waiting for the database to come back) keeps one busy but idle, while the other two
# share the rest on the machine's two cores.
#
# Then the Slurm-facing tiers again on Slurm 24.11 (Debian 13's, in a root the first run builds
# under ~/.cache/relaunch: docs/local-stack.md): recoveries end to end, node decisions, SSH
# mode, slurmrestd, the catch-up, the node lifecycle, the intakes, the adversarial tier. `make test-22.05` or `make test-24.11` runs one pass alone.
SLURM_TIERS := tests/adversarial $(addprefix tests/integration/test_,recovery.py workflow.py \
	silent_failures.py slurm_actions.py slurmrestd.py slurmrestd_mode.py ssh_mode.py \
	stack.py clusters.py trust_plan.py job_output.py guard_race.py health_intake.py \
	rollout.py cli_errors.py catch_up.py lifecycle.py console_lifecycle.py intake.py spares.py)

test: deps lint typecheck
	@status=0; \
	echo "== every tier on Slurm 22.05"; \
	RELAUNCH_TEST_SLURM=22.05 $(PY) -m pytest -q -n 3 --dist loadgroup $(PYTEST_ARGS) || status=1; \
	echo "== the Slurm-facing tiers on Slurm 24.11"; \
	RELAUNCH_TEST_SLURM=24.11 $(PY) -m pytest -q -n 3 --dist loadgroup $(SLURM_TIERS) $(PYTEST_ARGS) || status=1; \
	exit $$status

test-22.05: deps
	RELAUNCH_TEST_SLURM=22.05 $(PY) -m pytest -q -n 3 --dist loadgroup $(PYTEST_ARGS)

test-24.11: deps
	RELAUNCH_TEST_SLURM=24.11 $(PY) -m pytest -q -n 3 --dist loadgroup $(SLURM_TIERS) $(PYTEST_ARGS)

# The inner loop: unit tests only, no stack, no Slurm (about two minutes on 2 cores). Two workers:
# much of the tier waits (timeouts, polls) rather than computes.
test-unit test-quick: deps
	$(PY) -m pytest -q -n 2 tests/unit $(PYTEST_ARGS)

lint: deps
	$(VENV)/bin/ruff check relaunch tests bench examples
	$(VENV)/bin/ruff format --check relaunch tests bench examples

typecheck: deps
	$(VENV)/bin/mypy

# The fault-injection benchmark (bench/faults): every fault class against Slurm on its own,
# a burst of interruptions, the watcher's cost; writes bench/results/REPORT.md and PNGs.
# The watcher's cost grows with a queue of 1,000 → 10,000 → 50,000 held jobs (docs/scale.md).
bench: deps
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) bench/run.py --held 50000 $(BENCH_ARGS)

bench-quick: BENCH_ARGS = --quick
bench-quick: bench

# The burst of simultaneous interruptions on its own, each run on a fresh stack: 500 jobs with
# 1, 2 and 4 worker processes, the trust burst (a node named by its jobs' own output only) and
# the worker-kill burst; writes bench/results/burst.md and burst-raw.json.
bench-burst: deps
	$(PY) bench/run.py --burst-suite $(BENCH_ARGS)

# The three restart paths alone, side by side (a job with a spare, requeue, resubmission) with the
# same faults, and the goodput figure: bench/results/restart.md and summary.json (docs/spares.md).
bench-restart: deps
	$(PY) bench/run.py --restart spare,requeue,resubmit $(BENCH_ARGS)

# The node lifecycle alone: fault → back in service, and a healthy node's time out of service
# with and without the lifecycle (bench/results/lifecycle.md; `make bench` adds it to REPORT.md).
bench-lifecycle: deps
	$(PY) bench/run.py --lifecycle-only $(BENCH_ARGS)

# The silent classes alone (a node crash without a line, a silent hang, a network partition),
# against Slurm alone too (whose side waits out SlurmdTimeout: ~25 min in all).
bench-silent: deps
	$(PY) bench/run.py --classes silent_node_crash,silent_hang,network_partition --repeat 3 \
		--results bench/results/silent $(BENCH_ARGS)

# The DDP example with 20 s checkpoint saves and 30 s evaluations for 30 minutes, watched at
# the default settings: every detection is a false alarm (bench/results/false_alarms.md).
bench-false-alarms: deps
	$(PY) bench/false_alarms.py --minutes 30 $(BENCH_ARGS)

# What the slurmd liveness probes cost at 64 nodes × 1 s (bench/results/probe_cost.md).
bench-probe: deps
	$(PY) bench/probe_cost.py --nodes 64 --seconds 60

bench-adapter: deps
	$(PY) bench/adapter.py

bench-recovery: deps
	$(PY) bench/recovery.py

bench-attribution: deps
	$(PY) bench/attribution.py

# Drain vs no drain against NVIDIA's Xid catalogue, code by code (bench/results/xid_agreement.md).
bench-xid: deps
	$(PY) bench/xid_agreement.py

up: deps
	$(VENV)/bin/relaunch dev up

down: deps
	$(VENV)/bin/relaunch dev down

status: deps
	$(VENV)/bin/relaunch dev status

clean: down
	rm -rf .relaunch

# The watcher's log reading at 2,000 job logs and 500 node logs: file ops/s, CPU, detection
# latency (bench/results/log_io.md; BENCH_ARGS="--before REF" compares with commit REF).
.PHONY: bench-logs
bench-logs: deps
	$(PY) bench/log_io.py $(BENCH_ARGS)

# One probe round at 64 to 1,000 nodes: 256 real slurmds, simulated ones beyond
# (bench/results/probe_scale.md).
.PHONY: bench-probe-scale
bench-probe-scale: deps
	$(PY) bench/probe_cost.py --sizes 64,256,500,1000 --real 256 --seconds 20

# Each way to list jobs at 10,000 held jobs on Slurm 22.05 and 24.11: wall, client CPU, bytes,
# slurmctld's RPCs by type per call (bench/results/listing_cost.md; docs/scale.md "Listing").
.PHONY: bench-listing
bench-listing: deps
	$(PY) bench/listing_cost.py $(BENCH_ARGS)
