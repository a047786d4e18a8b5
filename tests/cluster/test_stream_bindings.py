"""A stream bound to a non-default exchange keeps its bindings through a change of leader
(real etcd, three broker processes, pika, rstream, the ctl command): delete_replica of the
leader turns its stream queue into a proxy of the new leader (stream_stepdown.step_down),
and publishes to the exchange on every node, the old leader's included, still reach the
stream; every confirmed message is read back."""
from __future__ import annotations

import pika
import pytest

from .test_cluster_nodes import eventually
from .test_mirroring_more import start_together
from .test_quorum_replication import ctl
from .test_stream_replication import STREAM, api_stream, logged, rstream_bodies, stream_node

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def publish_via_ex(broker, bodies: list[bytes]) -> None:
    """Through the topic exchange ``ex``, mandatory and confirmed: an unroutable message
    (the binding missing on this node) raises pika's UnroutableError."""
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("ex", "k.x", body, PERSISTENT, mandatory=True)
    finally:
        conn.close()


def routable(broker, name: str) -> None:
    publish_via_ex(broker, [b"probe-" + name.encode()])


@pytest.mark.timeout(240)
def test_a_streams_bindings_survive_its_leaders_step_down(tmp_path, etcd, secret):
    a, b, c = (stream_node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.exchange_declare("ex", "topic", durable=True)
        ch.queue_declare("s", durable=True, arguments=STREAM)
        ch.queue_bind("s", "ex", "k.#")
        conn.close()
        for follower in (b, c):
            eventually(lambda f=follower: logged(f, "replicating from node 'a'"), timeout=30)
        sent: list[bytes] = []
        for name, node in zip("abc", (a, b, c), strict=True):
            # the binding reaches the other nodes through etcd: first publish routed
            eventually(lambda n=node, m=name: routable(n, "before-" + m), timeout=30)
            sent.append(b"probe-before-" + name.encode())
            bodies = [b"before-%s-%03d" % (name.encode(), i) for i in range(20)]
            publish_via_ex(node, bodies)
            sent.extend(bodies)

        r = ctl(b, "delete_replica", "s", "a")
        assert r.returncode == 0, r.stdout + r.stderr
        view: dict = {}

        def elected() -> None:
            view.update(api_stream(b, "s"))
            assert view["members"] == ["b", "c"] and view["leader"] in ("b", "c"), view
        eventually(elected, timeout=60)
        eventually(lambda: logged(a, "steps down as its leader"), timeout=60)
        leader = b if view["leader"] == "b" else c

        for name, node in zip("abc", (a, b, c), strict=True):
            # a publish refused while the proxies are retargeted is not counted
            eventually(lambda n=node, m=name: routable(n, "after-" + m), timeout=30)
            sent.append(b"probe-after-" + name.encode())
            bodies = [b"after-%s-%03d" % (name.encode(), i) for i in range(20)]
            publish_via_ex(node, bodies)
            sent.extend(bodies)
        got = rstream_bodies(leader.stream_port, "s", set(sent))
        assert set(sent) <= set(got), sorted(set(sent) - set(got))[:10]
    finally:
        for broker in (a, b, c):
            broker.stop()


@pytest.mark.timeout(240)
def test_a_deposed_leaders_proxy_keeps_the_streams_bindings(tmp_path, etcd, secret):
    """The leader killed, another elected, the old leader back: its stream queue (recovered
    with its bindings) is dropped and made a proxy (ClusterStore._drop_superseded), which
    routes as the queue did."""
    a, b, c = (stream_node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.exchange_declare("ex", "topic", durable=True)
        ch.queue_declare("s", durable=True, arguments=STREAM)
        ch.queue_bind("s", "ex", "k.#")
        conn.close()
        for follower in (b, c):
            eventually(lambda f=follower: logged(f, "replicating from node 'a'"), timeout=30)
        sent: list[bytes] = []
        eventually(lambda: routable(a, "before-a"), timeout=30)
        sent.append(b"probe-before-a")
        a.kill()
        view: dict = {}

        def elected() -> None:
            view.clear()
            view.update(api_stream(b, "s"))
            assert view["leader"] in ("b", "c"), view
        eventually(elected, timeout=60)
        a.start()
        eventually(lambda: logged(a, "is mastered by node"), timeout=60)
        leader = b if view["leader"] == "b" else c
        for name, node in zip("abc", (a, b, c), strict=True):
            eventually(lambda n=node, m=name: routable(n, "after-" + m), timeout=30)
            sent.append(b"probe-after-" + name.encode())
        got = rstream_bodies(leader.stream_port, "s", set(sent))
        assert set(sent) <= set(got), sorted(set(sent) - set(got))[:10]
    finally:
        for broker in (a, b, c):
            broker.stop()
