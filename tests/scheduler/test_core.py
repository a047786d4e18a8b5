"""The scheduler's heap with a fake wall clock: order, precision, removal, recovery."""
import random

from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.message import Message
from broker.persistence.base import DURABLE, READS_BACK, Store
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue
from broker.scheduler.core import INTERNAL_QUEUE, Scheduler
from broker.scheduler.spec import Schedule


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


class FakeStore(Store):
    """Records what the scheduler asks a real store to do."""

    capabilities = frozenset({DURABLE})

    def __init__(self):
        self.live = {}

    def save_queue(self, vhost, queue):
        pass

    def enqueue(self, queue, entry):
        self.live[entry.seq] = entry

    def remove(self, queue, entry):
        del self.live[entry.seq]

    def when_durable(self, cb):
        cb()


def make(clock, store=None):
    b = Broker()
    s = Scheduler(b.services, clock=clock)
    v = b.vhosts["/"]
    v.store = store
    q = Queue(v, "out", opts=parse_queue_arguments({}))
    v.add_queue(q)
    return b, s, v, q


def msg(body, headers=None, rk="out", persistent=False):
    props = {"headers": dict(headers or {})}
    if persistent:
        props["delivery_mode"] = 2
    return Message("", rk, encode_properties(props), props, body)


def drain(q):
    out = []
    while len(q.ready):
        out.append(q.ready.popleft().message)
    return out


def test_fires_in_due_order_never_early():
    clock = Clock()
    b, s, v, q = make(clock)
    delays = list(range(1, 500))
    random.Random(1).shuffle(delays)
    for d in delays:
        s.schedule(v, msg(str(d).encode()), Schedule("amq", delay=d))
    got = []
    for step in range(0, 501):
        clock.t = 1_000_000.0 + step / 1000.0
        s.run_due()
        for m in drain(q):
            assert int(m.body) <= step  # never early
            got.append(int(m.body))
            assert int(m.body) == step  # and not late when run every ms
    assert got == sorted(delays)
    assert s.items == {}


def test_periodic_item_keeps_id_and_strips_state_headers():
    clock = Clock()
    b, s, v, q = make(clock)
    item = s.schedule(v, msg(b"p", {"AMQ_SCHEDULED_DELAY": 10}),
                      Schedule("amq", delay=10, period=5, repeat=2))
    sid = item.sid
    for t in (0.010, 0.015, 0.020):
        clock.t += 0.005 if t > 0.010 else 0.010
        assert s.run_due() == 1
        (m,) = drain(q)
        assert not any(k.startswith("x-triomq") for k in m.headers)
        assert m.headers["AMQ_SCHEDULED_DELAY"] == 10
        if t < 0.020:
            assert sid in s.items
    assert s.items == {}


def test_remove_and_remove_all():
    clock = Clock()
    b, s, v, q = make(clock)
    items = [s.schedule(v, msg(b"%d" % i), Schedule("amq", delay=100)) for i in range(10)]
    assert s.remove(items[3].sid)
    assert not s.remove(items[3].sid)
    assert s.stats()["pending"] == 9
    assert s.remove_all() == 9
    clock.t += 1
    assert s.run_due() == 0 and drain(q) == []


def test_batch_limit_bounds_work_per_callback():
    clock = Clock()
    b, s, v, q = make(clock)
    for _i in range(5000):
        s.schedule(v, msg(b"x"), Schedule("amq", delay=1))
    clock.t += 1
    assert s.run_due(limit=2000) == 2000
    assert s.run_due(limit=2000) == 2000
    assert s.run_due(limit=2000) == 1000


def test_recovery_rebuilds_heap_and_dedups_half_written_occurrence():
    """Entries as a store would hand them back: the internal queue with ready entries."""
    clock = Clock()
    store = FakeStore()
    b, s, v, q = make(clock, store)
    item = s.schedule(v, msg(b"p", persistent=True), Schedule("amq", delay=10, period=10, repeat=5))
    other = s.schedule(v, msg(b"o", {"x-delay": 50}, persistent=True), Schedule("delay", delay=50))
    first_entry = item.entry
    assert set(store.live) == {first_entry.seq, other.entry.seq}
    clock.t += 0.010
    s.run_due()
    drain(q)
    second_entry = item.entry
    assert set(store.live) == {second_entry.seq, other.entry.seq}  # next written, fired removed
    assert sorted(e.seq for e in v.queues[INTERNAL_QUEUE].ready) == sorted(store.live)
    # simulate a crash after "write next" but before "remove fired": both stored
    b2, s2, v2, q2 = make(clock, FakeStore())
    rq = s2.new_queue(v2)  # as recovery recreates it (the queue-variant factory)
    v2.add_queue(rq, persist=False)
    for e in (first_entry, other.entry, second_entry):
        v2.store.live[e.seq] = e
    for e in (first_entry, other.entry, second_entry):
        rq.enqueue(e.message, entry=e)  # the store hands its entries back
    assert s2.recovered() == 2
    assert set(s2.items) == {item.sid, other.sid}
    assert s2.items[item.sid].entry is second_entry
    assert v2.queues[INTERNAL_QUEUE].message_count == 0  # view: nothing to dispatch
    clock.t += 1.0  # overdue: fire at once
    s2.run_due()
    delivered = drain(q2)
    bodies = [m.body for m in delivered]
    assert [m.headers["x-delay"] for m in delivered if m.body == b"o"] == [-50]
    assert not any(k.startswith("x-triomq") for m in delivered for k in m.headers)
    assert bodies.count(b"o") == 1
    # 6 occurrences in all: 1 fired before the "crash", the 5 overdue ones now, none twice
    assert bodies.count(b"p") == 5
    assert s2.items == {}


def test_timer_integration_arms_broker_timer():
    b = Broker()
    s = b.scheduler
    v = b.vhosts["/"]
    q = Queue(v, "out", opts=parse_queue_arguments({}))
    v.add_queue(q)
    s.schedule(v, msg(b"x"), Schedule("amq", delay=20))
    deadline = b.timers.next_deadline()
    assert deadline is not None and deadline >= b.timers.now() + 0.019


def test_negate_x_delay_patch_matches_reencoding():
    from broker.amqp.fields import decode_properties
    from broker.scheduler.packing import negate_x_delay
    for value in (5, 300, 70000, 2**40):
        props = {"headers": {"a": b"b", "x-delay": value, "z": 1}, "delivery_mode": 2}
        raw = encode_properties(props)
        patched = negate_x_delay(raw, value)
        assert decode_properties(patched)["headers"]["x-delay"] == -value
        assert decode_properties(patched)["headers"]["z"] == 1
    assert negate_x_delay(encode_properties({"headers": {"x-delay": b"300"}}), 300) is None


def test_unpersisted_items_deliver_original_properties():
    clock = Clock()
    b, s, v, q = make(clock)
    s.schedule(v, msg(b"d", {"x-delay": 20, "k": b"v"}), Schedule("delay", delay=20))
    clock.t += 0.02
    s.run_due()
    (m,) = drain(q)
    assert m.headers == {"x-delay": -20, "k": b"v"}


def test_scheduled_queue_is_a_variant_with_its_own_store():
    from broker.queues.internal import SYSTEM_OWNER
    from broker.scheduler import ScheduledQueue
    from broker.scheduler.slots import SlotTable
    clock = Clock()
    store = FakeStore()
    b, s, v, q = make(clock, store)
    s.schedule(v, msg(b"x", persistent=True), Schedule("amq", delay=10))
    iq = v.queues[INTERNAL_QUEUE]
    assert isinstance(iq, ScheduledQueue) and isinstance(iq.ready, SlotTable)
    assert iq.exclusive_owner is SYSTEM_OWNER and iq.store is store
    table = iq.ready
    iq.attach_store(store)  # a (paging) store never replaces the slot table
    assert iq.ready is table and iq.message_count == 0
    assert iq.opts.max_length == 0 and iq.opts.overflow == "reject-publish"
    assert iq.enqueue(msg(b"routed here by name")) is False  # publishes are refused
    assert len(store.live) == 1 and s.stats()["pending"] == 1


class ReadBackStore(FakeStore):
    """A store that gives entries a location and reads messages back (as the journal)."""

    capabilities = frozenset({DURABLE, READS_BACK})

    def __init__(self):
        super().__init__()
        self.messages = {}

    def enqueue(self, queue, entry):
        super().enqueue(queue, entry)
        entry.loc = 1000 + entry.seq
        self.messages[entry.loc] = entry.message

    def read_message(self, loc):
        return self.messages[loc]

    def release_read_maps(self):
        pass


def test_restore_from_a_paged_index_reads_each_message_back():
    from array import array
    clock = Clock()
    store = ReadBackStore()
    b, s, v, q = make(clock, store)
    a = s.schedule(v, msg(b"a", persistent=True), Schedule("amq", delay=10))
    c = s.schedule(v, msg(b"c", {"x-delay": 20}, persistent=True), Schedule("delay", delay=20))
    assert not v.queues[INTERNAL_QUEUE].ready.held  # index only
    seqs = array("q", sorted(store.live))
    locs = array("q", [1000 + seq for seq in seqs])
    b2, s2, v2, q2 = make(clock, store)
    rq = s2.new_queue(v2)
    v2.add_queue(rq, persist=False)
    assert rq.restores_paged
    assert rq.restore(paged=(seqs, locs, None, None, None)) == 2
    assert s2.recovered() == 2 and set(s2.items) == {a.sid, c.sid}
    assert not rq.ready.held
    clock.t += 1.0
    assert s2.run_due() == 2
    assert [m.body for m in drain(q2)] == [b"a", b"c"] and store.live == {}
