"""QoS 2 packet-identifier state of MQTT sessions (MQTT 3.1.1 section 4.3.3).

A session's state is three things:

- ``received``: inbound packet ids whose PUBLISH was routed (and PUBREC sent) and whose
  PUBREL has not come yet. A PUBLISH with such an id is a duplicate: answered with PUBREC,
  not routed again (method A of the spec's figure 4.3).
- ``releasing``: outbound packet ids the client PUBRECed (the queue entry is acknowledged
  then) and whose PUBCOMP has not come yet; a reconnect sends PUBREL again for each
  (section 4.4) and the ids are not reused meanwhile.
- ``resend``: outbound QoS 2 deliveries sent without a PUBREC when the connection ended,
  by (queue name, entry seq): the message goes back to its queue and is sent again with
  the same packet id (in memory only: after a restart it gets a fresh id).

A clean session's state is its connection's and is never written. A persistent session's
state stays here between its connections, and ``received`` and ``releasing`` are written
through the store's metadata seam (kind ``mqtt_qos2``, one record per packet id, so a
change costs one small write, on every store backend) and come back at recovery through
``broker.meta_restorers`` before the listeners open. The writes are ordered with the
store's other writes, so the PUBREC of a persistent session's QoS 2 PUBLISH waits for
``store.when_durable`` like a PUBACK after a persistent message does.
"""
from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

from ..persistence import DURABLE

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.mqtt")

KIND = "mqtt_qos2"
INBOUND, OUTBOUND = "in", "out"


class SessionState:
    __slots__ = ("received", "releasing", "resend")

    def __init__(self) -> None:
        self.received: set[int] = set()
        self.releasing: set[int] = set()
        self.resend: dict[tuple[str, int], int] = {}

    def __bool__(self) -> bool:
        return bool(self.received or self.releasing or self.resend)


def _key(vhost: str, client_id: str, direction: str, packet_id: int) -> str:
    # any string may be a key, but some databases refuse NUL and long keys: a digest
    return hashlib.sha256(f"{vhost}\x00{client_id}\x00{direction}\x00{packet_id}"
                          .encode()).hexdigest()


class QoS2Sessions:
    """The persistent sessions' QoS 2 state by (vhost, client id)."""

    def __init__(self, broker: Broker):
        self.store = broker.store
        self.durable = DURABLE in self.store.capabilities
        self.states: dict[tuple[str, str], SessionState] = {}
        broker.meta_restorers[KIND] = self._restore

    def _restore(self, key: str, value: dict) -> None:
        try:
            state = self.states.setdefault((value["vhost"], value["client_id"]), SessionState())
            pid = int(value["packet_id"])
            (state.received if value["direction"] == INBOUND else state.releasing).add(pid)
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring an unreadable MQTT QoS 2 record %s", key)

    def get(self, vhost: str, client_id: str) -> SessionState:
        state = self.states.get((vhost, client_id))
        if state is None:
            state = self.states[(vhost, client_id)] = SessionState()
        return state

    def release(self, vhost: str, client_id: str) -> None:
        """The session is disconnected: an empty state need not stay in memory."""
        state = self.states.get((vhost, client_id))
        if state is not None and not state:
            del self.states[(vhost, client_id)]

    def discard(self, vhost: str, client_id: str) -> None:
        """A clean session replaces the persistent one: its state and records go."""
        state = self.states.pop((vhost, client_id), None)
        if state is None:
            return
        for direction, pids in ((INBOUND, state.received), (OUTBOUND, state.releasing)):
            for pid in pids:
                self.store.delete_meta(KIND, _key(vhost, client_id, direction, pid))

    def add(self, vhost: str, client_id: str, direction: str, packet_id: int) -> None:
        self.store.save_meta(KIND, _key(vhost, client_id, direction, packet_id),
                             {"vhost": vhost, "client_id": client_id, "direction": direction,
                              "packet_id": packet_id})

    def remove(self, vhost: str, client_id: str, direction: str, packet_id: int) -> None:
        self.store.delete_meta(KIND, _key(vhost, client_id, direction, packet_id))
