# TrioMQ developer entry points. Every install step lives here, so a fresh clone needs only
# python3 (>= 3.11) and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 5672
HOST ?= 0.0.0.0
DATA ?= ./data
RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672/

.PHONY: setup system-deps run cluster lint test test-triomq test-triomq-parallel test-triomq-serial \
	test-pure test-rabbitmq test-slow bench

$(VENV)/.installed: pyproject.toml setup.py broker/audit/_hooks.c
	@echo "Setting up $(VENV): TrioMQ with its test and audit tools (pytest, client libraries, PySpark); a few minutes the first time"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# The AMQP codec's compiled build (broker/amqp/builds.py): Cython extension modules from the same
# .py files, rebuilt when one changes. Without a C compiler the pure modules run (slower).
AMQP_COMPILED := $(addprefix broker/amqp/,fields.py spec.py codec.py output.py connection.py)
$(VENV)/.compiled: $(VENV)/.installed setup.py $(AMQP_COMPILED)
	$(PY) setup.py -q build_ext --inplace >/dev/null || echo "no C compiler: the pure-Python AMQP codec runs"
	touch $@

setup: $(VENV)/.installed $(VENV)/.compiled

# System packages the tests drive: rabbitmq-c's command-line tools, the RabbitMQ Java client (Java 17
# is on the machine), Chromium for the web console's browser tests, etcd for the cluster tests and
# Prometheus for the Grafana-dashboard test (which runs a private one; the package's own service is not
# needed), Qpid Proton's C++ library and headers (and g++) for the AMQP 1.0 C++ client test.
# Installed with apt when missing (CI runs as root).
SYSTEM_TEST_PACKAGES := amqp-tools librabbitmq-client-java chromium etcd-server etcd-client prometheus \
	libqpid-proton-cpp12-dev g++
system-deps:
	@if ! command -v amqp-publish >/dev/null || ! command -v chromium >/dev/null || ! command -v etcd >/dev/null \
			|| ! command -v prometheus >/dev/null || ! command -v g++ >/dev/null \
			|| [ ! -f /usr/include/proton/messaging_handler.hpp ] \
			|| { [ ! -f /usr/share/java/amqp-client.jar ] && [ ! -f /usr/share/java/rabbitmq-client.jar ]; }; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(SYSTEM_TEST_PACKAGES) >/dev/null; \
	fi

## Set up and run the broker (PORT=5673 make run to pick another port).
run: setup
	@echo "TrioMQ: AMQP on $(HOST):$(PORT), data in $(DATA), the management HTTP API and console $(if $(findstring --http-port,$(ARGS)),on the --http-port ARGS gives,on port 15672)"
	@echo "        (more options through ARGS, e.g. make run ARGS='--http-port 15673 --mqtt-port 1883'; python -m broker run --help)"
	$(PY) -m broker run --host $(HOST) --port $(PORT) --data-dir $(DATA) $(ARGS)

## Start a private etcd and a local 3-node cluster (Ctrl-C stops it); AMQP on PORT, PORT+1, PORT+2,
## each node's management API on PORT+10000.. (CLUSTER_HTTP_PORT=N picks the first one).
cluster: setup system-deps
	$(PY) -m broker.cluster.local --nodes 3 --port $(PORT) --dir $(DATA)-cluster \
		$(if $(CLUSTER_HTTP_PORT),--http-port $(CLUSTER_HTTP_PORT))

## Set up and run every test: lint (ruff, mypy), unit, CLI, storage, scheduler and the interop suite against
## TrioMQ, then the same interop suite against the reference RabbitMQ when one is reachable.
## The reference run stays after the TrioMQ suite: beside its parallel phase it saved minutes,
## but a TrioMQ kill -9 test in it failed there once (docs/performance.md, "CI run time").
test: setup system-deps
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory test-triomq
	$(MAKE) --no-print-directory test-pure
	$(MAKE) --no-print-directory test-rabbitmq

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m tools.check_docs

# Unit and component tests (tests/) and the interop suite against a TrioMQ subprocess it
# starts itself, in two phases: first everything but the `serial` tests on PYTEST_JOBS
# pytest-xdist workers (each test file whole on one worker), then the `serial` ones (timed
# asserts a second worker's load can break: SERIAL in conftest.py) alone.
# PYTEST_JOBS=1 runs the first phase without xdist. Exit status 5 (no test selected) is a pass.
PYTEST_JOBS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider
test-triomq: setup
	@rc=0; \
	$(MAKE) --no-print-directory test-triomq-parallel || rc=1; \
	$(MAKE) --no-print-directory test-triomq-serial || rc=1; \
	exit $$rc

test-triomq-parallel: setup
	$(PYTEST) --durations=30 -m "not slow and not serial" \
		$(if $(filter-out 0 1,$(PYTEST_JOBS)),-n $(PYTEST_JOBS) --dist loadfile) tests interop-tests \
		|| [ $$? = 5 ]

test-triomq-serial: setup
	$(PYTEST) --durations=20 -m "not slow and serial" tests interop-tests || [ $$? = 5 ]

## The pure-Python AMQP codec, the reference of the compiled one (TRIOMQ_PURE=1, broker/amqp/builds.py):
## its own tests and the AMQP 0-9-1 interop tests against a broker running it (the whole suite
## runs on the compiled build above; both would not fit CI's budget: docs/performance.md).
PURE_INTEROP := $(addprefix interop-tests/,test_amqp_tools.py test_basic.py test_bad_input.py \
	test_deep_headers.py test_large_messages.py)
test-pure: setup
	TRIOMQ_PURE=1 $(PYTEST) -m "not slow" $(if $(filter-out 0 1,$(PYTEST_JOBS)),-n $(PYTEST_JOBS) --dist loadfile) \
		tests/amqp $(PURE_INTEROP) || [ $$? = 5 ]

## The tests marked slow (left out of `make test` for CI's 40-minute budget).
test-slow: setup
	$(PY) -m pytest -q -p no:cacheprovider -m slow tests interop-tests

test-rabbitmq: setup
	@if $(PY) -c "import socket,sys,urllib.parse as u; p=u.urlparse('$(RABBITMQ_URL)'); socket.create_connection((p.hostname, p.port or 5672), 2)" 2>/dev/null; then \
		$(PY) -m pytest -q -p no:cacheprovider interop-tests --broker-url $(RABBITMQ_URL) \
			--ignore=interop-tests/test_durability.py --ignore=interop-tests/test_scheduler.py \
			--ignore=interop-tests/test_retry.py; \
	else echo "RabbitMQ not reachable at $(RABBITMQ_URL): reference run skipped"; fi

bench: setup
	$(PY) -m bench scenarios
