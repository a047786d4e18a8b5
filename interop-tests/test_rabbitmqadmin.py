"""Debian's /usr/bin/rabbitmqadmin, unmodified, against TrioMQ's management API: list,
declare, delete, publish, get, export, import (and ctl verbs end to end)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from brokerproc import REPO_ROOT, BrokerProc

ADMIN = "/usr/bin/rabbitmqadmin"


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("starts its own TrioMQ with the HTTP API")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProc(tmp_path_factory.mktemp("admin") / "data", store="memory", http=True)
    proc.start()
    yield proc
    proc.stop()


def admin(broker, *args, check=True) -> str:
    if not shutil.which(ADMIN):
        pytest.skip("rabbitmqadmin is not installed")
    p = subprocess.run([sys.executable, ADMIN, "-H", "127.0.0.1", "-P", str(broker.http_port),
                        *args], capture_output=True, text=True, timeout=60)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout + p.stderr


def test_declare_publish_get_list_delete(broker):
    assert "queue declared" in admin(broker, "declare", "queue", "name=adm-q", "durable=true",
                                     'arguments={"x-max-length": 100}')
    assert "exchange declared" in admin(broker, "declare", "exchange", "name=adm-x", "type=topic")
    assert "binding declared" in admin(broker, "declare", "binding", "source=adm-x",
                                       "destination=adm-q", "routing_key=a.#")
    assert "Message published" in admin(broker, "publish", "exchange=adm-x", "routing_key=a.b",
                                         "payload=hello")
    out = json.loads(admin(broker, "-f", "raw_json", "list", "queues", "name", "messages"))
    assert {"name": "adm-q", "messages": 1} in out
    got = admin(broker, "get", "queue=adm-q", "ackmode=ack_requeue_false")
    assert "hello" in got
    bindings = json.loads(admin(broker, "-f", "raw_json", "list", "bindings"))
    key = next(b["properties_key"] for b in bindings if b["source"] == "adm-x")
    assert "binding deleted" in admin(broker, "delete", "binding", "source=adm-x",
                                      "destination_type=queue", "destination=adm-q",
                                      f"properties_key={key}")
    out = admin(broker, "list", "exchanges", "name", "type")
    assert "adm-x" in out and "topic" in out
    assert "queue purged" in admin(broker, "purge", "queue", "name=adm-q")
    assert "queue deleted" in admin(broker, "delete", "queue", "name=adm-q")
    assert "exchange deleted" in admin(broker, "delete", "exchange", "name=adm-x")
    out = admin(broker, "delete", "queue", "name=adm-q", check=False)
    assert "Not found: /api/queues/%2F/adm-q" in out


def test_users_vhosts_permissions_policies(broker):
    admin(broker, "declare", "vhost", "name=adm-vh")
    admin(broker, "declare", "user", "name=adm-u", "password=pw", "tags=monitoring")
    admin(broker, "declare", "permission", "vhost=adm-vh", "user=adm-u", "configure=.*",
          "write=.*", "read=.*")
    admin(broker, "declare", "policy", "--vhost=adm-vh", "name=adm-p", "pattern=^q",
          'definition={"max-length": 5}', "apply-to=queues")
    assert "adm-p" in admin(broker, "list", "policies")
    assert "adm-u" in admin(broker, "list", "users")
    out = admin(broker, "-u", "adm-u", "-p", "pw", "list", "vhosts")
    assert "adm-vh" in out
    admin(broker, "delete", "policy", "--vhost=adm-vh", "name=adm-p")
    admin(broker, "delete", "user", "name=adm-u")
    admin(broker, "delete", "vhost", "name=adm-vh")


def test_export_import(broker, tmp_path):
    admin(broker, "declare", "queue", "name=adm-exp", "durable=true")
    path = tmp_path / "defs.json"
    assert "Exported definitions" in admin(broker, "export", str(path))
    defs = json.loads(path.read_text())
    assert any(q["name"] == "adm-exp" for q in defs["queues"])
    admin(broker, "delete", "queue", "name=adm-exp")
    assert "Uploaded definitions" in admin(broker, "import", str(path))
    assert "adm-exp" in admin(broker, "list", "queues", "name")
    admin(broker, "delete", "queue", "name=adm-exp")


def test_ctl_end_to_end(broker, tmp_path):
    env = dict(os.environ, TRIOMQ_URL=broker.http_url)

    def ctl(*args):
        return subprocess.run([sys.executable, "-m", "broker", "ctl", *args], cwd=str(REPO_ROOT),
                              capture_output=True, text=True, timeout=60, env=env)

    assert ctl("add_user", "ctl-u", "pw").returncode == 0
    assert ctl("set_user_tags", "ctl-u", "management").returncode == 0
    assert ctl("set_permissions", "ctl-u", ".*", ".*", ".*").returncode == 0
    p = ctl("authenticate_user", "ctl-u", "pw")
    assert p.returncode == 0 and "Success" in p.stdout
    p = ctl("authenticate_user", "ctl-u", "bad")
    assert p.returncode == 65
    p = ctl("--formatter", "json", "list_users")
    assert {"user": "ctl-u", "tags": ["management"]} in json.loads(p.stdout)
    admin(broker, "declare", "queue", "name=ctl-q")
    p = ctl("list_queues", "name", "messages", "consumers")
    assert p.stdout.splitlines()[1:] == ["name\tmessages\tconsumers", "ctl-q\t0\t0"]
    assert ctl("list_queues", "nosuchcol").returncode == 64
    assert ctl("purge_queue", "ctl-q").returncode == 0
    p = ctl("delete_queue", "ctl-q")
    assert p.returncode == 0 and "deleted with 0 messages" in p.stdout
    assert ctl("set_policy", "ctl-p", "^q", '{"max-length": 3}').returncode == 0
    p = ctl("set_policy", "bad", "(", "{}")
    assert p.returncode == 65 and p.stderr.count("\n") == 1
    assert "ctl-p" in ctl("list_policies").stdout
    assert ctl("clear_policy", "ctl-p").returncode == 0
    out = tmp_path / "d.json"
    assert ctl("export_definitions", str(out)).returncode == 0
    assert ctl("import_definitions", str(out)).returncode == 0
    assert ctl("delete_user", "ctl-u").returncode == 0
    p = ctl("delete_user", "ctl-u")
    assert p.returncode == 67 and p.stderr.strip() == 'Error: User "ctl-u" does not exist'
    p = ctl("add_vhost", "ctl-vh")
    assert p.returncode == 0
    assert ctl("delete_vhost", "ctl-vh").returncode == 0
    assert "triomq@localhost" in ctl("status").stdout
    dead = dict(env, TRIOMQ_URL="http://127.0.0.1:9")
    p = subprocess.run([sys.executable, "-m", "broker", "ctl", "list_users"], cwd=str(REPO_ROOT),
                       capture_output=True, text=True, timeout=60, env=dead)
    assert p.returncode == 69 and len(p.stderr.strip().splitlines()) == 1


def test_quorum_queue_with_admin_and_ctl(broker):
    """rabbitmqadmin declares a quorum queue; ctl lists its type and sets a policy that
    applies to quorum queues only."""
    admin(broker, "declare", "queue", "name=adm-qq", "durable=true", "queue_type=quorum")
    admin(broker, "declare", "queue", "name=adm-cq", "durable=true")
    env = dict(os.environ, TRIOMQ_URL=broker.http_url)

    def ctl(*args):
        return subprocess.run([sys.executable, "-m", "broker", "ctl", *args], cwd=str(REPO_ROOT),
                              capture_output=True, text=True, timeout=60, env=env)

    p = ctl("list_queues", "name", "type")
    rows = p.stdout.splitlines()[1:]
    assert "adm-qq\tquorum" in rows and "adm-cq\tclassic" in rows, p.stdout
    p = ctl("set_policy", "adm-p", "^adm-", '{"max-length": 3}', "--apply-to", "quorum_queues")
    assert p.returncode == 0, p.stderr
    p = ctl("list_queues", "name", "policy")
    rows = p.stdout.splitlines()[1:]
    assert "adm-qq\tadm-p" in rows and "adm-cq\t" in rows, p.stdout
    assert ctl("clear_policy", "adm-p").returncode == 0
    admin(broker, "delete", "queue", "name=adm-qq")
    admin(broker, "delete", "queue", "name=adm-cq")
