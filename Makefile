# eva_export: `make demo` runs the main job, `make test` installs everything and runs the tests.
SHELL := /bin/bash
PY := .venv/bin/python

# Every process that runs rclpy keeps DDS on loopback. The tests pick their own ROS_DOMAIN_ID
# per run (tests/conftest.py; override with EVA_TEST_DOMAIN_ID).
export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST
export RMW_IMPLEMENTATION := rmw_fastrtps_cpp

.PHONY: setup test demo bench clean

setup:
	tools/setup.sh

test: setup
	$(PY) -m pytest -q -rs tests

demo: setup
	@if [ -x tools/demo.sh ] || [ -f tools/demo.sh ]; then bash tools/demo.sh; \
	else echo "tools/demo.sh does not exist yet"; exit 1; fi

bench: setup
	@if [ -f bench/run_all.py ]; then $(PY) bench/run_all.py; \
	else echo "bench/run_all.py does not exist yet"; exit 1; fi

clean:
	rm -rf build install log .pytest_cache
