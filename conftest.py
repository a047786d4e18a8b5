"""Shared by the whole repository's pytest run (``tests`` and ``interop-tests`` in one session).

Options every suite may read live here, in the rootdir conftest, so they are known whichever
folders a run collects: ``--broker-url`` (``$BROKER_URL``) makes the interop suite use an
already running broker instead of starting TrioMQ.
"""
from __future__ import annotations

import os
import tempfile

try:  # keep hypothesis' example database out of the repository
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "triomq-hypothesis"))
except Exception:  # pragma: no cover
    pass


def pytest_addoption(parser):
    parser.addoption(
        "--broker-url",
        action="store",
        default=os.environ.get("BROKER_URL") or None,
        help="AMQP URL of an already running broker for interop-tests (default: start TrioMQ "
        "from this repo). Also read from $BROKER_URL.",
    )
