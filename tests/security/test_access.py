"""broker.access (broker/security): first start, management calls, durability on the
journal and SQLite, validation naming the field, all-or-nothing imports, the cached
checks and their invalidation, logins, and definitions exchanged with the machine's
RabbitMQ (temporary user and vhost, removed after)."""
from __future__ import annotations

import secrets
import struct

import pytest
import trio
from reference import require_rabbitmq_api

from broker import errors
from broker.amqp.fields import encode_table
from broker.broker import Broker
from broker.config import Config
from broker.persistence import open_store
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue
from broker.security import DefinitionError, NotFound
from broker.security.passwords import hash_password


def _life(url, data_dir, body, config=None):
    """One broker life on the store at ``url`` (open, recover, ``body(broker)``, close)."""
    async def main():
        store = open_store(url, str(data_dir))
        await store.open()
        broker = Broker(config or Config(data_dir=str(data_dir)), store)
        broker.recover()
        body(broker)
        done = trio.Event()
        store.when_durable(done.set)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            await done.wait()
            nursery.cancel_scope.cancel()
        await store.close()
    trio.run(main)


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_state_survives_restarts(kind, tmp_path):
    url = "journal" if kind == "journal" else f"sqlite:///{tmp_path}/store.db"

    def first(broker):
        a = broker.access
        assert [u["name"] for u in a.list_users()] == ["guest"]
        assert a.users["guest"].tags == ("administrator",)
        assert [v["name"] for v in a.list_vhosts()] == ["/"]
        a.add_user("ann", "pw", ["monitoring", "impersonator"])
        a.add_vhost("odd/../vhost é", "described")
        a.add_vhost("gone")
        a.set_permissions("ann", "odd/../vhost é", "^c", "^w", "^r")
        a.set_topic_permissions("ann", "odd/../vhost é", "amq.topic", "^{username}\\.", "")
        a.set_vhost_limits("odd/../vhost é", {"max-queues": 5})
        a.set_user_limits("ann", {"max-channels": 2})
        vh = broker.vhosts["odd/../vhost é"]
        vh.add_queue(Queue(vh, "kept", durable=True, arguments={}, opts=parse_queue_arguments({})))
        gone = broker.vhosts["gone"]
        gone.add_queue(Queue(gone, "dropped", durable=True, arguments={},
                             opts=parse_queue_arguments({})))
        a.set_permissions("guest", "gone", ".*", ".*", ".*")
        a.delete_vhost("gone")
        a.delete_vhost("/")
    _life(url, tmp_path, first)

    def second(broker):
        a = broker.access
        assert sorted(broker.vhosts) == ["odd/../vhost é"]  # "/" stays deleted
        assert "kept" in broker.vhosts["odd/../vhost é"].queues
        assert a.authenticate("ann", "pw") is not None
        assert a.users["ann"].limits == {"max-channels": 2}
        assert a.list_vhosts() == [{"name": "odd/../vhost é", "description": "described",
                                    "tags": [], "limits": {"max-queues": 5}}]
        assert a.list_permissions() == [{"user": "ann", "vhost": "odd/../vhost é",
                                         "configure": "^c", "write": "^w", "read": "^r"}]
        assert a.list_topic_permissions()[0]["write"] == "^{username}\\."
        a.delete_user("ann")
    _life(url, tmp_path, second)

    def third(broker):
        assert broker.access.list_users() == [] or \
            [u["name"] for u in broker.access.list_users()] == ["guest"]
        assert broker.access.list_permissions() == []
        assert broker.access.list_topic_permissions() == []
    _life(url, tmp_path, third)
    assert not any(p.name.startswith("odd") for p in tmp_path.rglob("*"))  # never a path


def test_default_user_options(tmp_path):
    config = Config(data_dir=str(tmp_path), default_user="admin", default_pass="s3cret",
                    loopback_users=())

    def body(broker):
        a = broker.access
        assert list(a.users) == ["admin"] and a.users["admin"].is_administrator
        assert a.authenticate("admin", "s3cret", "10.1.2.3") is not None  # not loopback-only
        assert a.authenticate("guest", "guest") is None
    _life("journal", tmp_path, body, config)


def test_loopback_users_and_unknown_users_refused_alike():
    a = Broker().access
    assert a.authenticate("guest", "guest", "127.0.0.1") is not None
    assert a.authenticate("guest", "guest", "::1") is not None
    assert a.authenticate("guest", "guest", "10.0.0.7") is None
    assert a.authenticate("nobody", "guest") is None
    refusal = ("Login was refused using authentication mechanism PLAIN. "
               "For details see the broker logfile.")
    assert a.login("PLAIN", b"\0nobody\0x", "127.0.0.1") == (None, refusal)
    assert a.login("PLAIN", b"\0guest\0wrong", "127.0.0.1") == (None, refusal)
    assert a.login("PLAIN", b"garbage", "127.0.0.1") == (None, "")
    amqplain = encode_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
    assert a.login("AMQPLAIN", amqplain, None)[0].name == "guest"
    assert struct.unpack(">I", encode_table({})[:4]) == (0,)
    assert a.login("EXTERNAL", b"", "127.0.0.1", peer_cert_user=None)[0] is None
    assert a.login("EXTERNAL", b"", "127.0.0.1", peer_cert_user="guest")[0].name == "guest"
    assert a.login("EXTERNAL", b"", "127.0.0.1", peer_cert_user="nobody")[0] is None


def test_checks_match_rabbitmq_and_follow_changes():
    a = Broker().access
    a.add_user("bob", "pw")
    a.add_vhost("v")
    with pytest.raises(errors.AMQPError, match="NOT_ALLOWED - access to vhost 'v' refused "
                                               "for user 'bob'") as e:
        a.check_vhost(a.users["bob"], "v")
    assert e.value.code == 530
    a.set_permissions("bob", "v", "c", "", "^amq\\.default$")
    authz = a.authz("bob", "v")
    a.check("bob", "v", "queue", "abc", "configure")  # unanchored, as Erlang's re:run
    with pytest.raises(errors.AMQPError) as e:
        a.check("bob", "v", "exchange", "x", "write")  # "" allows nothing
    assert e.value.code == 403 and e.value.text == (
        "ACCESS_REFUSED - access to exchange 'x' in vhost 'v' refused for user 'bob'")
    a.check("bob", "v", "exchange", "", "read")  # the default exchange is amq.default
    assert "abc" in authz.configure_ok
    a.set_permissions("bob", "v", "^z", ".*", ".*")  # reloads the shared object in place
    assert a.authz("bob", "v") is authz and not authz.configure_ok
    with pytest.raises(errors.AMQPError):
        authz.check("queue", "abc", "configure")
    a.set_topic_permissions("bob", "v", "amq.topic", "^{username}\\.{vhost}$", "^r")
    authz.check_topic("amq.topic", "bob.v", "write")
    authz.check_topic("other", "anything", "write")  # no topic permission there: allowed
    with pytest.raises(errors.AMQPError, match=r"access to topic 'bobXv' in exchange "
                                               r"'amq\.topic' in vhost 'v' refused for user 'bob'"):
        authz.check_topic("amq.topic", "bobXv", "write")  # the values are matched literally
    a.clear_permissions("bob", "v")
    with pytest.raises(errors.AMQPError):
        authz.check("queue", "zz", "read")
    with pytest.raises(NotFound):
        a.clear_permissions("bob", "v")


def test_bad_input_names_the_field():
    a = Broker().access
    a.add_user("bob", "pw")
    cases = [
        (lambda: a.set_permissions("bob", "/", "(", ".*", ".*"), "configure"),
        (lambda: a.set_permissions("bob", "/", ".*", ".*", "[z-a]"), "read"),
        (lambda: a.set_user_tags("bob", ["administrator", "root"]), "tags"),
        (lambda: a.set_user_tags("bob", 7), "tags"),
        (lambda: a.set_vhost_limits("/", {"max-exchanges": 1}), "limits.max-exchanges"),
        (lambda: a.set_user_limits("bob", {"max-channels": "many"}), "limits.max-channels"),
        (lambda: a.add_user("", "pw"), "name"),
        (lambda: a.add_user("x" * 256, "pw"), "name"),
        (lambda: a.add_user("bob", "pw"), "name"),
        (lambda: a.put_user("c", password_hash="nope!"), "password_hash"),
        (lambda: a.put_user("c", password_hash="", hashing_algorithm="bcrypt"),
         "hashing_algorithm"),
    ]
    for call, field in cases:
        with pytest.raises(DefinitionError) as e:
            call()
        assert e.value.field == field, (field, str(e.value))
    with pytest.raises(NotFound):
        a.set_permissions("nobody", "/", ".*", ".*", ".*")
    with pytest.raises(NotFound):
        a.set_permissions("bob", "nowhere", ".*", ".*", ".*")
    with pytest.raises(NotFound):
        a.delete_vhost("nowhere")


def test_import_is_all_or_nothing_and_round_trips():
    a = Broker().access
    good = {"users": [{"name": "u1", "password_hash": hash_password("pw"),
                       "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"],
                       "limits": {"max-connections": 3}}],
            "vhosts": [{"name": "v1", "description": "d", "tags": ["t"]}],
            "permissions": [{"user": "u1", "vhost": "v1", "configure": ".*", "write": ".*",
                             "read": ".*"}],
            "topic_permissions": [{"user": "u1", "vhost": "v1", "exchange": "amq.topic",
                                   "write": "^a", "read": "^b"}],
            "parameters": [{"vhost": "v1", "component": "vhost-limits", "name": "limits",
                            "value": {"max-queues": 10}},
                           {"vhost": "v1", "component": "federation-upstream", "name": "x",
                            "value": {}}],
            "queues": [], "policies": []}
    for path, bad in [
        ("users[1].tags", {"users": [good["users"][0], {"name": "u2", "tags": "wizard"}]}),
        ("users[0].passwd", {"users": [{"name": "u2", "passwd": "x"}]}),
        ("permissions[0].user", {"permissions": [{"user": "ghost", "vhost": "/",
                                                  "configure": "", "write": "", "read": ""}]}),
        ("permissions[0].write", {**good, "permissions": [{**good["permissions"][0],
                                                           "write": "(("}]}),
        ("parameters[0].value.max-cats",
         {**good, "parameters": [{"vhost": "v1", "component": "vhost-limits", "name": "limits",
                                  "value": {"max-cats": 1}}]}),
        ("definitions", []),
        ("users", {"users": {"name": "x"}}),
    ]:
        before = a.export()
        with pytest.raises(DefinitionError) as e:
            a.import_(bad)
        assert e.value.field == path, str(e.value)
        assert a.export() == before  # nothing applied
    a.import_(good)
    assert a.authenticate("u1", "pw") is not None
    assert a.vhost_info["v1"]["limits"] == {"max-queues": 10}
    exported = a.export()
    b = Broker().access
    b.import_(exported)
    assert b.export() == exported


def _rabbitmq():
    require_rabbitmq_api().close()
    import httpx
    return httpx.Client(auth=("guest", "guest"), timeout=15,
                        base_url="http://127.0.0.1:15672/api")


def test_definitions_move_between_rabbitmq_and_triomq():
    api = _rabbitmq()
    tag = secrets.token_hex(4)
    user, vhost, back = f"triomq_test_defs_{tag}", f"triomq_test_defs_{tag}", f"triomq_test_back_{tag}"
    try:
        assert api.put(f"/vhosts/{vhost}", json={}).status_code in (201, 204)
        assert api.put(f"/users/{user}", json={"password": "from-rabbit",
                                               "tags": "monitoring"}).status_code in (201, 204)
        assert api.put(f"/permissions/{vhost}/{user}",
                       json={"configure": "^c", "write": ".*", "read": "^r"}).status_code in (201, 204)
        assert api.put(f"/topic-permissions/{vhost}/{user}",
                       json={"exchange": "amq.topic", "write": "^x", "read": ".*"}).status_code \
            in (201, 204)
        assert api.put(f"/vhost-limits/{vhost}/max-queues", json={"value": 7}).status_code == 204
        theirs = api.get("/definitions").json()
        mine = {k: [e for e in theirs.get(k, []) if tag in str(e)]
                for k in ("users", "vhosts", "permissions", "topic_permissions", "parameters")}
        a = Broker().access
        a.import_({**theirs, **mine})  # whole RabbitMQ file shape, our entries
        assert a.authenticate(user, "from-rabbit") is not None
        assert a.users[user].tags == ("monitoring",)
        assert a.perms[(user, vhost)].configure == "^c"
        assert a.vhost_info[vhost]["limits"] == {"max-queues": 7}
        assert a.list_topic_permissions(user)[0]["write"] == "^x"
        # and back: TrioMQ's export imported by RabbitMQ, password included
        a.put_user(back, password="from-triomq", tags=["management"])
        a.add_vhost(back)
        a.set_permissions(back, back, ".*", "^w", ".*")
        a.set_vhost_limits(back, {"max-connections": 4})
        out = a.export()
        out = {k: [e for e in out[k] if back in str(e)] for k in out}
        r = api.post("/definitions", json=out)
        assert r.status_code in (201, 204), r.text
        import httpx
        assert httpx.get("http://127.0.0.1:15672/api/whoami", auth=(back, "from-triomq"),
                         timeout=10).status_code == 200
        assert api.get(f"/permissions/{back}/{back}").json()["write"] == "^w"
        assert api.get(f"/vhost-limits/{back}").json()[0]["value"] == {"max-connections": 4}
    finally:
        for path in (f"/users/{user}", f"/users/{back}", f"/vhosts/{vhost}", f"/vhosts/{back}"):
            api.delete(path)
