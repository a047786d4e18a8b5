"""Local control channel: a unix socket in the data dir, one JSON request per connection.

Request  ``{"op": "list"|"remove"|"remove-all"|"stats", "id": ..., "limit": ...}`` + newline;
response ``{"ok": true, ...}`` + newline. Only the local user that can reach the
data dir can reach the socket (mode 0600).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import tempfile
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from .core import Scheduler

log = logging.getLogger("broker.scheduler.control")

SOCKET_NAME = "scheduler.sock"
MAX_REQUEST = 64 * 1024


def socket_path(data_dir: str) -> str:
    path = os.path.join(os.path.abspath(data_dir), SOCKET_NAME)
    if len(path.encode()) < 100:
        return path
    digest = hashlib.sha1(os.path.abspath(data_dir).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"triomq-sched-{digest}.sock")


def handle_request(scheduler, request: dict) -> dict:
    op = request.get("op")
    if op == "list":
        limit = request.get("limit")
        return {"ok": True, "items": scheduler.list(limit)}
    if op == "remove":
        sid = str(request.get("id", ""))
        return {"ok": scheduler.remove(sid), "id": sid}
    if op == "remove-all":
        return {"ok": True, "removed": scheduler.remove_all()}
    if op == "stats":
        return {"ok": True, "stats": scheduler.stats()}
    return {"ok": False, "error": f"unknown op {op!r}"}


async def _serve_one(stream, scheduler) -> None:
    async with stream:
        data = b""
        with trio.move_on_after(10):
            while b"\n" not in data and len(data) < MAX_REQUEST:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                data += chunk
        try:
            response = handle_request(scheduler, json.loads(data.decode() or "{}"))
        except Exception as exc:  # bad JSON or a bug: answer, never kill the broker
            response = {"ok": False, "error": str(exc)}
        try:
            await stream.send_all(json.dumps(response).encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def serve_control(data_dir: str, scheduler: Scheduler) -> None:
    path = socket_path(data_dir)
    try:
        os.unlink(path)  # stale after kill -9
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("scheduler control socket disabled: %s", exc)
        return
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(16)
    except OSError as exc:
        sock.close()
        log.warning("scheduler control socket disabled (%s): %s", path, exc)
        return
    listener = trio.SocketListener(sock)
    try:
        await trio.serve_listeners(lambda s: _serve_one(s, scheduler), [listener])
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
