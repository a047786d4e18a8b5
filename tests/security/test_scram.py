"""SCRAM-SHA-256 credentials kept next to RabbitMQ's password hashes: made whenever a
password is set (add_user, change_password, PUT with a password, definitions with a
password), absent for a user made from a hash, kept when the same hash is put again
(set_user_tags, definitions imported again), out of exports, and stored across restarts."""
from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
import trio

from broker.broker import Broker
from broker.config import Config
from broker.persistence import open_store
from broker.security.passwords import hash_password, scram_credentials


def _expected(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """RFC 5802's StoredKey and ServerKey, computed here independently."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return (hashlib.sha256(client_key).digest(),
            hmac.new(salted, b"Server Key", hashlib.sha256).digest())


def _proves(access, user: str, password: str) -> bool:
    creds = access.scram_lookup(user)
    assert creds is not None
    salt, iterations, stored, server = creds
    return (stored, server) == _expected(password, salt, iterations)


def test_rfc7677_example():
    # RFC 7677 section 3: user / pencil, salt W22ZaJ0SNY7soEsUEjb6gQ==, 4096 iterations
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    c = scram_credentials("pencil", salt, 4096)
    stored, server = _expected("pencil", salt, 4096)
    assert (c["salt"], c["iterations"]) == ("W22ZaJ0SNY7soEsUEjb6gQ==", 4096)
    assert base64.b64decode(c["stored_key"]) == stored
    assert base64.b64decode(c["server_key"]) == server


def test_credentials_follow_the_password():
    a = Broker().access
    a.add_user("ann", "first")
    assert _proves(a, "ann", "first")
    salt1 = a.scram_lookup("ann")[0]
    a.change_password("ann", "second")
    assert _proves(a, "ann", "second") and a.scram_lookup("ann")[0] != salt1
    a.set_user_tags("ann", ["monitoring"])  # no password given: the credentials stay
    assert _proves(a, "ann", "second")
    user = a.users["ann"]
    # the same hash put again (ctl set_user_tags sends it back): kept
    a.put_user("ann", password_hash=user.password_hash,
               hashing_algorithm=user.hashing_algorithm, tags=["management"])
    assert _proves(a, "ann", "second")
    # another hash: the old credentials would prove the old password, so they go
    a.put_user("ann", password_hash=hash_password("third"))
    assert a.scram_lookup("ann") is None
    assert a.authenticate("ann", "third") is not None
    a.put_user("ann", password="fourth")
    assert _proves(a, "ann", "fourth")
    a.clear_password("ann")
    assert a.scram_lookup("ann") is None


def test_unknown_users_get_stable_credentials_that_prove_nothing():
    a = Broker().access
    one, again = a.scram_lookup("nobody"), a.scram_lookup("nobody")
    assert one is not None and one == again
    assert a.scram_lookup("somebody else") != one
    salt, iterations, stored, server = one
    assert (stored, server) != _expected("", salt, iterations)


def test_definitions_with_a_password_or_a_hash():
    a = Broker().access
    a.import_({"users": [
        {"name": "pw", "password": "secret", "tags": ""},
        {"name": "hashed", "password_hash": hash_password("secret"), "tags": ""}]})
    assert _proves(a, "pw", "secret")
    assert a.scram_lookup("hashed") is None
    assert a.authenticate("hashed", "secret") is not None
    exported = a.export()
    assert all(set(u) == {"name", "password_hash", "hashing_algorithm", "tags", "limits"}
               for u in exported["users"])
    a.import_(exported)  # imported again: the same hashes, the credentials stay
    assert _proves(a, "pw", "secret")


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_credentials_survive_restarts(kind, tmp_path):
    url = "journal" if kind == "journal" else f"sqlite:///{tmp_path}/store.db"
    seen = []

    def life(body):
        async def main():
            store = open_store(url, str(tmp_path))
            await store.open()
            broker = Broker(Config(data_dir=str(tmp_path)), store)
            broker.recover()
            body(broker.access)
            done = trio.Event()
            store.when_durable(done.set)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.run)
                await done.wait()
                nursery.cancel_scope.cancel()
            await store.close()
        trio.run(main)

    def first(a):
        a.add_user("ann", "pw")
        seen.append(a.scram_lookup("ann"))

    def second(a):
        assert a.scram_lookup("ann") == seen[0]
        assert _proves(a, "ann", "pw")
    life(first)
    life(second)
