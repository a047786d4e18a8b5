# TrioMQ developer entry points. Every install step lives here, so a fresh clone needs only
# python3 (>= 3.11) and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 5672
HOST ?= 0.0.0.0
DATA ?= ./data
RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672/

.PHONY: setup run test test-triomq test-rabbitmq bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

## Set up and run the broker (PORT=5673 make run to pick another port).
run: setup
	$(PY) -m broker run --host $(HOST) --port $(PORT) --data-dir $(DATA) $(ARGS)

## Set up and run every test: unit, CLI, storage, scheduler and the interop suite against
## TrioMQ, then the same interop suite against the reference RabbitMQ when one is reachable.
test: setup
	$(MAKE) --no-print-directory test-triomq
	$(MAKE) --no-print-directory test-rabbitmq

# Two runs: both folders have a conftest.py meant for their own tests.
test-triomq: setup
	$(PY) -m pytest -q -p no:cacheprovider tests
	$(PY) -m pytest -q -p no:cacheprovider interop-tests

test-rabbitmq: setup
	@if $(PY) -c "import socket,sys,urllib.parse as u; p=u.urlparse('$(RABBITMQ_URL)'); socket.create_connection((p.hostname, p.port or 5672), 2)" 2>/dev/null; then \
		$(PY) -m pytest -q -p no:cacheprovider interop-tests --broker-url $(RABBITMQ_URL) \
			--ignore=interop-tests/test_durability.py --ignore=interop-tests/test_scheduler.py \
			--ignore=interop-tests/test_retry.py; \
	else echo "RabbitMQ not reachable at $(RABBITMQ_URL): reference run skipped"; fi

bench: setup
	$(PY) -m bench scenarios
