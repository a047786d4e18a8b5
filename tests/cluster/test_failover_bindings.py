"""A mirrored classic queue and a quorum queue bound to a non-default exchange keep their
bindings through a failover (real etcd, three broker processes, pika): the master/leader
killed with -9 (or paused), the queue promoted on another node (MirrorManager.promote swaps
the node's proxy for the promoted queue), publishes to the topic exchange on every surviving
node are routed (mandatory, no 312 NO_ROUTE) and confirmed, and every one is consumed back;
so are those through the old master once it is back, restarted or resumed (a proxy of the
new master now)."""
from __future__ import annotations

import signal

import pytest

from .test_cluster_nodes import eventually, node
from .test_mirroring_more import drain, put_policy, start_together, wait_in_sync
from .test_quorum_replication import QQ, wait_view
from .test_stream_bindings import publish_via_ex, routable


def _bound_queue(a, etcd, name: str, arguments: dict) -> None:
    conn = a.connect()
    ch = conn.channel()
    ch.exchange_declare("ex", "topic", durable=True)
    ch.queue_declare(name, durable=True, arguments=arguments)
    ch.queue_bind(name, "ex", "k.#")
    conn.close()
    wait_in_sync(etcd, name, ["b", "c"], timeout=30)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind,fault", [("mirrored", "kill9"), ("quorum", "kill9"),
                                        ("quorum", "sigstop")])
def test_bindings_to_a_topic_exchange_survive_a_failover(tmp_path, etcd, secret, kind, fault):
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        if kind == "mirrored":
            put_policy(a, "ha", "^ha\\.", {"ha-mode": "all"})
            name, arguments = "ha.q", {}
        else:
            name, arguments = "qq", QQ
        _bound_queue(a, etcd, name, arguments)
        sent: list[bytes] = []
        for n, broker in zip("abc", (a, b, c), strict=True):
            # the binding reaches every node through etcd: its first publish routed
            eventually(lambda br=broker, m=n: routable(br, "before-" + m), timeout=30)
            sent.append(b"probe-before-" + n.encode())
        if fault == "kill9":
            a.kill()
        else:
            a.proc.send_signal(signal.SIGSTOP)
        view = wait_view(etcd, name, lambda v: v["master"] in ("b", "c"), timeout=30)
        promoted = b if view["master"] == "b" else c
        other = c if promoted is b else b
        for n, broker in (("promoted", promoted), ("other", other)):
            # a publish refused while the proxies follow the new master is not counted
            eventually(lambda br=broker, m=n: routable(br, "after-" + m), timeout=30)
            sent.append(b"probe-after-" + n.encode())
            bodies = [b"after-%s-%03d" % (n.encode(), i) for i in range(20)]
            publish_via_ex(broker, bodies)  # UnroutableError on a 312
            sent.extend(bodies)
        got: list[bytes] = []

        def consumed() -> None:
            got.extend(drain(other, name, timeout=1))
            assert set(sent) <= set(got), sorted(set(sent) - set(got))[:10]
        eventually(consumed, timeout=30)

        # the old master back (restarted, or resumed and deposed): its copy is dropped for
        # a proxy of the new master (ClusterStore._drop_superseded), which routes as the
        # queue did
        if fault == "kill9":
            a.start()
        else:
            a.proc.send_signal(signal.SIGCONT)
        eventually(lambda: routable(a, "after-restart"), timeout=60)
        sent.append(b"probe-after-restart")
        publish_via_ex(a, [b"after-restart-%03d" % i for i in range(20)])
        sent.extend(b"after-restart-%03d" % i for i in range(20))
        eventually(consumed, timeout=30)
    finally:
        for broker in (a, b, c):
            broker.stop()
