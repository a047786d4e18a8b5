"""MQTT over WebSockets (ws and wss, path /ws, subprotocol mqtt) against a TrioMQ subprocess:
paho's websocket transport, a real browser page (Debian's chromium via playwright) whose
JavaScript speaks MQTT bytes over a WebSocket, and raw sockets for bad upgrade requests,
malformed and oversized frames and frames split across reads. TrioMQ only: neither the
RabbitMQ (no Web MQTT plugin) nor the Mosquitto (no websockets listener) here serve it."""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import uuid

import httpx
import paho.mqtt.client as paho
import pytest
from brokerproc import BrokerProc, free_port
from paho.mqtt.enums import CallbackAPIVersion
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Pong,
    RejectConnection,
    Request,
)

from broker.mqtt import codec as m

pytestmark = pytest.mark.timeout(90)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MAX_MESSAGE = 1024 * 1024  # the broker's --max-message-size here: MQTT packets are bounded by it


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no Web MQTT plugin")
    yield
    while _open_clients:
        _open_clients.pop().close()


_open_clients: list = []


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def mq(tmp_path_factory, external_broker, tls_files):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no Web MQTT plugin")
    cert, key = tls_files
    ws_port, wss_port = free_port(), free_port()
    proc = BrokerProc(tmp_path_factory.mktemp("mqttws") / "data", store="memory", mqtt=True,
                      http=True,
                      extra=["--mqtt-ws-port", str(ws_port), "--mqtt-wss-port", str(wss_port),
                             "--tls-cert", str(cert), "--tls-key", str(key),
                             "--max-message-size", str(MAX_MESSAGE)],
                      wait_ports=[ws_port, wss_port])
    proc.ws_port, proc.wss_port = ws_port, wss_port
    proc.start()
    yield proc
    proc.stop()


def uid() -> str:
    return "w-" + uuid.uuid4().hex[:10]


class Paho:
    """A paho client on its own network thread (tcp or websockets); ``got`` collects
    (topic, payload, qos)."""

    def __init__(self, port, transport="tcp", tls_ca=None, protocol=paho.MQTTv311):
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=uid(), transport=transport,
                             protocol=protocol)
        if transport == "websockets":
            self.c.ws_set_options(path="/ws")
        if tls_ca is not None:
            self.c.tls_set(ca_certs=str(tls_ca))
        self.got: list = []
        self.connected = threading.Event()
        self.rc = None
        self.c.on_message = lambda c, u, msg: self.got.append((msg.topic, msg.payload, msg.qos))

        def on_connect(c, u, flags, rc, props):
            self.rc = rc
            self.connected.set()
        self.c.on_connect = on_connect
        self.c.connect("127.0.0.1", port, keepalive=30)
        self.c.loop_start()
        _open_clients.append(self)
        assert self.connected.wait(20), "no CONNACK"
        assert self.rc == 0

    def subscribe(self, *topics):
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe(list(topics))
        assert done.wait(20), "no SUBACK"

    def publish(self, topic, payload, qos=0):
        info = self.c.publish(topic, payload, qos=qos)
        if qos:
            info.wait_for_publish(20)
            assert info.is_published()

    def wait_for(self, n, within=20.0):
        deadline = time.monotonic() + within
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.got

    def close(self):
        if self in _open_clients:
            _open_clients.remove(self)
        self.c.disconnect()
        self.c.loop_stop()


# ---- paho's websocket transport ---------------------------------------------------------

@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv31])
def test_paho_websockets_with_tcp_clients(mq, protocol):
    """Subscriber over WebSockets, publisher over TCP and the other way round, QoS 0 and 1,
    a payload larger than one WebSocket frame header's short forms (64 KiB + 1)."""
    t = uid()
    ws = Paho(mq.ws_port, transport="websockets", protocol=protocol)
    tcp = Paho(mq.mqtt_port)
    ws.subscribe((f"{t}/down/#", 1))
    tcp.subscribe((f"{t}/up", 1))
    big = os.urandom(65537)
    tcp.publish(f"{t}/down/a", b"zero", qos=0)
    tcp.publish(f"{t}/down/b", big, qos=1)
    got = ws.wait_for(2)
    assert sorted(got) == sorted([(f"{t}/down/a", b"zero", 0), (f"{t}/down/b", big, 1)])
    for i in range(20):
        ws.publish(f"{t}/up", b"m%d" % i, qos=1)
    assert [p for _, p, _ in tcp.wait_for(20)] == [b"m%d" % i for i in range(20)]


def test_paho_secure_websockets(mq, tls_files):
    cert, _ = tls_files
    t = uid()
    wss = Paho(mq.wss_port, transport="websockets", tls_ca=cert)
    wss.subscribe((t, 1))
    Paho(mq.mqtt_port).publish(t, b"over wss", qos=1)
    assert wss.wait_for(1) == [(t, b"over wss", 1)]
    wss.publish(t, b"echo", qos=1)
    assert wss.wait_for(2)[1] == (t, b"echo", 1)


def test_listed_as_web_mqtt_connections(mq, tls_files):
    """The management API lists them as RabbitMQ lists Web MQTT connections, on their
    listener's port, ssl for wss."""
    cert, _ = tls_files
    ws = Paho(mq.ws_port, transport="websockets")
    wss = Paho(mq.wss_port, transport="websockets", tls_ca=cert)
    tcp = Paho(mq.mqtt_port)
    ids = {c._client_id.decode(): c for c in (ws.c, wss.c, tcp.c)}
    http = httpx.Client(base_url=mq.http_url, auth=("guest", "guest"), timeout=20)
    deadline = time.monotonic() + 30
    while True:  # the HTTP listener may come up just after the others
        try:
            listed = http.get("/api/connections").json()
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    mine = {c["client_properties"]["client_id"]: c for c in listed
            if c["client_properties"].get("client_id") in ids}
    got = {cid: (c["protocol"], c["port"], c["ssl"]) for cid, c in mine.items()}
    assert got == {ws.c._client_id.decode(): ("Web MQTT 3.1.1", mq.ws_port, False),
                   wss.c._client_id.decode(): ("Web MQTT 3.1.1", mq.wss_port, True),
                   tcp.c._client_id.decode(): ("MQTT 3.1.1", mq.mqtt_port, False)}


# ---- a browser page ---------------------------------------------------------------------

# A minimal MQTT 3.1.1 client in the page: CONNECT, SUBSCRIBE, PUBACK for what it receives,
# then it publishes each message back on <topic>/out at QoS 1 and disconnects after `count`.
PAGE_JS = r"""
async ({url, topic, clientId, count}) => {
  const enc = new TextEncoder();
  const str = s => { const b = enc.encode(s); return [b.length >> 8, b.length & 255, ...b]; };
  const packet = (first, body) => {
    const head = [first]; let n = body.length;
    do { let d = n % 128; n = Math.floor(n / 128); if (n > 0) d |= 128; head.push(d); } while (n > 0);
    const out = new Uint8Array(head.length + body.length);
    out.set(head); out.set(body, head.length); return out;
  };
  let buf = new Uint8Array(0); const queue = []; let wake = null;
  const parse = () => {
    for (;;) {
      let i = 1, mult = 1, len = 0, d;
      do { if (i >= buf.length) return; d = buf[i++]; len += (d & 127) * mult; mult *= 128; } while (d & 128);
      if (buf.length < i + len) return;
      queue.push({type: buf[0], body: buf.slice(i, i + len)});
      buf = buf.slice(i + len);
      if (wake) { const w = wake; wake = null; w(); }
    }
  };
  const next = async () => { while (!queue.length) await new Promise(r => wake = r); return queue.shift(); };
  const ws = new WebSocket(url, 'mqtt');
  ws.binaryType = 'arraybuffer';
  ws.onmessage = ev => { const d = new Uint8Array(ev.data); const b = new Uint8Array(buf.length + d.length);
                          b.set(buf); b.set(d, buf.length); buf = b; parse(); };
  await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = () => reject(new Error('ws error')); });
  window.mqttProtocol = ws.protocol;
  ws.send(packet(0x10, [...str('MQTT'), 4, 2, 0, 60, ...str(clientId)]));
  const connack = await next();
  if (connack.type !== 0x20 || connack.body[1] !== 0) throw new Error('CONNACK ' + connack.body);
  ws.send(packet(0x82, [0, 1, ...str(topic + '/in'), 1]));
  const suback = await next();
  if (suback.type !== 0x90 || suback.body[2] !== 1) throw new Error('SUBACK ' + suback.body);
  window.mqttReady = true;
  const got = []; let pid = 100; let acked = 0;
  while (got.length < count || acked < count) {
    const p = await next();
    if (p.type === 0x40) { acked++; continue; }  // PUBACK of what this page published
    if ((p.type & 0xf0) !== 0x30) throw new Error('unexpected packet ' + p.type);
    const qos = (p.type >> 1) & 3; const tlen = (p.body[0] << 8) | p.body[1];
    let off = 2 + tlen;
    if (qos) { const id = (p.body[off] << 8) | p.body[off + 1]; off += 2; ws.send(packet(0x40, [id >> 8, id & 255])); }
    const payload = p.body.slice(off);
    got.push(payload.length);
    pid++;
    ws.send(packet(0x32, [...str(topic + '/out'), pid >> 8, pid & 255, ...payload]));
  }
  ws.send(packet(0xe0, []));
  return got;
}
"""


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM) and not shutil.which("chromium"):
        pytest.skip("no chromium on this machine")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM)
                               else shutil.which("chromium"), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_browser_page_exchanges_messages_with_paho_over_tcp(mq, browser, scheme):
    """A page in chromium connects with subprotocol 'mqtt', subscribes, gets three messages
    published by paho over TCP (QoS 0, QoS 1, 100 KB) and publishes each back."""
    t = uid()
    port = mq.ws_port if scheme == "ws" else mq.wss_port
    context = browser.new_context(ignore_https_errors=True)  # the test's self-signed cert
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.set_content("<html><body>mqtt over websockets</body></html>")
        tcp = Paho(mq.mqtt_port)
        tcp.subscribe((f"{t}/out", 1))
        page.evaluate("""(args) => { window.result = null; window.failure = null;
            (""" + PAGE_JS + """)(args).then(r => window.result = r,
                                              e => window.failure = String(e)); }""",
                      {"url": f"{scheme}://127.0.0.1:{port}/ws", "topic": t,
                       "clientId": uid(), "count": 3})
        page.wait_for_function("window.mqttReady || window.failure", timeout=30_000)
        assert page.evaluate("window.failure") is None
        assert page.evaluate("window.mqttProtocol") == "mqtt"
        big = bytes(range(256)) * 400
        tcp.publish(f"{t}/in", b"hello browser", qos=0)
        tcp.publish(f"{t}/in", b"qos one", qos=1)
        tcp.publish(f"{t}/in", big, qos=1)
        page.wait_for_function("window.result || window.failure", timeout=30_000)
        assert page.evaluate("window.failure") is None
        assert page.evaluate("window.result") == [13, 7, len(big)]
        back = tcp.wait_for(3)
        assert [p for _, p, _ in back] == [b"hello browser", b"qos one", big]
        assert not errors
    finally:
        context.close()


# ---- raw sockets: handshake refusals, frames --------------------------------------------

def http_status(port, request: bytes, within=20.0) -> tuple[int, bytes]:
    """Send ``request`` raw, read the answer until the server closes (a refusal) or, for a
    101, until its head is complete (the server then waits for MQTT, and only its
    handshake timeout would close): (status, answer)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=within)
    try:
        s.sendall(request)
        answer = b""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
            if answer.startswith(b"HTTP/1.1 101 ") and b"\r\n\r\n" in answer:
                break
        line = answer.split(b"\r\n", 1)[0]
        return int(line.split()[1]), answer
    finally:
        s.close()


def upgrade(path="/ws", protocol: str | None = "mqtt", extra: bytes = b"",
            version=b"13") -> bytes:
    proto = b"" if protocol is None else b"Sec-WebSocket-Protocol: " + protocol.encode() + b"\r\n"
    return (b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: " + version + b"\r\n" + proto + extra + b"\r\n")


def test_bad_upgrade_requests_are_refused_with_rabbitmqs_statuses(mq):
    port = mq.ws_port
    status, answer = http_status(port, upgrade())
    assert status == 101 and b"sec-websocket-protocol: mqtt" in answer.lower()
    assert http_status(port, upgrade(path="/mqtt"))[0] == 404  # not the Web MQTT path
    assert http_status(port, upgrade(protocol=None))[0] == 400  # MQTT-6.0.0-3: 'mqtt' offered
    assert http_status(port, upgrade(protocol="stomp, v12.stomp"))[0] == 400
    assert http_status(port, upgrade(protocol="stomp, mqtt"))[0] == 101
    assert http_status(port, upgrade(protocol="mqttv3.1"))[0] == 101  # older 3.1 clients
    assert http_status(port, upgrade(version=b"8"))[0] == 426
    assert http_status(port, b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 400  # no upgrade
    assert http_status(port, b"POST /ws HTTP/1.1\r\nHost: x\r\ncontent-length: 0\r\n\r\n")[0] == 400
    assert http_status(port, b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00\r\n\r\n")[0] == 400
    # an upgrade request with 64 KiB of headers: refused after h11's 16 KiB, not buffered
    huge = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 1000) for i in range(64))
    status, _ = http_status(port, upgrade(extra=huge))
    assert status == 400


def test_no_upgrade_request_in_time_is_closed(mq):
    """A request that never completes is dropped after the handshake timeout (10 s)."""
    s = socket.create_connection(("127.0.0.1", mq.ws_port), timeout=60)
    try:
        s.sendall(b"GET /ws HTTP/1.1\r\n")  # and nothing more
        started = time.monotonic()
        assert s.recv(100) == b""
        assert 5 < time.monotonic() - started < 50
    finally:
        s.close()


def frame(opcode: int, payload: bytes, fin=True, masked=True, length: int | None = None) -> bytes:
    """A client frame, optionally with a declared ``length`` other than the payload's."""
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | opcode
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head = bytes((first, mask_bit | n))
    elif n < 65536:
        head = bytes((first, mask_bit | 126)) + struct.pack(">H", n)
    else:
        head = bytes((first, mask_bit | 127)) + struct.pack(">Q", n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class RawWS:
    """An accepted WebSocket connection on a raw socket; server frames parsed by wsproto's
    client side."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host="127.0.0.1", target="/ws",
                                               subprotocols=["mqtt"])))
        self.reader = m.PacketReader()
        self.packets: list = []
        self.closed_with: int | None = None
        self.pongs: list = []
        while not self._pump():
            pass

    def _pump(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            self.ws.receive_data(None)
        else:
            self.ws.receive_data(data)
        accepted = False
        for ev in self.ws.events():
            if isinstance(ev, AcceptConnection):
                accepted = True
            elif isinstance(ev, RejectConnection):
                raise AssertionError(f"refused: {ev.status_code}")
            elif isinstance(ev, BytesMessage):
                self.packets += self.reader.feed(bytes(ev.data))
            elif isinstance(ev, Pong):
                self.pongs.append(bytes(ev.payload))
            elif isinstance(ev, CloseConnection):
                self.closed_with = ev.code
        return accepted or not data

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def wait(self, cond, within=20.0) -> bool:
        self.sock.settimeout(within)
        deadline = time.monotonic() + within
        try:
            while not cond() and time.monotonic() < deadline:
                try:
                    self._pump()
                except ConnectionResetError:
                    return cond()
                if self.ws.connection is not None and self.ws.state.name == "CLOSED":
                    break
        except TimeoutError:
            pass
        return cond()

    def closed_by_server(self, within=20.0) -> bool:
        """The server sent a close frame or ended the TCP connection."""
        self.sock.settimeout(within)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return True
            except TimeoutError:
                return False
            if not data:
                return True
            self.ws.receive_data(data)
            for ev in self.ws.events():
                if isinstance(ev, CloseConnection):
                    self.closed_with = ev.code
        return False

    def close(self):
        self.sock.close()


CONNECT = m.encode(m.Connect(client_id="", clean_session=True, keep_alive=60))


def test_frames_split_across_reads_and_packets_across_frames(mq):
    """A frame's header and payload arrive in pieces; one MQTT packet spans a fragmented
    message's frames, another several binary messages; several packets share one frame; a
    ping between fragments is answered; the close handshake is answered."""
    t = uid()
    c = RawWS(mq.ws_port)
    whole = frame(0x2, CONNECT)
    for i in range(len(whole)):  # one byte per write: the server's reads see pieces
        c.send_raw(whole[i:i + 1])
        time.sleep(0.002)
    assert c.wait(lambda: len(c.packets) >= 1)
    assert isinstance(c.packets[0], m.ConnAck) and c.packets[0].return_code == 0
    sub = m.encode(m.Subscribe(1, [(t, 1)]))
    # SUBSCRIBE in a fragmented message: first fragment, a ping in between, continuation
    c.send_raw(frame(0x2, sub[:3], fin=False))
    c.send_raw(frame(0x9, b"are you there"))
    c.send_raw(frame(0x0, sub[3:], fin=True))
    assert c.wait(lambda: len(c.packets) >= 2 and c.pongs)
    assert isinstance(c.packets[1], m.SubAck) and c.packets[1].return_codes == [1]
    assert c.pongs == [b"are you there"]
    # a QoS 1 PUBLISH cut across three binary messages, then two PUBLISHes in one frame
    pub = m.encode(m.Publish(t, b"x" * 300, qos=1, packet_id=7))
    c.send_raw(frame(0x2, pub[:1]) + frame(0x2, pub[1:150]))
    c.send_raw(frame(0x2, pub[150:]))
    two = m.encode(m.Publish(t, b"a", qos=0)) + m.encode(m.Publish(t, b"b", qos=0))
    c.send_raw(frame(0x2, two))
    assert c.wait(lambda: len(c.packets) >= 6)
    kinds = [type(p).__name__ for p in c.packets[2:]]
    assert sorted(kinds) == ["PacketId", "Publish", "Publish", "Publish"]  # PUBACK 7 + three
    bodies = [p.payload for p in c.packets[2:] if isinstance(p, m.Publish)]
    assert bodies == [b"x" * 300, b"a", b"b"]
    c.send_raw(frame(0x8, struct.pack(">H", 1000)))
    assert c.wait(lambda: c.closed_with is not None)
    assert c.closed_with == 1000
    c.close()


@pytest.mark.parametrize("case", ["declared-huge", "mqtt-too-large", "long-control", "text",
                                  "unmasked", "bad-opcode"])
def test_malformed_and_oversized_frames_close_only_that_connection(mq, case):
    """Each is closed (with a close frame where the WebSocket layer decides); memory is
    bounded by what arrived (a frame declaring 2**62 bytes reserves nothing); a client on
    the same listener carries on."""
    t = uid()
    watcher = Paho(mq.ws_port, transport="websockets")
    watcher.subscribe((t, 0))
    c = RawWS(mq.ws_port)
    c.send_raw(frame(0x2, CONNECT))
    assert c.wait(lambda: c.packets)
    if case == "declared-huge":
        # a frame that says 2**62 bytes follow; what does follow is a PUBLISH header
        # declaring more than the broker's largest packet: the MQTT layer ends it
        head = bytes((0x30,)) + m.encode_length(MAX_MESSAGE * 4)
        c.send_raw(frame(0x2, head + b"\x00" * 4096, length=2 ** 62))
        expected = None
    elif case == "mqtt-too-large":
        head = bytes((0x30,)) + m.encode_length(MAX_MESSAGE * 4)
        c.send_raw(frame(0x2, head + b"\x00" * 1000))
        expected = None
    elif case == "long-control":
        c.send_raw(frame(0x9, b"p" * 126))
        expected = 1002
    elif case == "text":
        c.send_raw(frame(0x1, b"CONNECT"))
        expected = 1003
    elif case == "unmasked":
        c.send_raw(frame(0x2, m.encode(m.Publish(t, b"u", qos=0)), masked=False))
        expected = 1002
    else:
        c.send_raw(frame(0x3, b"??"))
        expected = 1002
    assert c.closed_by_server(), f"{case}: still open"
    if expected is not None:
        assert c.closed_with == expected
    c.close()
    Paho(mq.mqtt_port).publish(t, b"still here", qos=1)
    assert watcher.wait_for(1) == [(t, b"still here", 0)]


def test_wss_handshake_and_tls_failure(mq, tls_files):
    """A TLS client that does not trust the certificate fails; one that does upgrades."""
    cert, _ = tls_files
    ctx = ssl.create_default_context()
    with pytest.raises(ssl.SSLError), \
            socket.create_connection(("127.0.0.1", mq.wss_port), timeout=20) as s:
        ctx.wrap_socket(s, server_hostname="127.0.0.1")
    ctx = ssl.create_default_context(cafile=str(cert))
    with socket.create_connection(("127.0.0.1", mq.wss_port), timeout=20) as s, \
            ctx.wrap_socket(s, server_hostname="127.0.0.1") as tls:
        tls.sendall(upgrade(path="/other"))
        assert tls.recv(100).split()[1] == b"404"
