"""The RabbitMQ Java client (Debian librabbitmq-client-java) against the broker.

``java/InteropClient.java`` runs one scenario per JVM (publisher confirms with typed headers,
basicGet, basicConsume with basicQos, mandatory returns, channel errors) and prints one
tab-separated record per line; the tests here parse those records and assert on them, and
check on the wire (raw client) what the Java client published.

The source is compiled once per session with javac into a pytest temporary directory (or,
without javac, run as a single source file by ``java``), never into the repository.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import raw_get

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "java" / "InteropClient.java"
MAIN_CLASS = "InteropClient"
JAVA_DIR = Path("/usr/share/java")
# Debian ships the client as amqp-client.jar; some releases also as rabbitmq-client.jar
CLIENT_JARS = [JAVA_DIR / "rabbitmq-client.jar", JAVA_DIR / "amqp-client.jar"]
SLF4J_JARS = [JAVA_DIR / "slf4j-api.jar", JAVA_DIR / "slf4j-nop.jar"]
RUN_TIMEOUT = 40
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]

_client_jar = next((j for j in CLIENT_JARS if j.is_file()), None)
if shutil.which("java") is None:
    pytest.skip("java is not installed", allow_module_level=True)
if _client_jar is None:
    pytest.skip("RabbitMQ Java client not installed (no /usr/share/java/rabbitmq-client.jar or "
                "amqp-client.jar); `make system-deps` installs librabbitmq-client-java",
                allow_module_level=True)
_missing_slf4j = [str(j) for j in SLF4J_JARS if not j.is_file()]
if _missing_slf4j:
    pytest.skip(f"slf4j jars not installed: {', '.join(_missing_slf4j)}", allow_module_level=True)

CLASSPATH = ":".join(str(j) for j in [_client_jar, *SLF4J_JARS])


@pytest.fixture(scope="session")
def java_cmd(tmp_path_factory):
    """The command prefix that runs InteropClient (compiled once per session when javac exists)."""
    if shutil.which("javac") is None:
        return ["java", *JVM_FLAGS, "-cp", CLASSPATH, str(SOURCE)]
    out = tmp_path_factory.mktemp("java-classes")
    res = subprocess.run(["javac", "-encoding", "UTF-8", "-d", str(out), "-cp", CLASSPATH, str(SOURCE)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"javac failed:\n{res.stdout}\n{res.stderr}"
    return ["java", *JVM_FLAGS, "-cp", f"{out}:{CLASSPATH}", MAIN_CLASS]


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c == "\\" and i + 1 < len(field):
            out.append({"t": "\t", "n": "\n", "\\": "\\"}.get(field[i + 1], field[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Result:
    def __init__(self, stdout: str):
        self.stdout = stdout
        self.rows = [[_unescape(f) for f in line.split("\t")] for line in stdout.splitlines()]

    def all(self, kind):
        return [r[1:] for r in self.rows if r[0] == kind]

    def one(self, kind):
        rows = self.all(kind)
        assert len(rows) == 1, f"expected one {kind!r} record, got {rows}\n{self.stdout}"
        return rows[0]


@pytest.fixture
def java(java_cmd, amqp_params):
    """java(scenario, name, *args) -> Result; fails with the JVM's output unless it exits 0."""

    def _run(scenario, name, *args):
        cmd = [*java_cmd, scenario, amqp_params.host, str(amqp_params.port), amqp_params.vhost,
               amqp_params.username, amqp_params.password, name, *map(str, args)]
        res = subprocess.run(cmd, capture_output=True, timeout=RUN_TIMEOUT)
        stdout = res.stdout.decode("utf-8", "replace")
        assert res.returncode == 0, (f"{scenario} exited {res.returncode}\n--- stdout\n{stdout}\n"
                                     f"--- stderr\n{res.stderr.decode('utf-8', 'replace')}")
        r = Result(stdout)
        assert r.rows and r.rows[-1] == ["done", scenario], stdout
        return r

    return _run


# ---------------------------------------------------------------- confirms + typed headers
UNICODE = "hello \u00fcn\u00efcode \u2713"

# what the Java client decodes each header to after the round trip
JAVA_HEADERS = {
    "A-array": "List[LongString:a,Integer:2,Long:3,Boolean:false,Map{m=LongString:v},"
               "List[Integer:7,LongString:z]]",
    "A-empty": "List[]",
    "D-decimal": "BigDecimal:12.345",
    "F-empty": "Map{}",
    "F-table": "Map{deep=Map{k=Boolean:true},inner=LongString:x,n=Integer:1}",
    "T-time": "Date:1700000000000",
    "V-null": "null",
    "b-byte": "Byte:-5",
    "d-double": "Double:3.25",
    "f-float": "Float:2.5",
    "i-int": "Integer:42",
    "i-neg": "Integer:-7",
    "l-long": "Long:1099511627776",
    "l-neg": "Long:-9223372036854775808",
    "s-empty": "LongString:",
    "s-short": "Short:1234",
    "s-string": "LongString:" + UNICODE,
    "t-false": "Boolean:false",
    "t-true": "Boolean:true",
    "x-bytes": "bytes:000102ff",
}

# the same headers on the wire: (AMQP field type, value) as the Java client encodes them
WIRE_HEADERS = {
    "A-array": ("A", [("S", "a"), ("I", 2), ("l", 3), ("t", False), ("F", {"m": ("S", "v")}),
                      ("A", [("I", 7), ("S", "z")])]),
    "A-empty": ("A", []),
    "D-decimal": ("D", (3, 12345)),
    "F-empty": ("F", {}),
    "F-table": ("F", {"inner": ("S", "x"), "n": ("I", 1), "deep": ("F", {"k": ("t", True)})}),
    "T-time": ("T", 1700000000),
    "V-null": ("V", None),
    "b-byte": ("b", -5),
    "d-double": ("d", 3.25),
    "f-float": ("f", 2.5),
    "i-int": ("I", 42),
    "i-neg": ("I", -7),
    "l-long": ("l", 1 << 40),
    "l-neg": ("l", -(2**63)),
    "s-empty": ("S", ""),
    "s-short": ("s", 1234),
    "s-string": ("S", UNICODE),
    "t-false": ("t", False),
    "t-true": ("t", True),
    "x-bytes": ("x", b"\x00\x01\x02\xff"),
}


def test_java_confirms_and_typed_headers(java, raw_conn, amqp_params, uid, cleanup):
    q = cleanup.queue(uid)
    r = java("headers", q)
    assert r.one("declare-ok") == [q, "0", "0"]
    assert r.one("seqno-before") == ["1"]
    # waitForConfirmsOrDie returned for both publishes; next sequence number is 3
    assert r.one("confirmed") == ["true", "3"]
    assert r.one("get") == ["typed-headers", "1", "false", "", q]
    assert dict(r.all("prop")) == {
        "contentType": "application/octet-stream",
        "contentEncoding": "identity",
        "deliveryMode": "2",
        "priority": "5",
        "correlationId": "corr-" + q,
        "replyTo": "reply-" + q,
        "expiration": "600000",
        "messageId": "msg-1",
        "timestamp": "1600000000000",
        "type": "typed.headers",
        "userId": amqp_params.username,
        "appId": "triomq-interop-java",
    }
    assert dict(r.all("header")) == JAVA_HEADERS
    assert r.one("left") == ["1"]

    # the second copy, read on the wire: every field type kept exactly as the client sent it
    props, body = raw_get(raw_conn, q)
    assert body == b"typed-headers"
    headers = props.pop("headers")
    assert headers == WIRE_HEADERS
    assert props == {
        "_body_size": len(b"typed-headers"),
        "content_type": "application/octet-stream",
        "content_encoding": "identity",
        "delivery_mode": 2,
        "priority": 5,
        "correlation_id": "corr-" + q,
        "reply_to": "reply-" + q,
        "expiration": "600000",
        "message_id": "msg-1",
        "timestamp": 1600000000,
        "type": "typed.headers",
        "user_id": amqp_params.username,
        "app_id": "triomq-interop-java",
    }


# ---------------------------------------------------------------- basicGet
def test_java_basic_get_and_empty_bodies(java, uid, cleanup):
    q = cleanup.queue(uid)
    r = java("get", q)
    assert r.one("get-empty") == ["true"]
    # fields: label, body length, body or content type, message-count, redelivered
    assert r.all("get") == [
        ["1", "0", "", "2", "false"],
        ["1-again", "0", "", "2", "true"],   # basicReject(requeue) puts it back at the head
        ["2", "0", "text/plain", "1", "false"],
        ["3", "5", "three", "0", "false"],
    ]
    assert r.one("get-empty-after") == ["true"]
    assert r.one("left") == ["0"]
    assert r.one("conn-open-at-end") == ["true"]


# ---------------------------------------------------------------- basicConsume + basicQos
@pytest.mark.parametrize("prefetch", [1, 3])
def test_java_consume_with_prefetch(java, uid, cleanup, prefetch):
    q = cleanup.queue(uid)
    n = 8
    r = java("consume", q, n, prefetch)
    assert r.one("consumer-tag") == ["true", "false"]
    # with nothing acked the broker stops at the prefetch count
    assert r.one("stalled-at") == [str(prefetch)]
    assert r.one("max-unacked") == [str(prefetch)]
    assert r.one("delivered-total") == [str(n)]
    expected = []
    for i in range(n):
        body = "" if i == 2 else f"c{i}"
        # delivery tag, body, body length, redelivered, consumer tag matches
        expected.append([str(i + 1), body, str(len(body)), "false", "true"])
    assert r.all("delivery") == expected
    assert r.one("cancel-ok") == ["true"]
    assert r.one("left") == ["0", "0"]


# ---------------------------------------------------------------- mandatory / basic.return
def test_java_mandatory_unroutable_returns(java, uid, cleanup):
    q = cleanup.queue(uid)
    r = java("mandatory", q)
    assert r.all("return") == [
        ["312", "NO_ROUTE", "", q + "-nowhere", "lost-1", "r1", "Map{n=Integer:1}"],
        ["312", "NO_ROUTE", "amq.direct", q + "-unbound", "", "null", "null"],
    ]
    assert r.one("returns-complete") == ["true"]
    # every publish is confirmed with an ack (returned ones too), and the basic.return of a
    # message comes before the ack that covers it
    events = r.one("events")[0].split(",")
    assert not [e for e in events if e.startswith("nack")], events
    acks = [(i, int(e.split(":")[1]), e.split(":")[2] == "true")
            for i, e in enumerate(events) if e.startswith("ack")]
    returns = [i for i, e in enumerate(events) if e == "return"]
    assert len(returns) == 2 and acks, events
    assert max(seq for _, seq, _ in acks) == 3, events
    for seq, ret_pos in enumerate(returns, start=1):
        covering = [pos for pos, s, multiple in acks if s == seq or (multiple and s > seq)]
        assert covering and min(covering) > ret_pos, events
    assert r.one("routed") == ["kept", "0"]


# ---------------------------------------------------------------- channel errors
def test_java_channel_errors_keep_connection_usable(java, amqp_params, uid, cleanup):
    q = cleanup.queue(uid)
    cleanup.exchange(uid + "-ex")
    r = java("channel-error", q)
    vhost = amqp_params.vhost
    # fields: scope, hard error, code, text, class id, method id
    assert r.one("error1") == ["channel", "false", "404",
                               f"NOT_FOUND - no queue '{q}-missing' in vhost '{vhost}'", "50", "10"]
    e2 = r.one("error2")
    assert e2[:3] == ["channel", "false", "406"] and e2[4:] == ["40", "10"], e2
    assert e2[3].startswith(f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{uid}-ex'"), e2
    assert r.one("error3") == ["channel", "false", "406",
                               "PRECONDITION_FAILED - unknown delivery tag 999", "60", "80"]
    # each error closed its channel only
    for label in ("error1", "error2", "error3"):
        assert r.one(label + "-state") == ["false", "true"], label
    assert r.one("new-channel") == ["true", "true"]
    assert r.one("recovered") == ["after-errors"]
    assert r.one("conn-open-at-end") == ["true"]


# ---------------------------------------------------------------- direct reply-to
def test_java_direct_reply_to(java, uid):
    r = java("direct-reply-to", uid)
    assert r.one("declare-ok") == ["amq.rabbitmq.reply-to", "0", "1"]
    assert [row[0] for row in r.all("rpc-reply")] == ["RPC-0", "RPC-1", "RPC-2"]
    assert r.all("spring-reply") == [["spring-0", "SPRING-0"], ["spring-1", "SPRING-1"]]
    names = [row[0] for row in r.all("server-reply-to")]
    assert len(names) == 5 and all(n.startswith("amq.rabbitmq.reply-to.") for n in names)
    # RpcClient's channel keeps one name; each Spring-style call consumes anew: a new name
    assert len(set(names[:3])) == 1 and len(set(names)) == 3
    assert r.one("conn-open-at-end") == ["true"]
