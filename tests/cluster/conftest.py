from __future__ import annotations

import pytest

from .etcdproc import ETCD, EtcdProc


@pytest.fixture
def etcd(tmp_path):
    import os
    if not os.path.exists(ETCD):
        pytest.skip("etcd is not installed (make system-deps)")
    proc = EtcdProc(tmp_path / "etcd").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def secret(tmp_path):
    """A cluster secret file (16 bytes or more, like an Erlang cookie)."""
    path = tmp_path / "secret"
    path.write_text("0123456789abcdef-cluster-secret\n")
    return path
