"""Every audit test runs on both sets of hooks: the C ones (``broker/audit/_hooks.c``) and
their Python reference (``hooks.PyHooks``), through ``TRIOMQ_AUDIT_PYTHON``, which a trail
reads when its broker starts (in-process brokers and subprocess brokers alike).

The Spark-heavy modules take minutes and go through the same hooks as the others: they run
once, on the hooks the environment chooses. ``test_hooks_accel`` and the hypothesis test
call both classes directly."""
from __future__ import annotations

import pytest

from broker.audit import hooks

ONE_BUILD = {"test_e2e", "test_spark_incomplete", "test_spark_shares", "test_spark_streams",
             "test_hooks_accel", "test_hooks_equal"}


def pytest_generate_tests(metafunc):
    name = metafunc.module.__name__.rsplit(".", 1)[-1]
    if "audit_hooks" in metafunc.fixturenames and name not in ONE_BUILD:
        metafunc.parametrize("audit_hooks", ["c", "python"], indirect=True)


@pytest.fixture(autouse=True)
def audit_hooks(request, monkeypatch):
    kind = getattr(request, "param", None)
    if kind == "python":
        monkeypatch.setenv("TRIOMQ_AUDIT_PYTHON", "1")
    elif kind == "c":
        if hooks.CHooks is hooks.PyHooks:
            pytest.skip("the C hooks are not built (pip install -e . with a C compiler)")
        monkeypatch.delenv("TRIOMQ_AUDIT_PYTHON", raising=False)
    return kind
