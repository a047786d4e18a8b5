"""What a broker imports before it listens: only what serving AMQP with the options it was given
needs. A feature whose port or option is off (MQTT, STOMP, the audit trail, the cluster), and
libraries used only at a feature's first use (consumer selectors' parser, Avro schemas, cron
schedules), are imported when used, not at every start: each costs tens of milliseconds of
a restart's time to listening (docs/performance-durability.md)."""
from __future__ import annotations

import json
import subprocess
import sys

# The modules ``triomq run`` imports to build the broker and its AMQP listener, then the
# broker built from the command line's defaults (HTTP API on 15672, Stream on 5552, AMQP 1.0
# by protocol header) on the embedded journal. The process prints which of ``heavy`` it holds.
PROBE = """
import json, sys, tempfile
from broker.cli import build_parser
args = build_parser().parse_args(["run", "--data-dir", tempfile.mkdtemp()] + sys.argv[2:])
from broker.broker import Broker
from broker.config import AuditSettings, Config
from broker.listeners.amqp import run_server
from broker.persistence import open_store
config = Config(data_dir=args.data_dir, store=args.store, http_port=15672, stream_port=5552,
                mqtt_port=args.mqtt_port, stomp_port=args.stomp_port,
                audit=AuditSettings(dir=args.audit_dir))
Broker(config, open_store(config.store, config.data_dir, config.flush, config.journal,
                          config.sql))
heavy = json.loads(sys.argv[1])
print(json.dumps(sorted(m for m in heavy if m in sys.modules)))
"""

# imported by nothing a default broker needs to listen
HEAVY = [
    "broker.listeners.mqtt", "broker.listeners.mqtt_session", "broker.mqtt.connection",  # MQTT
    "broker.listeners.stomp", "broker.listeners.stomp_session",  # STOMP
    "broker.audit.recorder", "broker.audit.hooks",  # the audit trail (--audit-dir)
    "broker.cluster.node", "broker.cluster.etcd", "httpx",  # the cluster's coordinator
    "sqlalchemy",  # the SQL stores (the journal is the default)
    "proton",  # a client library (tests, interop), never the broker's
    "lark",  # consumer selectors (x-filter): at the first one
    "fastavro",  # Avro schemas (exchanges, Hermes topics, the trail): at the first one
    "croniter",  # cron schedules: at the first one
]


def imported(*options: str, heavy: list[str] = HEAVY) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(heavy), *options],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_default_broker_imports_no_feature_it_does_not_serve():
    assert imported() == []


def test_a_feature_turned_on_is_imported_with_the_broker(tmp_path):
    """The same probe sees what an option brings in (the probe does not just miss them)."""
    assert imported("--mqtt-port", "1883", "--stomp-port", "61613",
                    "--audit-dir", str(tmp_path / "audit"),
                    heavy=["broker.listeners.mqtt", "broker.listeners.stomp",
                           "broker.audit.recorder"]) == [
        "broker.audit.recorder", "broker.listeners.mqtt", "broker.listeners.stomp"]
