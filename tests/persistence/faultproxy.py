"""A fault-injecting TCP proxy (threads) to put in front of a real database server.

    proxy = FaultProxy("127.0.0.1", 5432).start()   # listens on 127.0.0.1:proxy.port
    proxy.blackhole()    # stop forwarding both ways, keep every connection open (silent peer)
    proxy.close_all()    # reset (RST) every open connection, keep accepting new ones
    proxy.refuse()       # stop listening: new connections get "connection refused"
    proxy.resume()       # forward again (what a blackhole held back is delivered then)
    proxy.stop()

While blackholed, new connections are accepted (the kernel completes the handshake)
but nothing is forwarded, as with a network partition behind a NAT or a hung server.
"""
from __future__ import annotations

import select
import socket
import struct
import threading

_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket):
        self.client = client
        self.server = server
        self.closed = False
        self.lock = threading.Lock()

    def close(self, reset: bool = False) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.server):
            if reset:
                _reset(s)
            else:
                try:
                    s.close()
                except OSError:
                    pass


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, port: int = 0):
        self.target = (target_host, target_port)
        self.port = port
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stopped = False
        self.accepted = 0

    # ---------------------------------------------------------------- control
    def start(self) -> FaultProxy:
        self._listen()
        return self

    def blackhole(self) -> None:
        self._forwarding.clear()

    def resume(self) -> None:
        if self._listener is None and not self._stopped:
            self._listen()
        self._forwarding.set()

    def close_all(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for p in pairs:
            p.close(reset=True)

    def refuse(self) -> None:
        lst, self._listener = self._listener, None
        if lst is not None:
            lst.close()

    def stop(self) -> None:
        self._stopped = True
        self.refuse()
        self._forwarding.set()
        self.close_all()

    @property
    def connections(self) -> int:
        with self._lock:
            return sum(1 for p in self._pairs if not p.closed)

    # --------------------------------------------------------------- plumbing
    def _listen(self) -> None:
        lst = socket.socket()
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", self.port))
        lst.listen(64)
        self.port = lst.getsockname()[1]
        self._listener = lst
        threading.Thread(target=self._accept, args=(lst,), daemon=True).start()

    def _accept(self, lst: socket.socket) -> None:
        while True:
            try:
                client, _ = lst.accept()
            except OSError:
                return  # refuse() / stop() closed it
            self.accepted += 1
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(pair, src, dst), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        while not pair.closed:
            if not self._forwarding.wait(0.05):
                continue
            try:
                readable, _, _ = select.select([src], [], [], 0.05)
            except (OSError, ValueError):
                break
            if not readable or not self._forwarding.is_set():
                continue
            try:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            except OSError:
                break
        pair.close()
