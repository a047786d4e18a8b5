"""The AMQP listeners of a broker process: trio's default, or with ``--workers`` a listener
every worker process binds with SO_REUSEPORT (the kernel spreads new connections over
them) plus the worker's own listener on 127.0.0.1:``private_port`` that the other workers'
node-to-node links connect to."""
from __future__ import annotations

import socket

import trio

from ..config import Config


def _listener(host: str | None, port: int, reuse_port: bool) -> trio.SocketListener:
    last: OSError | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
            sock.listen(4096)
            return trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"no address for {host}:{port}")


async def open_amqp_listeners(config: Config, port: int, host: str) -> list:
    bind_host = None if host in ("", "*") else host
    if not config.reuse_port:
        return await trio.open_tcp_listeners(port, host=bind_host)
    listeners = [_listener(bind_host, port, True)]
    if config.private_port is not None:
        listeners.append(_listener("127.0.0.1", config.private_port, False))
    return listeners
