"""Super streams as RabbitMQ lays them out: a durable direct exchange declared with
``x-super-stream: true`` and one stream queue per partition, bound with the partition's
binding key and ``x-stream-partition-order`` (its index). Nothing else marks a super
stream, so one made over AMQP 0-9-1 (exchange, queues and bindings, as
``rabbitmq-streams add_super_stream`` does) is the same as one made by CreateSuperStream,
the management API or ``ctl add_super_stream``.

Routing: AMQP 0-9-1 publishers publish to the exchange (direct routing on the binding
key); Stream-protocol clients hash the routing key themselves (murmur3 over the
partitions in order) or ask Route for a binding key, and publish to the partition.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import errors
from ..queues.stream import StreamQueue

if TYPE_CHECKING:
    from ..vhost import VirtualHost

ORDER_ARG = "x-stream-partition-order"
SUPER_ARG = "x-super-stream"
# each partition is a stream whose files are made on the event loop (2-10 ms each on a
# loaded disk): a super stream of 10,000 held every connection for over a minute, and a
# count of 10^9 in an HTTP body made the name list before anything was checked
MAX_PARTITIONS = 1000


def layout(name: str, partitions: int | None = None,
           binding_keys: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The partitions and binding keys ``rabbitmq-streams add_super_stream`` makes:
    ``--partitions N``: ``name-0`` .. ``name-(N-1)`` bound with ``0`` .. ``N-1``;
    ``--binding-keys a,b``: ``name-a``, ``name-b`` bound with ``a``, ``b``."""
    if (partitions or 0) > MAX_PARTITIONS or len(binding_keys or ()) > MAX_PARTITIONS:
        raise ValueError(f"a super stream has at most {MAX_PARTITIONS} partitions")
    if binding_keys:
        keys = list(binding_keys)
    elif partitions is not None and partitions > 0:
        keys = [str(i) for i in range(partitions)]
    else:
        raise ValueError("a super stream needs at least one partition")
    if len(set(keys)) != len(keys) or any(not k for k in keys):
        raise ValueError("binding keys must be distinct and not empty")
    return [f"{name}-{k}" for k in keys], keys


def declare(vhost: VirtualHost, name: str, partitions: list[str], keys: list[str],
            queue_arguments: dict[str, Any] | None = None) -> None:
    """Exchange, partition streams, bindings; all or nothing (raises the AMQP error of
    the step that failed after undoing the ones done)."""
    if len(partitions) > MAX_PARTITIONS:
        raise errors.precondition_failed("super stream '%s': %d partitions, at most %d",
                                         name, len(partitions), MAX_PARTITIONS)
    made: list = []
    vhost.declare_exchange(name, "direct", durable=True, arguments={SUPER_ARG: True})
    try:
        for order, (part, key) in enumerate(zip(partitions, keys, strict=True)):
            arguments = {**(queue_arguments or {}), "x-queue-type": "stream"}
            made.append(vhost.declare_queue(part, None, durable=True, arguments=arguments))
            vhost.bind(name, made[-1], key, {ORDER_ARG: order})
    except Exception:
        for q in made:
            vhost.delete_queue(q)
        vhost.delete_exchange(name)
        raise


def partitions_of(vhost: VirtualHost, name: str) -> list[tuple[str, str, int]] | None:
    """(stream, binding key, order) of each partition in partition order, or None when
    there is no such exchange."""
    ex = vhost.exchanges.get(name)
    if ex is None:
        return None
    out = []
    for b in ex.bindings.values():
        dest = b.destination
        if isinstance(dest, StreamQueue) and not dest.deleted:
            order = (b.arguments or {}).get(ORDER_ARG)
            out.append((dest.name, b.routing_key, order if isinstance(order, int) else 0))
    out.sort(key=lambda t: (t[2], t[0]))
    return out


def is_super_stream(vhost: VirtualHost, name: str) -> bool:
    ex = vhost.exchanges.get(name)
    return ex is not None and bool((ex.arguments or {}).get(SUPER_ARG))


def route(vhost: VirtualHost, name: str, routing_key: str) -> list[str] | None:
    parts = partitions_of(vhost, name)
    if parts is None:
        return None
    return [p for p, key, _o in parts if key == routing_key]


def partition_index(vhost: VirtualHost, name: str, stream: str) -> int | None:
    """The stream's index among the super stream's partitions (None: not one of them)."""
    for i, (part, _k, _o) in enumerate(partitions_of(vhost, name) or ()):
        if part == stream:
            return i
    return None


def delete(vhost: VirtualHost, name: str) -> list[str]:
    """Delete the exchange and its partition streams; the partitions' names."""
    parts = partitions_of(vhost, name) or []
    vhost.delete_exchange(name)
    for part, _k, _o in parts:
        q = vhost.queues.get(part)
        if isinstance(q, StreamQueue):
            vhost.delete_queue(q)
    return [p for p, _k, _o in parts]
