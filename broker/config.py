"""Broker settings, filled from the command line."""
from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024


@dataclass
class JournalSettings:
    """Tuning of the journal store (``--journal-*`` and ``--queue-memory-budget``)."""
    segment_size: int = 32 * MiB  # bytes per segment file (tests use small segments)
    checkpoint_bytes: int = 64 * MiB  # journal bytes written between checkpoints
    # ... or records, whichever comes first: what a kill -9 leaves to replay is bounded by
    # records (about 5 us each), not bytes (a 64 MiB log of acks is 3 million records)
    checkpoint_records: int = 250_000
    # A segment older than the checkpoint with at least this fraction of dead bytes has its
    # live messages rewritten forward, so a few old messages never pin a whole file and
    # compaction writes at most (1 - fraction) of the bytes it frees.
    compact_dead_fraction: float = 0.5
    # bytes appended but not yet written that the journal holds before publishers are
    # blocked with a resource alarm (they are unblocked below half of it)
    max_unwritten: int = 64 * MiB
    # Bytes of ready messages per durable FIFO queue kept in memory; the rest stay paged
    # in the journal and are read back in order when needed.
    queue_memory_budget: int = 32 * MiB


@dataclass
class SQLSettings:
    """Fault handling of the SQL store (``--sql-*``); see docs/sql-store.md "Lease"."""
    lease: float = 10.0  # seconds a lease is valid after each renewal
    renew: float = 3.0  # seconds between renewals (well under ``lease``)
    # statement_timeout / idle_in_transaction_session_timeout (PostgreSQL),
    # idle_transaction_timeout / innodb_lock_wait_timeout / read+write timeouts (MariaDB),
    # and the longest the broker waits for one write before it counts as failed
    timeout: float = 10.0
    keepalive_idle: int = 5  # TCP keepalives of the store's connections (s, s, probes)
    keepalive_interval: int = 2
    keepalive_count: int = 3
    retry_max: float = 2.0  # longest pause between reconnect attempts while the database is down
    # body bytes that may wait for the database (an outage's backlog) before publishers are
    # blocked with a resource alarm; they are unblocked below half of it
    max_unwritten: int = 128 * 1024 * 1024
    batch_bytes: int = 8 * 1024 * 1024  # body bytes of one transaction at most (one message more)
    standby: bool = False  # wait at start until the lease is free instead of exiting
    # A durable FIFO queue's backlog stays in the database beyond its first ``page_window``
    # entries and is read ahead ``page_size`` entries at a time as consumers drain it.
    page_window: int = 5000
    page_size: int = 2000


@dataclass
class AuditSettings:
    """The audit trail (``--audit-*``, docs/audit.md); off while ``dir`` is None."""
    dir: str | None = None  # where the Avro files go (Hive-style partitions)
    scope: str = "all"  # all: every queue unless its policy says audit=false; policy: only audit=true
    policy: str = "block"  # writer behind: block publishers, or drop (and count) events
    node: str = ""  # the trail's node name; "" is the host name
    roll_bytes: int = 64 * MiB
    roll_seconds: float = 300.0
    codec: str = "deflate"
    # also append the trail, as JSON lines, to this stream of vhost "/" (None: files only)
    stream: str | None = None
    buffer_events: int = 65536  # events held for the writer before the policy applies
    # events serialised at once on the event loop, while what they name is still in the
    # CPU's cache (a 50 ms batch is not); frames wait in memory for the drain task
    chunk_events: int = 1024
    flush_interval: float = 0.05  # seconds between batches written to the spool
    spool_max: int = 1 << 30  # spool bytes the converter may lag behind before the policy applies
    stop_timeout: float = 30.0  # at shutdown, seconds the converter gets to finish the spool


@dataclass
class Config:
    host: str = "0.0.0.0"
    port: int = 5672
    # --workers: SO_REUSEPORT on the AMQP and HTTP listeners (the kernel spreads connections
    # over the processes), and a second AMQP listener on 127.0.0.1:private_port for the links
    reuse_port: bool = False
    private_port: int | None = None
    data_dir: str = "./data"
    store: str | None = None  # None: the embedded journal
    flush: str = "sync"  # sync: fsync before confirm; async: periodic fsync
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    handshake_timeout: float = 10.0
    close_timeout: float = 3.0
    # RabbitMQ's vm_memory_high_watermark default: 0.4 of the machine's memory
    memory_high_watermark: float = 0.4
    memory_limit_bytes: int | None = None  # overrides the fraction when set
    disk_free_limit: int = 50 * 1024 * 1024
    # free heap the broker keeps for the next burst; more is given back to the system
    free_heap_kept: int = 32 * 1024 * 1024
    log_level: str = "INFO"
    # AMQP: the largest message body accepted (406 PRECONDITION_FAILED above it)
    max_message_size: int = 128 * 1024 * 1024
    # AMQP: octets of message bodies still being received that one connection may hold over
    # all its channels (the channel whose content would pass it is closed, 406); None: twice
    # max_message_size
    max_partial_bodies: int | None = None
    # AMQP: a delivery unacknowledged this long (ms) closes its channel (406) and is requeued;
    # RabbitMQ's consumer_timeout default, 30 minutes. None or 0: no broker-wide timeout
    # (queues may still set x-consumer-timeout or the consumer-timeout policy key). Checked
    # every ``consumer_timeout_interval`` seconds.
    consumer_timeout: int | None = 1_800_000
    consumer_timeout_interval: float = 1.0
    # Network edge: bytes asked of the socket per receive, and bytes queued for a client's
    # socket before its deliveries pause (publishers are not read above 4 times that).
    receive_size: int = 256 * 1024
    output_high_water: int = 1 << 20
    # Flow control (docs/architecture.md "Back-pressure"): a publish into a queue that has
    # consumers and more than ``flow_high`` ready messages puts the publishing connection
    # "in flow" (its socket is not read) until the queue is back to ``flow_low`` ready
    # messages. 0 disables flow control. Input is handed to the connection in slices of
    # ``flow_read_slice`` bytes, with a yield to other connections between slices.
    flow_high: int = 1000
    flow_low: int = 500
    # ... or more than ``flow_high_bytes`` of ready message bodies, until back to
    # ``flow_low_bytes`` (large messages: a few in flight, not a thousand MB)
    flow_high_bytes: int = 8 * 1024 * 1024
    flow_low_bytes: int = 4 * 1024 * 1024
    flow_read_slice: int = 64 * 1024
    # Scheduler: occurrences fired per timer callback before connections get the loop back.
    scheduler_fire_batch: int = 2000
    # Management HTTP API (docs/management.md): None disables the listener (the library
    # default; the command line's default is 15672); 0 picks a free port. ``http_host``
    # None listens where AMQP does. ``http_optional``: a busy port only logs a warning.
    http_port: int | None = None
    http_host: str | None = None
    http_optional: bool = False
    # Hermes frontend (docs/hermes.md): a lean listener for POST /topics/{topic} only; None:
    # publishing is served on the HTTP port alone. ``hermes_host`` None: where AMQP listens.
    hermes_port: int | None = None
    hermes_host: str | None = None
    http_max_body: int = 20 * MiB  # RabbitMQ's management.http.max_body_size default
    http_timeout: float = 30.0  # request body / each socket read, seconds
    http_tls: bool = False  # HTTPS with the tls_* options (broker/security/tls.py)
    # /metrics as rabbitmq_prometheus serves it: no login unless ``metrics_auth`` (a user
    # tagged monitoring or administrator), queue metrics aggregated unless
    # ``metrics_per_object`` (/metrics/per-object always labels each queue)
    metrics_auth: bool = False
    metrics_per_object: bool = False
    # MQTT listener (docs/mqtt.md): None disables it; 0 picks a free port. mqtts needs
    # ``tls_cert`` and ``tls_key`` (PEM files; ``tls_ca`` set: client certificates verified).
    mqtt_port: int | None = None
    mqtts_port: int | None = None
    mqtt_exchange: str = "amq.topic"
    mqtt_prefetch: int = 10  # QoS 1 deliveries in flight per subscription (RabbitMQ's default)
    # MQTT over WebSockets (listeners/mqtt_ws.py): path /ws, subprotocol mqtt; None: none.
    # wss uses the tls_* options as mqtts does.
    mqtt_ws_port: int | None = None
    mqtt_wss_port: int | None = None
    mqtt_sys_interval: float = 10.0  # $SYS topics every N seconds (Mosquitto's); 0: none
    # STOMP listener (docs/stomp.md): None disables it; 0 picks a free port. stomps uses
    # the tls_* options as amqps does.
    stomp_port: int | None = None
    stomps_port: int | None = None
    # STOMP over WebSockets (listeners/stomp_ws.py): path /ws, as RabbitMQ's Web STOMP
    stomp_ws_port: int | None = None
    stomp_wss_port: int | None = None
    # RabbitMQ Stream protocol (docs/streams.md): None disables it; 0 picks a free port.
    # ``stream_optional``: a port already taken only logs a warning (the CLI's default 5552,
    # which a RabbitMQ on the same machine may hold). stream_tls_port uses the tls_* options.
    stream_port: int | None = None
    stream_tls_port: int | None = None
    stream_optional: bool = False
    stream_frame_max: int = 1_048_576  # offered in Tune (RabbitMQ's default)
    stream_heartbeat: int = 60  # seconds, offered in Tune
    stream_advertised_host: str | None = None  # in Open and Metadata; None: the local address
    # AMQP 1.0 (docs/amqp10.md): on the AMQP port by protocol header (as RabbitMQ 4) unless
    # amqp10 is false, and on ports of its own when set (amqps10: the tls_* options).
    # amqp10_anonymous_user: the user of SASL ANONYMOUS logins (None: refused).
    amqp10: bool = True
    amqp10_port: int | None = None
    amqps10_port: int | None = None
    amqp10_anonymous_user: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    journal: JournalSettings = field(default_factory=JournalSettings)
    sql: SQLSettings = field(default_factory=SQLSettings)
    # Security (broker/security): the user created on first start, the users allowed from
    # loopback only (RabbitMQ's loopback_users), and the pause before a failed login's answer.
    default_user: str = "guest"
    default_pass: str = "guest"
    loopback_users: tuple[str, ...] = ("guest",)
    auth_failure_delay: float = 1.0
    # OAuth 2 / JWT tokens as passwords (rabbitmq_auth_backend_oauth2; docs/security.md):
    # on when resource_server_id is set; signing keys as (kid, PEM file) pairs and/or a JWKS URL
    oauth2_resource_server_id: str | None = None
    oauth2_scope_prefix: str | None = None  # default "<resource_server_id>."
    oauth2_signing_keys: tuple[tuple[str, str], ...] = ()
    oauth2_default_key: str | None = None
    oauth2_jwks_url: str | None = None
    oauth2_preferred_username_claims: tuple[str, ...] = ()
    oauth2_extra_scopes_source: str | None = None
    oauth2_verify_aud: bool = True
    # opaque tokens asked about at this RFC 7662 endpoint (basic auth: client id, secret)
    oauth2_introspection_url: str | None = None
    oauth2_introspection_client_id: str | None = None
    oauth2_introspection_client_secret: str | None = None
    # the console's OAuth 2 login (RabbitMQ's management.oauth_client_id,
    # management.oauth_provider_url, management.oauth_scopes): authorization code + PKCE
    # against this OpenID provider, the token then the API's Bearer token
    management_oauth_client_id: str | None = None
    management_oauth_provider_url: str | None = None
    management_oauth_scopes: str = "openid profile"
    load_definitions: str | None = None  # users/vhosts/permissions JSON imported at start
    # amqps (broker/security/tls.py): None = no TLS listener; 0 picks a free port. Uses
    # tls_cert/tls_key/tls_ca; tls_verify "peer" | "none" (None: "peer" when tls_ca is set).
    tls_port: int | None = None
    tls_verify: str | None = None
    tls_fail_if_no_peer_cert: bool = False
    audit: AuditSettings = field(default_factory=AuditSettings)
