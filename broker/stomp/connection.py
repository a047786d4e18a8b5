"""The server side of one STOMP connection, sans-IO: ``receive_data(bytes)`` returns
events, frames to write queue up for ``data_to_send()``.

CONNECT (or STOMP) is answered by the broker (``accept`` / ``error``) after the login:
the state machine negotiates the version (the highest of ``accept-version`` the server
speaks; none given: 1.0) and the heart-beats (each side's interval the larger of what one
offers and the other wants, RabbitMQ's answer to ``cx,cy`` being ``cy,cx``). After an
ERROR frame the connection is finished: nothing more is read or written.
"""
from __future__ import annotations

import base64
import enum
import os
from dataclasses import dataclass

from .codec import COMMANDS, Frame, FrameError, FrameReader, encode

VERSIONS = ("1.0", "1.1", "1.2")
SERVER = "TrioMQ"


class State(enum.Enum):
    AWAIT_CONNECT = 1
    CONNECTING = 2  # CONNECT handed to the broker, not answered yet
    OPEN = 3
    CLOSED = 4


@dataclass
class ConnectRequested:
    frame: Frame
    version: str


@dataclass
class FrameReceived:
    frame: Frame


@dataclass
class ProtocolError:
    message: str
    detail: str


def negotiate_version(headers: dict[str, str]) -> str | None:
    offered = headers.get("accept-version")
    if offered is None:
        return "1.0"
    versions = {v.strip() for v in offered.split(",")}
    for v in reversed(VERSIONS):
        if v in versions:
            return v
    return None


def negotiate_heartbeat(header: str | None) -> tuple[int, int]:
    """(ms between the server's heart-beats, ms within which the client's must arrive),
    0 for none: the server sends as often as the client wants to receive and reads as
    often as the client offers to send (it offers anything, as RabbitMQ)."""
    if not header:
        return 0, 0
    try:
        cx, cy = (int(p.strip()) for p in header.split(","))
        if cx < 0 or cy < 0:
            raise ValueError
    except ValueError:
        raise FrameError("Invalid header", f"invalid heart-beat header {header[:40]!r}") from None
    return cy, cx


class ServerConnection:
    def __init__(self, max_body: int):
        self.reader = FrameReader(max_body)
        self.state = State.AWAIT_CONNECT
        self.version = "1.0"
        self.heartbeat_send = 0  # ms; 0: none
        self.heartbeat_receive = 0
        self.username: str | None = None  # set by the broker at login (management, audit)
        self.session_id = "session-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        self._out: list[bytes] = []
        self.pending_output = 0
        # octets and reads / writes (the management API's recv_oct, recv_cnt, send_oct,
        # send_cnt): once per read or write, not per frame
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0

    # ---- input ----
    def receive_data(self, data: bytes) -> list:
        if self.state is State.CLOSED:
            return []
        self.recv_oct += len(data)
        self.recv_cnt += 1
        events: list = []
        error: FrameError | None = None
        try:
            frames = self.reader.feed(data)
        except FrameError as exc:
            frames = []
            error = exc
        for frame in frames:
            if self.state is State.CLOSED:
                break
            if self.state is State.AWAIT_CONNECT:
                if frame.command not in ("CONNECT", "STOMP"):
                    self.error("Illegal command", "You must log in using CONNECT first")
                    events.append(ProtocolError("Illegal command", frame.command))
                    break
                version = negotiate_version(frame.headers)
                if version is None:
                    self.error("Version mismatch",
                               "Supported versions are " + ",".join(VERSIONS) + "\n")
                    events.append(ProtocolError("Version mismatch",
                                                frame.headers.get("accept-version", "")))
                    break
                try:
                    send, receive = negotiate_heartbeat(frame.headers.get("heart-beat"))
                except FrameError as exc:
                    self.error(exc.message, exc.detail)
                    events.append(ProtocolError(exc.message, exc.detail))
                    break
                self.version = version
                self.reader.version = version
                self.heartbeat_send, self.heartbeat_receive = send, receive
                self.state = State.CONNECTING
                events.append(ConnectRequested(frame, version))
            elif self.state is State.CONNECTING:
                # frames pipelined behind the CONNECT: the broker handles them once it has
                # answered (events keep their order)
                events.append(FrameReceived(frame))
            elif frame.command not in COMMANDS or frame.command in ("CONNECT", "STOMP"):
                self.error("Bad command", f'Could not interpret command "{frame.command}"\n',
                           frame.headers.get("receipt"))
                events.append(ProtocolError("Bad command", frame.command))
                break
            else:
                events.append(FrameReceived(frame))
        if error is not None and self.state is not State.CLOSED:
            self.error(error.message, error.detail)
            events.append(ProtocolError(error.message, error.detail))
        return events

    # ---- output ----
    def accept(self, server: str = SERVER) -> None:
        headers = {"server": server, "session": self.session_id,
                   "heart-beat": f"{self.heartbeat_send},{self.heartbeat_receive}",
                   "version": self.version}
        self.send(Frame("CONNECTED", headers))
        self.state = State.OPEN

    def send(self, frame: Frame) -> None:
        if self.state is State.CLOSED:
            return
        data = encode(frame, self.version)
        self._out.append(data)
        self.pending_output += len(data)

    def receipt(self, receipt_id: str | None) -> None:
        if receipt_id is not None:
            self.send(Frame("RECEIPT", {"receipt-id": receipt_id}))

    def error(self, message: str, detail: str, receipt_id: str | None = None) -> None:
        """An ERROR frame as RabbitMQ's plugin writes it; the connection is finished."""
        if self.state is State.CLOSED:
            return
        headers = {"message": message, "content-type": "text/plain",
                   "version": ",".join(VERSIONS)}
        if receipt_id is not None:
            headers["receipt-id"] = receipt_id
        self.send(Frame("ERROR", headers, detail.encode("utf-8", "replace")))
        self.state = State.CLOSED

    def subscription_cancelled(self, sub_id: str) -> None:
        """RabbitMQ's notice that the broker ended a subscription (its queue was deleted):
        an ERROR frame that does not end the connection."""
        self.send(Frame("ERROR", {"message": "Server cancelled subscription",
                                  "content-type": "text/plain",
                                  "version": ",".join(VERSIONS), "subscription": sub_id},
                        b"The server has canceled a subscription.\n"
                        b"No more messages will be delivered for \"id='"
                        + sub_id.encode() + b"'\".\n"))

    def send_blocked(self, reason: str) -> bool:
        """STOMP cannot tell a client it is blocked (the broker then just stops reading)."""
        return False

    def send_unblocked(self) -> bool:
        return False

    def heartbeat(self) -> None:
        if self.state is State.OPEN:
            self._out.append(b"\n")
            self.pending_output += 1

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def data_to_send(self) -> bytes:
        out, self._out = self._out, []
        self.pending_output = 0
        if not out:
            return b""
        data = b"".join(out)
        self.send_oct += len(data)
        self.send_cnt += 1
        return data
