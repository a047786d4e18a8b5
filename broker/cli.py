"""Command line: ``python -m broker run --host H --port P --data-dir DIR [--store URL]``."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import NoReturn

import trio

from .config import AuditSettings, Config, JournalSettings, SQLSettings


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _seconds_or_zero(text: str) -> float:
    """Seconds, or 0 for 'never'."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: never): {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triomq", description="TrioMQ, an AMQP 0-9-1 broker on trio")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the broker")
    run.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    run.add_argument("--port", type=int, default=5672, help="AMQP port (default 5672)")
    run.add_argument("--data-dir", default="./data", help="data directory (default ./data)")
    run.add_argument("--workers", default="1", metavar="N|auto",
                     help="broker processes sharing the client ports, one broker to clients "
                          "(default 1; auto: one per core; docs/performance.md)")
    run.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    run.add_argument("--private-port", type=int, default=None, help=argparse.SUPPRESS)
    run.add_argument("--store", default=None,
                     help="storage backend (persistence.base registry): journal (default), "
                          "journal:DIR, memory, sqlite:///file, postgresql+psycopg://..., "
                          "mysql+pymysql://...")
    run.add_argument("--flush", choices=("sync", "async"), default="sync",
                     help="sync: fsync before confirming (default); async: fsync every few ms")
    run.add_argument("--heartbeat", type=int, default=60, help="heartbeat the server proposes (s)")
    run.add_argument("--memory-limit", type=int, default=None,
                     help="block publishers above this RSS in bytes (default 0.4 of RAM)")
    run.add_argument("--log-level", default=os.environ.get("TRIOMQ_LOG_LEVEL", "INFO"))
    journal = JournalSettings()
    run.add_argument("--journal-segment-size", type=_positive, default=journal.segment_size,
                     metavar="BYTES", help="journal segment file size (default 32 MiB)")
    run.add_argument("--journal-checkpoint-bytes", type=_positive, metavar="BYTES",
                     default=journal.checkpoint_bytes,
                     help="journal bytes between checkpoints (default 64 MiB)")
    run.add_argument("--journal-checkpoint-records", type=_positive, metavar="N",
                     default=journal.checkpoint_records,
                     help="journal records between checkpoints (default 250000): bounds "
                          "the log a restart after a crash replays")
    run.add_argument("--queue-memory-budget", type=_positive, metavar="BYTES",
                     default=journal.queue_memory_budget,
                     help="bytes of ready messages a durable queue keeps in memory before "
                          "paging (default 32 MiB)")
    run.add_argument("--max-message-size", type=_positive, metavar="BYTES",
                     default=Config.max_message_size,
                     help="largest message body accepted (default 128 MiB)")
    run.add_argument("--consumer-timeout", type=int, metavar="MS", default=Config.consumer_timeout,
                     help="a delivery unacknowledged this long closes its channel (406) and is "
                          "requeued (default 1800000: 30 minutes; 0: never)")
    sql = SQLSettings()
    run.add_argument("--sql-lease", type=_seconds, default=sql.lease, metavar="S",
                     help="SQL store: lease time of the store lock (default 10 s)")
    run.add_argument("--sql-renew", type=_seconds, default=sql.renew, metavar="S",
                     help="SQL store: seconds between lease renewals (default 3 s)")
    run.add_argument("--sql-timeout", type=_seconds, default=sql.timeout, metavar="S",
                     help="SQL store: statement / idle transaction / write timeout (default 10 s)")
    run.add_argument("--sql-max-unwritten", type=_positive, default=sql.max_unwritten,
                     metavar="BYTES", help="SQL store: message bytes that may wait for the database "
                                           "before publishers are blocked (default 128 MiB)")
    run.add_argument("--sql-standby", action="store_true",
                     help="SQL store: wait for the lease of a running broker to expire "
                          "instead of exiting (ActiveMQ's slave)")
    run.add_argument("--http-port", type=int, default=None, metavar="PORT",
                     help="management HTTP API, /metrics and web console port (default 15672; "
                          "0 disables it)")
    run.add_argument("--http-host", default=None, metavar="HOST",
                     help="address of the HTTP listener (default: the AMQP --host)")
    run.add_argument("--http-max-body", type=_positive, default=Config.http_max_body,
                     metavar="BYTES", help="largest HTTP request body (default 20 MiB)")
    run.add_argument("--http-timeout", type=_seconds, default=Config.http_timeout, metavar="S",
                     help="HTTP request body / socket read timeout (default 30 s)")
    run.add_argument("--http-tls", action="store_true",
                     help="serve the HTTP listener over TLS (HTTPS) with the --tls-* options")
    run.add_argument("--metrics-auth", action="store_true",
                     help="/metrics needs the basic credentials of a user tagged monitoring or "
                          "administrator (default: no login, as rabbitmq_prometheus)")
    run.add_argument("--metrics-per-object", action="store_true",
                     help="/metrics labels each queue (default: aggregated, as "
                          "rabbitmq_prometheus; /metrics/per-object always labels them)")
    run.add_argument("--hermes-port", type=int, default=None, metavar="PORT",
                     help="Hermes frontend: POST /topics/{topic} on a lean listener of its own "
                          "(default: publishing only on the --http-port)")
    run.add_argument("--mqtt-port", type=int, default=None, metavar="PORT",
                     help="MQTT 3.1/3.1.1 listener port (default: no MQTT listener)")
    run.add_argument("--mqtts-port", type=int, default=None, metavar="PORT",
                     help="MQTT over TLS listener port (needs --tls-cert and --tls-key)")
    run.add_argument("--mqtt-ws-port", type=int, default=None, metavar="PORT",
                     help="MQTT over WebSockets listener port, path /ws (default: none)")
    run.add_argument("--mqtt-wss-port", type=int, default=None, metavar="PORT",
                     help="MQTT over secure WebSockets (needs --tls-cert and --tls-key)")
    run.add_argument("--mqtt-sys-interval", type=_seconds_or_zero, default=Config.mqtt_sys_interval,
                     metavar="S", help="publish the $SYS topics every S seconds (default 10; "
                                       "0: never)")
    run.add_argument("--mqtt-exchange", default=Config.mqtt_exchange, metavar="NAME",
                     help="topic exchange MQTT publishes go to (default amq.topic)")
    run.add_argument("--mqtt-prefetch", type=_positive, default=Config.mqtt_prefetch,
                     metavar="N", help="QoS 1 deliveries in flight per MQTT subscription "
                                       "(default 10)")
    run.add_argument("--stomp-port", type=int, nargs="?", const=61613, default=None,
                     metavar="PORT", help="STOMP 1.0/1.1/1.2 listener port (61613 when given "
                                          "without a port; default: no STOMP listener)")
    run.add_argument("--stomps-port", type=int, default=None, metavar="PORT",
                     help="STOMP over TLS listener port (needs --tls-cert and --tls-key)")
    run.add_argument("--stomp-ws-port", type=int, default=None, metavar="PORT",
                     help="STOMP over WebSockets listener port, path /ws (default: none)")
    run.add_argument("--stomp-wss-port", type=int, default=None, metavar="PORT",
                     help="STOMP over secure WebSockets (needs --tls-cert and --tls-key)")
    run.add_argument("--stream-port", type=int, metavar="PORT",
                     default=(int(os.environ["TRIOMQ_STREAM_PORT"])
                              if os.environ.get("TRIOMQ_STREAM_PORT") else None),
                     help="RabbitMQ Stream protocol listener port (default 5552, skipped with "
                          "a warning when taken; 0: none; default from $TRIOMQ_STREAM_PORT "
                          "when set, which the test suites set to 0)")
    run.add_argument("--stream-tls-port", type=int, default=None, metavar="PORT",
                     help="Stream protocol over TLS, e.g. 5551 (needs --tls-cert and --tls-key)")
    run.add_argument("--stream-advertised-host", default=None, metavar="HOST",
                     help="host Stream clients are told to connect to (default: the address "
                          "they connected to)")
    run.add_argument("--no-amqp10", action="store_true",
                     help="do not serve AMQP 1.0 clients on the AMQP port (by default an AMQP "
                          "1.0 protocol header there is served as AMQP 1.0, as RabbitMQ 4 does)")
    run.add_argument("--amqp10-port", type=int, default=None, metavar="PORT",
                     help="an AMQP 1.0 listener port of its own (default: none)")
    run.add_argument("--amqps10-port", type=int, default=None, metavar="PORT",
                     help="AMQP 1.0 over TLS listener port (needs --tls-cert and --tls-key)")
    run.add_argument("--amqp10-anonymous-user", default=None, metavar="USER",
                     help="accept SASL ANONYMOUS AMQP 1.0 logins as USER (default: refused)")
    run.add_argument("--tls-cert", default=None, metavar="PEM",
                     help="server certificate (chain) for the TLS listeners")
    run.add_argument("--tls-key", default=None, metavar="PEM",
                     help="private key of --tls-cert")
    run.add_argument("--tls-ca", default=None, metavar="PEM",
                     help="CA bundle that signs client certificates (see --tls-verify)")
    run.add_argument("--tls-port", type=int, default=None, metavar="PORT",
                     help="AMQP over TLS (amqps) listener port, e.g. 5671 (needs --tls-cert "
                          "and --tls-key; default: none)")
    run.add_argument("--tls-verify", choices=("peer", "none"), default=None,
                     help="peer: verify client certificates against --tls-ca (default when "
                          "--tls-ca is given); none: do not ask for one")
    run.add_argument("--tls-fail-if-no-peer-cert", action="store_true",
                     help="with --tls-verify peer: refuse TLS clients without a certificate")
    run.add_argument("--default-user", default="guest", metavar="NAME",
                     help="user created on first start, administrator (default guest)")
    run.add_argument("--default-pass", default="guest", metavar="PASSWORD",
                     help="its password (default guest)")
    run.add_argument("--loopback-users", default="guest", metavar="NAMES",
                     help="comma-separated users who may only connect from localhost "
                          "(default guest; 'none' for nobody)")
    run.add_argument("--oauth2-resource-server-id", default=None, metavar="ID",
                     help="accept OAuth 2 JWT access tokens as passwords (AMQP, MQTT) and "
                          "Bearer tokens (HTTP): the audience they must have and the default "
                          "scope prefix ID. (docs/security.md)")
    run.add_argument("--oauth2-scope-prefix", default=None, metavar="PREFIX",
                     help="scope prefix (default: the resource server id and a dot)")
    run.add_argument("--oauth2-signing-key", action="append", default=[], metavar="KID=FILE",
                     help="a token signing key: PEM public key (RS256/ES256) or a file holding "
                          "an HS256 secret; repeatable")
    run.add_argument("--oauth2-default-key", default=None, metavar="KID",
                     help="the key for tokens without a kid")
    run.add_argument("--oauth2-jwks-url", default=None, metavar="URL",
                     help="fetch signing keys from this JWKS URL (again on unknown kids)")
    run.add_argument("--oauth2-preferred-username-claims", default="", metavar="CLAIMS",
                     help="comma-separated claims naming the user (then sub, client_id)")
    run.add_argument("--oauth2-extra-scopes-source", default=None, metavar="CLAIM",
                     help="another claim holding scopes")
    run.add_argument("--oauth2-no-verify-aud", action="store_true",
                     help="do not require the resource server id in the token's aud")
    run.add_argument("--oauth2-introspection-url", default=None, metavar="URL",
                     help="accept opaque OAuth 2 tokens: ask this RFC 7662 introspection "
                          "endpoint about them (answers cached until the token's exp)")
    run.add_argument("--oauth2-introspection-client-id", default=None, metavar="ID",
                     help="the client id of the broker at the introspection endpoint")
    run.add_argument("--oauth2-introspection-client-secret", default=None, metavar="SECRET",
                     help="its client secret (or the environment's "
                          "TRIOMQ_OAUTH2_INTROSPECTION_CLIENT_SECRET)")
    run.add_argument("--management-oauth-client-id", default=None, metavar="ID",
                     help="the console logs in with OAuth 2 (authorization code + PKCE) as "
                          "this public client of --management-oauth-provider-url")
    run.add_argument("--management-oauth-provider-url", default=None, metavar="URL",
                     help="the OpenID provider (issuer) of the console's OAuth 2 login; its "
                          "/.well-known/openid-configuration names the endpoints")
    run.add_argument("--management-oauth-scopes", default="openid profile", metavar="SCOPES",
                     help="space-separated scopes the console asks for (default "
                          "'openid profile')")
    run.add_argument("--load-definitions", default=None, metavar="JSON",
                     help="import users, vhosts, permissions, topic permissions and limits "
                          "from a RabbitMQ definitions file at start")
    audit = AuditSettings()
    run.add_argument("--audit-dir", default=None, metavar="DIR",
                     help="write the audit trail (Avro, docs/audit.md) under DIR: every queue "
                          "unless a policy sets audit=false")
    run.add_argument("--audit-scope", choices=("all", "policy"), default=audit.scope,
                     help="all (default): audit every queue; policy: only queues whose "
                          "policy sets audit=true")
    run.add_argument("--audit-policy", choices=("block", "drop"), default=audit.policy,
                     help="when the audit writer falls behind: block publishers (default) "
                          "or drop events and count them")
    run.add_argument("--audit-node", default="", metavar="NAME",
                     help="node name in the trail and its partitions (default: host name)")
    run.add_argument("--audit-roll-bytes", type=_positive, default=audit.roll_bytes,
                     metavar="BYTES", help="roll audit files past this size (default 64 MiB)")
    run.add_argument("--audit-roll-seconds", type=_seconds, default=audit.roll_seconds,
                     metavar="S", help="roll audit files after this long (default 300 s)")
    run.add_argument("--audit-codec", choices=("deflate", "null"), default=audit.codec,
                     help="Avro block codec of the audit files (default deflate)")
    run.add_argument("--audit-stream", default=None, metavar="NAME",
                     help="also append the audit trail (JSON lines) to stream NAME of vhost "
                          "/, created if missing, for spark.audit reconcile --follow")
    run.add_argument("--cluster", default=None, metavar="URL",
                     help="join the cluster coordinated by etcd://HOST:2379[,HOST:2379]/PREFIX "
                          "(docs/cluster.md; default: a single node, no etcd)")
    run.add_argument("--node-name", default=None, metavar="NAME",
                     help="this node's name in the cluster (needed with --cluster)")
    run.add_argument("--advertise", default=None, metavar="HOST:PORT",
                     help="AMQP address other nodes and clients are told (default --host:--port)")
    run.add_argument("--cluster-secret-file", default=None, metavar="FILE",
                     help="the cluster secret (like RabbitMQ's Erlang cookie): nodes with "
                          "another secret are refused")
    run.add_argument("--cluster-ttl", type=_seconds, default=5.0, metavar="S",
                     help="node lease: a node that stops renewing is gone after this (default 5 s)")
    for extension in _extensions():
        extension.add_subcommands(sub)
    return parser


def _extensions():
    """Modules that contribute subcommands (store tools, scheduler management)."""
    import importlib
    found = []
    for name in ("broker.persistence.tools", "broker.scheduler.tools", "broker.ctl",
                 "broker.cluster.tools"):
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return found


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        if args.workers != "1":
            from .cluster.workers import supervise
            return supervise(args, list(sys.argv[1:] if argv is None else argv))
        return _run(args)
    handler = getattr(args, "handler", None)  # set by the subcommands that have one
    if handler is not None:
        return handler(args)
    return 2


def _tls_problem(args) -> str | None:
    """One line saying what is wrong with the TLS options, or None."""
    if args.mqtts_port is not None and not (args.tls_cert and args.tls_key):
        return "--mqtts-port needs --tls-cert and --tls-key"
    if args.mqtt_wss_port is not None and not (args.tls_cert and args.tls_key):
        return "--mqtt-wss-port needs --tls-cert and --tls-key"
    if args.stomps_port is not None and not (args.tls_cert and args.tls_key):
        return "--stomps-port needs --tls-cert and --tls-key"
    if args.stomp_wss_port is not None and not (args.tls_cert and args.tls_key):
        return "--stomp-wss-port needs --tls-cert and --tls-key"
    if args.stream_tls_port is not None and not (args.tls_cert and args.tls_key):
        return "--stream-tls-port needs --tls-cert and --tls-key"
    if args.amqps10_port is not None and not (args.tls_cert and args.tls_key):
        return "--amqps10-port needs --tls-cert and --tls-key"
    for option, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key),
                         ("--tls-ca", args.tls_ca)):
        if path and not os.path.isfile(path):
            return f"{option} {path}: no such file"
    if args.mqtts_port is not None or args.mqtt_wss_port is not None or \
            args.stomps_port is not None or args.stomp_wss_port is not None:
        from .security.tls import TLSConfigError, server_context
        try:  # the same context as amqps (--tls-verify, --tls-fail-if-no-peer-cert)
            server_context(_tls_config(args))
        except TLSConfigError as exc:
            option = ("--mqtts-port" if args.mqtts_port is not None else "--mqtt-wss-port"
                      if args.mqtt_wss_port is not None else "--stomps-port"
                      if args.stomps_port is not None else "--stomp-wss-port")
            return f"{option}: {exc}"
    return None


def _tls_config(args) -> Config:
    """The TLS options of the command line, as the broker's config will hold them."""
    return Config(tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
                  tls_verify=args.tls_verify,
                  tls_fail_if_no_peer_cert=args.tls_fail_if_no_peer_cert)


def _security_problem(args) -> str | None:
    """One line saying what is wrong with the amqps / user options, or None."""
    from .security.tls import TLSConfigError, server_context
    if args.tls_port is not None:
        if not 0 <= args.tls_port <= 65535:
            return f"invalid --tls-port {args.tls_port}"
        try:
            server_context(_tls_config(args))
        except TLSConfigError as exc:
            return f"--tls-port: {exc}"
    if not args.default_user:
        return "--default-user must not be empty"
    if args.load_definitions:
        from .security.definitions import read_definitions
        from .security.model import DefinitionError
        try:
            read_definitions(args.load_definitions)
        except DefinitionError as exc:
            return f"--load-definitions {args.load_definitions}: {exc}"
    return None


def _loopback_users(text: str) -> tuple[str, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(u.strip() for u in text.split(",") if u.strip())


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _run(args) -> int:
    # The server's modules are imported here, not at the top: every other subcommand (ctl,
    # store and scheduler tools) is a short-lived process that would pay ~1.5 s to import them.
    # The broker's own (below) once its store has started connecting (Store.open_early): the
    # round trips to a database overlap them.
    from .listeners import ListenError
    from .persistence import StoreUnavailable, open_store

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 0 <= args.port <= 65535:
        print(f"triomq: error: invalid port {args.port}", file=sys.stderr)
        return 2
    if args.http_port is not None and not 0 <= args.http_port <= 65535:
        print(f"triomq: error: invalid --http-port {args.http_port}", file=sys.stderr)
        return 2
    for option, value in (("--mqtt-port", args.mqtt_port), ("--mqtts-port", args.mqtts_port),
                          ("--mqtt-ws-port", args.mqtt_ws_port),
                          ("--mqtt-wss-port", args.mqtt_wss_port),
                          ("--stomp-port", args.stomp_port), ("--stomps-port", args.stomps_port),
                          ("--stomp-ws-port", args.stomp_ws_port),
                          ("--stomp-wss-port", args.stomp_wss_port),
                          ("--stream-port", args.stream_port),
                          ("--stream-tls-port", args.stream_tls_port),
                          ("--amqp10-port", args.amqp10_port),
                          ("--amqps10-port", args.amqps10_port),
                          ("--hermes-port", args.hermes_port)):
        if value is not None and not 0 <= value <= 65535:
            print(f"triomq: error: invalid {option} {value}", file=sys.stderr)
            return 2
    if args.cluster:
        from .cluster import cluster_problem
        problem = cluster_problem(args)
        if problem:
            print(f"triomq: error: {problem}", file=sys.stderr)
            return 2
    tls_problem = _tls_problem(args) or _security_problem(args)
    if tls_problem:
        print(f"triomq: error: {tls_problem}", file=sys.stderr)
        return 2
    if args.audit_stream and not args.audit_dir:
        print("triomq: error: --audit-stream needs --audit-dir (the stream is a copy of the "
              "trail)", file=sys.stderr)
        return 2
    if args.audit_dir:
        try:
            import numpy  # noqa: F401 - the trail's writer encodes with it
        except ImportError:
            print("triomq: error: --audit-dir needs numpy (pip install numpy)", file=sys.stderr)
            return 2
        try:
            os.makedirs(args.audit_dir, exist_ok=True)
            if not os.access(args.audit_dir, os.W_OK):
                raise PermissionError(13, "not writable")
        except OSError as exc:
            print(f"triomq: error: --audit-dir {args.audit_dir}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    config = Config(host=args.host, port=args.port, data_dir=args.data_dir, store=args.store,
                    reuse_port=args.reuse_port, private_port=args.private_port,
                    heartbeat=args.heartbeat, memory_limit_bytes=args.memory_limit,
                    flush=args.flush, max_message_size=args.max_message_size,
                    consumer_timeout=args.consumer_timeout,
                    journal=JournalSettings(segment_size=args.journal_segment_size,
                                            checkpoint_bytes=args.journal_checkpoint_bytes,
                                            checkpoint_records=args.journal_checkpoint_records,
                                            queue_memory_budget=args.queue_memory_budget),
                    sql=SQLSettings(lease=args.sql_lease, renew=args.sql_renew,
                                    timeout=args.sql_timeout, standby=args.sql_standby,
                                    max_unwritten=args.sql_max_unwritten),
                    # the default port is optional (a RabbitMQ may hold 15672 on this machine)
                    http_port=(15672 if args.http_port is None else args.http_port or None),
                    http_optional=args.http_port is None, http_host=args.http_host,
                    http_max_body=args.http_max_body, http_timeout=args.http_timeout,
                    http_tls=args.http_tls, metrics_auth=args.metrics_auth,
                    metrics_per_object=args.metrics_per_object,
                    oauth2_resource_server_id=args.oauth2_resource_server_id,
                    oauth2_scope_prefix=args.oauth2_scope_prefix,
                    oauth2_signing_keys=tuple(tuple(k.split("=", 1))  # type: ignore[misc]
                                              for k in args.oauth2_signing_key if "=" in k),
                    oauth2_default_key=args.oauth2_default_key,
                    oauth2_jwks_url=args.oauth2_jwks_url,
                    oauth2_preferred_username_claims=tuple(
                        c for c in args.oauth2_preferred_username_claims.split(",") if c),
                    oauth2_extra_scopes_source=args.oauth2_extra_scopes_source,
                    oauth2_verify_aud=not args.oauth2_no_verify_aud,
                    oauth2_introspection_url=args.oauth2_introspection_url,
                    oauth2_introspection_client_id=args.oauth2_introspection_client_id,
                    oauth2_introspection_client_secret=(
                        args.oauth2_introspection_client_secret
                        or os.environ.get("TRIOMQ_OAUTH2_INTROSPECTION_CLIENT_SECRET")),
                    management_oauth_client_id=args.management_oauth_client_id,
                    management_oauth_provider_url=args.management_oauth_provider_url,
                    management_oauth_scopes=args.management_oauth_scopes,
                    mqtt_port=args.mqtt_port, mqtts_port=args.mqtts_port, hermes_port=args.hermes_port,
                    mqtt_exchange=args.mqtt_exchange, mqtt_prefetch=args.mqtt_prefetch,
                    mqtt_ws_port=args.mqtt_ws_port, mqtt_wss_port=args.mqtt_wss_port,
                    mqtt_sys_interval=args.mqtt_sys_interval,
                    stomp_port=args.stomp_port, stomps_port=args.stomps_port,
                    stomp_ws_port=args.stomp_ws_port, stomp_wss_port=args.stomp_wss_port,
                    # the default Stream port is optional (RabbitMQ may hold 5552 here)
                    stream_port=(5552 if args.stream_port is None else args.stream_port or None),
                    stream_optional=args.stream_port is None,
                    stream_tls_port=args.stream_tls_port,
                    stream_advertised_host=args.stream_advertised_host,
                    amqp10=not args.no_amqp10, amqp10_port=args.amqp10_port,
                    amqps10_port=args.amqps10_port,
                    amqp10_anonymous_user=args.amqp10_anonymous_user,
                    tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
                    tls_port=args.tls_port, tls_verify=args.tls_verify,
                    tls_fail_if_no_peer_cert=args.tls_fail_if_no_peer_cert,
                    default_user=args.default_user, default_pass=args.default_pass,
                    loopback_users=_loopback_users(args.loopback_users),
                    load_definitions=args.load_definitions,
                    audit=AuditSettings(dir=args.audit_dir, scope=args.audit_scope,
                                        policy=args.audit_policy, node=args.audit_node,
                                        roll_bytes=args.audit_roll_bytes,
                                        roll_seconds=args.audit_roll_seconds,
                                        codec=args.audit_codec,
                                        stream=args.audit_stream))
    try:
        os.makedirs(config.data_dir, exist_ok=True)
    except OSError as exc:
        print(f"triomq: error: cannot create data dir {config.data_dir}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        store = open_store(config.store, config.data_dir, config.flush, config.journal,
                           config.sql)
        if args.cluster:
            from .cluster import clustered_store
            store = clustered_store(store, args)
        else:
            store.open_early()
        from .broker import Broker
        from .listeners.amqp import run_server
        broker = Broker(config, store)
        trio.run(run_server, broker, config.host, config.port)
    except KeyboardInterrupt:
        pass
    except BaseException as exc:  # trio wraps failures of its tasks in exception groups
        from .listeners.amqp import describe_listen_error
        from .management.http import HttpListenError
        leaf = _leaf(exc)
        if isinstance(leaf, StoreUnavailable):
            print(f"triomq: error: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, HttpListenError):
            print(f"triomq: error: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, ListenError):
            print(f"triomq: error: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, OSError):
            print(f"triomq: error: {describe_listen_error(leaf, config.host, config.port)}",
                  file=sys.stderr)
            return 1
        raise
    return 0


def entry() -> NoReturn:
    """``python -m broker`` and the ``triomq`` script: ``main`` as the process's exit."""
    code = main()
    if threading.active_count() > 1:
        # trio's worker threads outlive trio.run: idle ones in its cache, and any abandoned
        # on cancel (a lease renewal or reconnect stuck on a silent database) still inside
        # its driver. CPython 3.11 finalising with the latter alive can crash (SIGSEGV),
        # so leave without finalising once the output is flushed.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
