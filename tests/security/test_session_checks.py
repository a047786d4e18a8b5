"""The checks inside a broker Session (no sockets): permission changes reach open channels at
once, a deleted vhost takes its connections and queues, limits and impersonation."""
from __future__ import annotations

from broker.amqp import spec
from broker.broker import Broker

from ..support import SessionClient, channel_close, connection_close, methods


def test_permission_changes_reach_open_channels():
    broker = Broker()
    c = SessionClient(broker)
    c.open_channel(1)
    c.declare_queue(1, "q")
    assert not methods(c.publish(1, b"a", "", "q"), spec.Channel.Close)
    broker.access.set_permissions("guest", "/", ".*", "^$", ".*")  # no write any more
    close = channel_close(c.publish(1, b"b", "", "q"))
    assert close.reply_code == 403
    assert close.reply_text == ("ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' "
                                "refused for user 'guest'")
    broker.access.set_permissions("guest", "/", ".*", ".*", ".*")
    c.open_channel(2)
    assert not methods(c.publish(2, b"c", "", "q"), spec.Channel.Close)
    assert broker.vhosts["/"].queues["q"].message_count == 2


def test_deleting_a_vhost_closes_its_connections_and_drops_its_queues():
    broker = Broker()
    a = broker.access
    a.add_vhost("v")
    a.set_permissions("guest", "v", ".*", ".*", ".*")
    c = SessionClient(broker, vhost="v")
    other = SessionClient(broker)
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.publish(1, b"m", "", "q")
    a.delete_vhost("v")
    close = connection_close(c.output())
    assert close.reply_code == 320 and "vhost 'v' is deleted" in close.reply_text
    assert "v" not in broker.vhosts and a.list_permissions(vhost="v") == []
    other.open_channel(1)  # another vhost's connection is untouched
    assert other.declare_queue(1, "q2").queue == "q2"


def test_channel_and_queue_limits():
    broker = Broker()
    a = broker.access
    a.set_user_limits("guest", {"max-channels": 1})
    c = SessionClient(broker)
    c.open_channel(1)
    close = connection_close(c.call(2, spec.Channel.Open()))
    assert close.reply_code == 530 and "maximum allowed user limit of (1)" in close.reply_text
    a.clear_user_limits("guest")
    a.set_vhost_limits("/", {"max-queues": 1})
    c = SessionClient(broker)
    c.open_channel(1)
    c.declare_queue(1, "one")
    close = channel_close(c.call(1, spec.Queue.Declare(0, "", False, False, True, False, False, {})))
    assert close.reply_code == 406
    assert "queue limit in vhost '/' (1) is reached" in close.reply_text


def test_deleting_a_user_closes_their_connections():
    broker = Broker()
    c = SessionClient(broker)
    c.open_channel(1)
    broker.access.add_user("ann", "secret")
    broker.access.delete_user("ann")  # someone else's: untouched
    assert not methods(c.output(), spec.Connection.Close)
    broker.access.delete_user("guest")
    close = connection_close(c.output())
    assert close.reply_code == 320 and "user 'guest' is deleted" in close.reply_text
