"""An MQTT session's login, re-authentication and permission checks; no session handling."""
from __future__ import annotations

import logging

from .. import errors
from ..mqtt import codec, enhanced_auth
from ..mqtt import properties as P
from .mqtt_state import MQTTSessionState

log = logging.getLogger("broker.mqtt")

# _login's answer while an opaque token's introspection decides
LOGIN_WAITS = (-1, "the login waits for the token's introspection")


class MQTTLogin(MQTTSessionState):
    """The session's login and re-authentication, and its permission checks."""

    __slots__ = ()

    def _login(self, c: codec.Connect,
               credentials: enhanced_auth.Credentials | None = None,
               verified: enhanced_auth.Verified | None = None) -> tuple[int, str] | None:
        """Authenticate and pick the vhost ('vhost:user' in the user name, as RabbitMQ);
        (CONNACK code, reason) when refused. No user name: guest, as RabbitMQ's default
        ``allow_anonymous`` (so only from loopback, like guest over AMQP). ``credentials``:
        from an enhanced authentication method, instead of User Name and Password;
        ``verified``: a user whose password a challenge exchange proved."""
        if verified is not None:
            username: str | None = verified.username
            password: str | None = ""
        elif credentials is not None:
            username = credentials.username
            password = credentials.password
        else:
            username = c.username
            password = (c.password.decode("utf-8", "replace") if c.password is not None
                        else None)
        if username is None:
            username, password = "guest", "guest"
        vhost_name = "/"
        if ":" in username:
            vhost_name, username = username.split(":", 1)
        if password is None:
            return codec.REFUSED_BAD_CREDENTIALS, "no password"
        broker = self.broker
        access = broker.access
        if verified is not None:
            user = access.verified_login(username, self.peer_host, "mqtt")
        elif credentials is None and access.needs_introspection(username, password):
            self.login_wait = (password, c)  # an opaque OAuth 2 token
            return LOGIN_WAITS
        else:
            user = access.authenticate(username, password, self.peer_host, "mqtt")
        if user is None:
            # the edge holds the refusal back, as for AMQP logins (brute force)
            self.output_delay = access.failure_delay
            return codec.REFUSED_BAD_CREDENTIALS, f"login refused for user {username!r}"
        vhost = broker.vhosts.get(vhost_name)
        if vhost is None:
            return codec.REFUSED_NOT_AUTHORIZED, f"vhost {vhost_name!r} not found"
        try:
            access.check_vhost(user, vhost_name)
            # max-connections of the vhost and the user count AMQP and MQTT connections
            access.check_connection_limits(user, vhost_name, broker.sessions)
        except errors.AMQPError as exc:
            return codec.REFUSED_NOT_AUTHORIZED, exc.text
        self.user = user
        self.authz = access.authz(user, vhost_name)
        self.username = username
        self.vhost = vhost
        return None

    def _on_auth_continued(self, data: bytes) -> bool:
        """The client's AUTH 0x18 answering a challenge; True when a CONNECT was accepted
        by it (what the client sent behind its AUTH is then handed out)."""
        pending, self._auth_step = self._auth_step, None
        if pending is None:  # (the connection only reports an AUTH 0x18 after a challenge)
            self.close("AUTH without a challenge", P.PROTOCOL_ERROR)
            return False
        step, connect = pending
        outcome = step.next(data)
        if isinstance(outcome, enhanced_auth.Refused):  # a failed login, as a wrong password
            self.broker.access.count_attempt("mqtt", False)
        if connect is None:  # re-authenticating
            if isinstance(outcome, enhanced_auth.Refused):
                self.close(f"re-authentication refused: {outcome.reason}", P.NOT_AUTHORIZED)
            else:
                self._reauthenticated(outcome.username, None, outcome.data)
            return False
        if isinstance(outcome, enhanced_auth.Refused):
            log.warning("mqtt connection %s: refused: %s", self.peer, outcome.reason)
            self.conn.refuse(codec.REFUSED_BAD_CREDENTIALS, outcome.reason)
            self.output_delay = self.broker.access.failure_delay
            self.finished = True
            return False
        self._on_connect(connect, outcome)
        return not self.finished

    def _on_reauth(self, data: bytes) -> None:
        """AUTH 0x19 (section 4.12.1): the same user in the same vhost, checked again (a
        changed password or revoked access ends the connection), its permissions read anew."""
        method = enhanced_auth.METHODS[self.conn.auth_method or ""]
        outcome = method.start(data, self.broker.access.scram_lookup)
        if isinstance(outcome, enhanced_auth.Challenge):
            self._auth_step = (outcome.step, None)
            self.conn.challenge(outcome.data)
            return
        if isinstance(outcome, (enhanced_auth.Refused, enhanced_auth.NotOffered)):
            self.close(f"re-authentication refused: {outcome.reason}", P.NOT_AUTHORIZED)
            return
        self._reauthenticated(outcome.username, outcome.password)

    def _reauthenticated(self, username: str, password: str | None,
                         data: bytes | None = None) -> None:
        """A re-authentication's identity checked: ``password`` against the user, or None
        when a challenge exchange proved it (``data``: its last message)."""
        vhost_name = "/"
        if ":" in username:
            vhost_name, username = username.split(":", 1)
        if username != self.username or vhost_name != self.vhost.name:
            self.close("re-authentication as another user or vhost", P.NOT_AUTHORIZED)
            return
        access = self.broker.access
        if password is None:
            user = access.verified_login(username, self.peer_host, "mqtt")
        else:
            user = access.authenticate(username, password, self.peer_host, "mqtt")
        if user is None:
            self.close(f"re-authentication refused for user {username!r}", P.NOT_AUTHORIZED)
            return
        try:
            access.check_vhost(user, vhost_name)
        except errors.AMQPError as exc:
            self.close(exc.text, P.NOT_AUTHORIZED)
            return
        self.user = user
        self.authz = access.authz(user, vhost_name)
        self.conn.auth_success(data)

    def _check(self, kind: str, name: str, perm: str) -> None:
        self.broker.access.check(self.user, self.vhost.name, kind, name, perm)

    def _check_topic(self, routing_key: str, perm: str) -> None:
        self.broker.access.check_topic(self.user, self.vhost.name, self.service.exchange,
                                       routing_key, perm)
