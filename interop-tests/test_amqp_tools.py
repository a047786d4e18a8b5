"""rabbitmq-c's command-line tools (Debian amqp-tools) against the broker.

amqp-declare-queue, amqp-publish, amqp-get, amqp-consume and amqp-delete-queue are run as
subprocesses; what they did is checked with pika (and with the raw client where the exact
AMQP field types matter).

Connection options are passed as --server/--port/--vhost/--username/--password: rabbitmq-c
reads the vhost of ``amqp://host:port/`` as "" (not "/"), so the suite's URL is not passed
as --url.  ``amqp-delete-queue -u`` means --if-unused there, so only long options are used.
amqp-publish has no option for correlation-id/message-id; those are covered by the Java
client module.
"""
from __future__ import annotations

import shutil
import subprocess
import time

import pika
import pika.exceptions
import pytest
from helpers import drain, get_one, raw_get, wait_for

TOOLS = ("amqp-publish", "amqp-get", "amqp-consume", "amqp-declare-queue", "amqp-delete-queue")
_missing = [t for t in TOOLS if shutil.which(t) is None]
if _missing:
    pytest.skip(f"amqp-tools not installed (missing {', '.join(_missing)}); `make system-deps` "
                "installs the Debian package", allow_module_level=True)

TOOL_TIMEOUT = 20


@pytest.fixture
def tool(amqp_params):
    """tool("amqp-get", "-q", name, input=b"") -> CompletedProcess (stdout/stderr as bytes)."""
    conn_args = ["--server", amqp_params.host, "--port", str(amqp_params.port),
                 "--vhost", amqp_params.vhost, "--username", amqp_params.username,
                 "--password", amqp_params.password]

    def _run(name, *args, input=b"", timeout=TOOL_TIMEOUT):
        return subprocess.run([name, *conn_args, *args], input=input, capture_output=True,
                              timeout=timeout)

    return _run


@pytest.fixture
def tool_popen(amqp_params):
    """Like ``tool`` but returns a running Popen (stdout/stderr piped); killed at teardown."""
    conn_args = ["--server", amqp_params.host, "--port", str(amqp_params.port),
                 "--vhost", amqp_params.vhost, "--username", amqp_params.username,
                 "--password", amqp_params.password]
    procs = []

    def _start(name, *args):
        p = subprocess.Popen([name, *conn_args, *args], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
        return p

    yield _start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)


def ok(res):
    assert res.returncode == 0, (res.args, res.returncode, res.stdout, res.stderr)
    return res.stdout


def _queue(ch, name):
    """(message_count, consumer_count) of an existing queue via a passive declare."""
    m = ch.queue_declare(name, passive=True).method
    return m.message_count, m.consumer_count


# ---------------------------------------------------------------- declare / delete
def test_declare_queue_then_delete_reports_count(tool, ch, uid, cleanup):
    q = cleanup.queue(uid)
    assert ok(tool("amqp-declare-queue", "-q", q)) == f"{q}\n".encode()
    assert _queue(ch, q) == (0, 0)
    # declaring again is idempotent
    assert ok(tool("amqp-declare-queue", "-q", q)) == f"{q}\n".encode()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, f"m{i}".encode())
    assert _queue(ch, q) == (3, 0)
    # amqp-delete-queue prints the message count from queue.delete-ok
    assert ok(tool("amqp-delete-queue", "-q", q)) == b"3\n"
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(q, passive=True)
    assert ei.value.reply_code == 404


def test_declare_server_named_queue(tool, connect, cleanup):
    out = ok(tool("amqp-declare-queue", "-q", "")).decode().strip()
    assert out, "no server-generated queue name printed"
    q = cleanup.queue(out)
    ch = connect().channel()
    # not exclusive, not auto-delete: it outlives the tool's connection
    assert _queue(ch, q) == (0, 0)
    assert ok(tool("amqp-delete-queue", "-q", q)) == b"0\n"


def test_declare_durable_queue_equivalence(tool, connect, uid, cleanup):
    q = cleanup.queue(uid)
    assert ok(tool("amqp-declare-queue", "--durable", "-q", q)) == f"{q}\n".encode()
    c = connect()
    c.channel().queue_declare(q, durable=True)  # equivalent: fine
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        c.channel().queue_declare(q, durable=False)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED - inequivalent arg 'durable'")
    # and the reverse: a transient queue redeclared durable by the tool fails with 406
    q2 = cleanup.queue(uid + "-transient")
    c.channel().queue_declare(q2)
    res = tool("amqp-declare-queue", "--durable", "-q", q2)
    assert res.returncode != 0
    assert b"406" in res.stderr and b"PRECONDITION_FAILED" in res.stderr, res.stderr


def test_delete_queue_if_empty_and_if_unused(tool, connect, uid, cleanup):
    q = cleanup.queue(uid)
    c = connect()
    ch = c.channel()
    ch.queue_declare(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"keep")
    res = tool("amqp-delete-queue", "--if-empty", "-q", q)
    assert res.returncode != 0
    assert b"406" in res.stderr and b"PRECONDITION_FAILED" in res.stderr, res.stderr
    assert _queue(ch, q) == (1, 0)

    consumer = connect().channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume(q, lambda *a: None)
    wait_for(lambda: _queue(ch, q)[1] == 1, conn=c, msg="consumer registered")
    res = tool("amqp-delete-queue", "--if-unused", "-q", q)
    assert res.returncode != 0
    assert b"406" in res.stderr and b"PRECONDITION_FAILED" in res.stderr, res.stderr
    consumer.connection.close()
    wait_for(lambda: _queue(ch, q) == (1, 0), conn=c, msg="consumer gone, message requeued")
    assert ok(tool("amqp-delete-queue", "--if-unused", "-q", q)) == b"1\n"


def test_delete_missing_queue_is_ok(tool, uid):
    # RabbitMQ 3.x: queue.delete of a missing queue is a no-op answered with message_count 0
    assert ok(tool("amqp-delete-queue", "-q", uid + "-never-declared")) == b"0\n"


# ---------------------------------------------------------------- publish
def test_publish_properties_and_headers_typed(tool, raw_conn, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ok(tool("amqp-publish", "-r", q, "--persistent", "-C", "application/json", "-E", "utf-8",
            "-t", "reply-" + uid, "-H", "x-one: 1", "-H", "x-two:two words", "-H", "x-empty: ",
            "-b", '{"a": 1}'))
    props, body = raw_get(raw_conn, q)
    assert body == b'{"a": 1}'
    assert props == {
        "_body_size": 8,
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "reply_to": "reply-" + uid,
        "delivery_mode": 2,
        # -H values are sent as long strings, exactly as given after the colon and blanks
        "headers": {"x-one": ("S", "1"), "x-two": ("S", "two words"), "x-empty": ("S", "")},
    }


def test_publish_headers_seen_by_pika(tool, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ok(tool("amqp-publish", "-r", q, "-H", "trace: abc-123", "-H", "n: 42", "-b", "hi"))
    ok(tool("amqp-publish", "-e", "", "-r", q, "-b", "plain"))
    (m1, p1, b1), (_, p2, b2) = get_one(ch, q), get_one(ch, q)
    assert (b1, p1.headers, p1.delivery_mode) == (b"hi", {"trace": "abc-123", "n": "42"}, 1)
    assert (m1.exchange, m1.routing_key, m1.redelivered) == ("", q, False)
    # without options amqp-publish only sets delivery-mode 1
    assert (b2, p2.headers, p2.content_type, p2.delivery_mode) == (b"plain", None, None, 1)


def test_publish_binary_body_from_stdin(tool, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    payload = bytes(range(256)) * 600  # 153600 bytes: more than one frame at frame_max 131072
    ok(tool("amqp-publish", "-r", q, input=payload))
    _, _, body = get_one(ch, q)
    assert len(body) == len(payload) and body == payload


def test_publish_empty_bodies(tool, raw_conn, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ok(tool("amqp-publish", "-r", q, input=b""))          # empty stdin
    ok(tool("amqp-publish", "-r", q, "-b", ""))           # empty -b
    ok(tool("amqp-publish", "-r", q, "-b", "after"))
    assert _queue(ch, q) == (3, 0)
    props, body = raw_get(raw_conn, q)
    assert (props["_body_size"], body) == (0, b"")
    msgs = drain(ch, q)
    assert [b for _, _, b in msgs] == [b"", b"after"]


def test_publish_line_buffered_to_exchange(tool, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.queue_bind(q, "amq.topic", routing_key=uid + ".#")
    ok(tool("amqp-publish", "-e", "amq.topic", "-r", uid + ".lines", "-l", input=b"a\nb\n\nc"))
    wait_for(lambda: _queue(ch, q)[0] == 4, conn=ch.connection, msg="4 lines routed")
    msgs = drain(ch, q)
    # one message per line (rabbitmq-c keeps the newline), in order
    assert [b for _, _, b in msgs] == [b"a\n", b"b\n", b"\n", b"c"]
    assert {(m.exchange, m.routing_key) for m, _, _ in msgs} == {("amq.topic", uid + ".lines")}


# ---------------------------------------------------------------- get
def test_get_bodies_and_empty_queue(tool, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"first\x00bin")
    ch.basic_publish("", q, b"")
    ch.basic_publish("", q, b"third")
    assert ok(tool("amqp-get", "-q", q)) == b"first\x00bin"
    assert ok(tool("amqp-get", "-q", q)) == b""
    assert _queue(ch, q) == (1, 0)  # amqp-get acks what it got
    assert ok(tool("amqp-get", "-q", q)) == b"third"
    res = tool("amqp-get", "-q", q)  # basic.get-empty: exit status 2, no output
    assert (res.returncode, res.stdout) == (2, b""), res
    assert _queue(ch, q) == (0, 0)


def test_get_missing_queue_404(tool, uid):
    res = tool("amqp-get", "-q", uid + "-missing")
    assert res.returncode not in (0, 2)
    assert b"404" in res.stderr and b"NOT_FOUND" in res.stderr, res.stderr


# ---------------------------------------------------------------- consume
CAT_FRAMED = ["--", "sh", "-c", 'printf "<"; cat; printf ">\\n"']


def test_consume_count_pipes_each_body(tool, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.confirm_delivery()
    bodies = [b"m0", b"", b"m2 with spaces", b"m3\nline2", b"m4"]
    for b in bodies:
        ch.basic_publish("", q, b)
    out = ok(tool("amqp-consume", "-q", q, "-c", "5", "-p", "2", *CAT_FRAMED))
    assert out == b"".join(b"<" + b + b">\n" for b in bodies)
    # every message was acked: nothing comes back after the tool's connection closed
    assert _queue(ch, q) == (0, 0)
    ch.connection.sleep(0.2)
    assert _queue(ch, q) == (0, 0)


def test_consume_prefetch_limits_unacked(tool_popen, ch, uid, cleanup, tmp_path):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.confirm_delivery()
    for i in range(6):
        ch.basic_publish("", q, f"p{i}".encode())
    gate, out = tmp_path / "gate", tmp_path / "out"
    # each command appends the body and then blocks until the gate file exists, so the first
    # delivery stays unacked; with prefetch 2 the broker may hand out just 2 messages
    script = f'cat >> "{out}"; echo >> "{out}"; while [ ! -e "{gate}" ]; do sleep 0.02; done'
    p = tool_popen("amqp-consume", "-q", q, "-c", "6", "-p", "2", "--", "sh", "-c", script)
    conn = ch.connection
    wait_for(lambda: _queue(ch, q) == (4, 1), conn=conn, msg="2 of 6 messages delivered")
    conn.sleep(0.3)
    assert _queue(ch, q) == (4, 1), "broker delivered more than prefetch-count 2"
    assert out.read_bytes() == b"p0\n"
    gate.touch()
    stdout, stderr = p.communicate(timeout=TOOL_TIMEOUT)
    assert p.returncode == 0, stderr
    assert out.read_bytes() == b"".join(f"p{i}\n".encode() for i in range(6))
    wait_for(lambda: _queue(ch, q) == (0, 0), conn=conn, msg="all acked, consumer gone")


def test_consume_count_stops_and_leaves_rest(tool, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, f"c{i}".encode())
    out = ok(tool("amqp-consume", "-q", q, "-c", "2", "-p", "1", *CAT_FRAMED))
    assert out == b"<c0>\n<c1>\n"
    # anything prefetched but not acked when the tool disconnected is requeued in order
    wait_for(lambda: _queue(ch, q) == (3, 0), conn=ch.connection, msg="3 messages left")
    assert [b for _, _, b in drain(ch, q)] == [b"c2", b"c3", b"c4"]


def test_consume_no_ack(tool, ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, f"n{i}".encode())
    out = ok(tool("amqp-consume", "-q", q, "-A", "-c", "3", *CAT_FRAMED))
    assert out == b"<n0>\n<n1>\n<n2>\n"
    ch.connection.sleep(0.2)
    assert _queue(ch, q) == (0, 0)


def test_consume_declares_and_binds_own_queue(tool_popen, connect, uid):
    # without -q amqp-consume declares a server-named auto-delete queue and binds it
    p = tool_popen("amqp-consume", "-e", "amq.direct", "-r", uid, "-c", "1", *CAT_FRAMED)
    c = connect()
    ch = c.channel()
    ch.confirm_delivery()
    deadline = time.monotonic() + 10
    while True:  # mandatory publish fails with UnroutableError until the binding exists
        try:
            ch.basic_publish("amq.direct", uid, b"bound", mandatory=True)
            break
        except pika.exceptions.UnroutableError:
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "amqp-consume never bound its queue"
            c.sleep(0.05)
    stdout, stderr = p.communicate(timeout=TOOL_TIMEOUT)
    assert (p.returncode, stdout) == (0, b"<bound>\n"), stderr
    # its queue was auto-deleted with the consumer: the key is unroutable again
    wait_for(lambda: _unroutable(ch, uid), conn=c, msg="auto-delete queue removed")


def _unroutable(ch, key):
    try:
        ch.basic_publish("amq.direct", key, b"probe", mandatory=True)
    except pika.exceptions.UnroutableError:
        return True
    return False
