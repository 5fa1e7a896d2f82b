# eva_export: `make demo` runs the main job, `make test` installs everything and runs the tests.
SHELL := /bin/bash
PY := .venv/bin/python

# Every process that runs rclpy keeps DDS on loopback. The tests pick their own ROS_DOMAIN_ID
# per run (tests/conftest.py; override with EVA_TEST_DOMAIN_ID).
export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST
export RMW_IMPLEMENTATION := rmw_fastrtps_cpp
# A local Ray instance (batch --ray local, tests, bench) binds 127.0.0.1, not the LAN address.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0

.PHONY: setup test test-fast test-serial stress demo console bench clean

setup:
	tools/setup.sh

# The whole suite (what CI runs) on TEST_WORKERS pytest-xdist workers (default 2), each with its
# own ROS domain, whole files per worker; the timing-sensitive files run one after the other
# on one worker (tests/tiers.py). `make test-serial` runs it in one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -rs --durations=15
XDIST := -n $(TEST_WORKERS) --dist loadfile
test: setup
	$(PYTEST) $(XDIST) tests

# The fast tier: every module's logic, without node processes, the browser or the slow tests.
test-fast: setup
	$(PYTEST) $(XDIST) -m "not slow and not ros and not browser" tests

test-serial: setup
	$(PYTEST) tests

# The timing-sensitive tests STRESS_RUNS times each (default 20) beside a CPU hog pinned to one
# core; prints the pass counts (build/stress.md). Not part of `make test`.
stress: setup
	$(PY) tools/stress.py --runs $(or $(STRESS_RUNS),20) $(if $(STRESS_ONLY),--only $(STRESS_ONLY),)

demo: setup
	$(PY) tools/demo.py $(DEMO_ARGS)

# The review console (eva_console) and the nodes it talks to, until Ctrl-C; prints the URL.
# CONSOLE_ARGS="--log-dir OUT/datasets" shows the datasets of a `make demo` run.
console: setup
	$(PY) tools/console.py $(CONSOLE_ARGS)

bench: setup
	$(PY) bench/run_all.py $(if $(QUICK),--quick,)

clean:
	rm -rf build install log .pytest_cache
