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
