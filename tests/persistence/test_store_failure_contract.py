"""The write-failure contract on the database stores, as tests/persistence/test_full_disk.py
checks it on a real full disk for the journal and SQLite: a publisher with confirms and a
consumer draining at the same time through a database outage (the connection reset and
refused by ``faultproxy``, the REAL PostgreSQL and MariaDB behind it -- their own disk
cannot be filled here). Nothing confirmed is lost, nothing nacked is ever delivered (to
the running consumer, or after a restart), the consumer's connection is never closed."""
from __future__ import annotations

import time

import pytest

from .test_full_disk import Consumer, Publisher, _check, _drain, _wait
from .test_sql_faults import TARGET, _declare, _via, env  # noqa: F401 (env: a fixture)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_outage_with_a_consumer_never_delivers_a_nack(env, kind):  # noqa: F811
    make, broker = env
    db, proxy = make(kind)
    a = broker(_via(db.url, kind, proxy.port))
    a.start()
    _declare(a.port)
    cons = Consumer(a.port, delay=0.002)
    cons.start()
    pub = Publisher(a.port)
    pub.start()
    _wait(lambda: len(pub.confirmed) >= 20, 30, "confirms before the fault")
    proxy.close_all()
    proxy.refuse()
    _wait(lambda: len(pub.nacked) >= 5, 30, "nacks during the outage")
    time.sleep(1.0)
    proxy.resume()
    n = len(pub.confirmed)
    _wait(lambda: len(pub.confirmed) > n + 5, 30, "confirms after the outage")
    pub.finish()
    cons.idle_for(1.0, 60)
    cons.finish()
    during = list(cons.got)
    a.stop()
    b = broker(db.url, "b")
    b.start()
    after = _drain(b.port)
    print(f"\n[{kind} outage] {len(pub.confirmed)} confirmed, {len(pub.nacked)} nacked, "
          f"{len(pub.doubted)} in doubt; consumer: {len(during)} delivered, closed "
          f"{cons.closed} times; after restart {len(after)}")
    assert cons.closed == 0, "the consumer's connection was closed by the outage"
    _check(pub, during + after)
