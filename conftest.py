"""Shared by the whole repository's pytest run (``tests`` and ``interop-tests`` in one session).

Options every suite may read live here, in the rootdir conftest, so they are known whichever
folders a run collects: ``--broker-url`` (``$BROKER_URL``) makes the interop suite use an
already running broker instead of starting TrioMQ.
"""
from __future__ import annotations

import os
import tempfile

import pytest

# brokers started by tests serve the Stream protocol only on a port they are given: never
# on the CLI's default 5552, which belongs to the machine's RabbitMQ
os.environ.setdefault("TRIOMQ_STREAM_PORT", "0")

try:  # keep hypothesis' example database out of the repository
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "triomq-hypothesis"))
except Exception:  # pragma: no cover
    pass


# Tests `make test-triomq` runs in its second, serial phase (`-m serial`), after the rest
# has run on two pytest-xdist workers: their asserts hold a timed bound (lease takeovers, a
# queue bound while publishers race a consumer, overdue messages delivered within seconds of a
# restart) that a second worker's load can break. Entries are files or `file::test` (all its
# parametrisations); a single test can also carry @pytest.mark.serial.
SERIAL = frozenset({
    "interop-tests/test_flow.py",
    "interop-tests/test_half_messages.py",
    "interop-tests/test_scheduler.py::test_durable_across_restart",
    "tests/persistence/test_sql_faults.py",
    "tests/cluster/test_cluster_nodes.py",
    "tests/cluster/test_coordination.py",
    "tests/cluster/test_failover_clients.py",
    "tests/cluster/test_failover_publish_answer.py",
    "tests/cluster/test_jepsen_mirrored_short.py",
    "tests/cluster/test_jepsen_quorum_short.py",
    "tests/cluster/test_jepsen_short.py",
    "tests/cluster/test_stream_replication.py",
})

# The longest files (minutes each: brokers restarted on every store) go first, so that
# `--dist loadfile` hands them out at the start and the short ones fill in around them,
# instead of one starting last and leaving the other worker idle.
LONG_FILES = (
    "interop-tests/test_durability.py",
    "tests/persistence/test_store_names.py",
    "interop-tests/test_scheduler.py",
    "tests/persistence/test_sql_store.py",
    "tests/audit/test_spark_incomplete.py",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    rank = {}
    for item in items:
        if not item.path.is_relative_to(root):
            continue
        path = item.path.relative_to(root).as_posix()
        test = path + "::" + item.nodeid.split("::", 1)[-1].split("[")[0]
        if path in SERIAL or test in SERIAL:
            item.add_marker(pytest.mark.serial)
        if path in LONG_FILES:
            rank[item.nodeid] = LONG_FILES.index(path)
    # a stable sort: the order within each file, and of all other files, is kept
    items.sort(key=lambda item: rank.get(item.nodeid, len(LONG_FILES)))


def pytest_addoption(parser):
    parser.addoption(
        "--broker-url",
        action="store",
        default=os.environ.get("BROKER_URL") or None,
        help="AMQP URL of an already running broker for interop-tests (default: start TrioMQ "
        "from this repo). Also read from $BROKER_URL.",
    )


# The machine's RabbitMQ (the reference on 127.0.0.1:5672) must never be disturbed by a test;
# it once vanished mid-run. Watch it: the test during which it stops answering is named in
# the summary, so the next run says which one to look at.
_RABBITMQ_WATCH: dict = {"up": None, "lost_during": []}


def _rabbitmq_answers() -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
        return True
    except OSError:
        return False


def pytest_sessionstart(session):
    _RABBITMQ_WATCH["up"] = _rabbitmq_answers()


def pytest_runtest_logfinish(nodeid, location):
    if _RABBITMQ_WATCH["up"] and not _rabbitmq_answers():
        _RABBITMQ_WATCH["up"] = False
        _RABBITMQ_WATCH["lost_during"].append(nodeid)
    elif _RABBITMQ_WATCH["up"] is False and _RABBITMQ_WATCH["lost_during"] and _rabbitmq_answers():
        _RABBITMQ_WATCH["up"] = True


def pytest_terminal_summary(terminalreporter):
    for nodeid in _RABBITMQ_WATCH["lost_during"]:
        terminalreporter.write_line(
            f"WARNING: the machine's RabbitMQ (127.0.0.1:5672) stopped answering during {nodeid}",
            red=True)
    if _RABBITMQ_WATCH["up"] is False and not _RABBITMQ_WATCH["lost_during"]:
        terminalreporter.write_line("note: the machine's RabbitMQ (127.0.0.1:5672) was not "
                                    "answering when the run started")
