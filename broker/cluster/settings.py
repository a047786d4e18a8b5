"""Cluster options (``--cluster``, ``--node-name``, ...) and their validation."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit


class ClusterConfigError(ValueError):
    """A cluster option is wrong; the message is one line naming the option."""


@dataclass
class ClusterSettings:
    endpoints: list[str]  # etcd client endpoints "host:port"
    prefix: str  # key prefix of this cluster in etcd, "/name/" (one etcd can hold several)
    node_name: str
    advertise: str  # host:port other nodes and `cluster status` show for this node's AMQP
    secret: bytes | None = None  # the cluster secret (like RabbitMQ's Erlang cookie)
    ttl: float = 5.0  # node lease: a node that stops renewing is gone after this long
    etcd_timeout: float = 2.0  # one etcd request, per endpoint


def parse_cluster_url(url: str) -> tuple[list[str], str]:
    """``etcd://HOST:2379[,HOST2:2379]/PREFIX`` -> (endpoints, "/PREFIX/")."""
    parts = urlsplit(url)
    if parts.scheme != "etcd":
        raise ClusterConfigError(f"--cluster {url}: expected etcd://HOST:PORT[,HOST:PORT]/PREFIX")
    endpoints = []
    for item in parts.netloc.split(","):
        item = item.strip()
        if not item:
            continue
        host, _, port = item.rpartition(":")
        if not host:
            host, port = item, "2379"
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ClusterConfigError(f"--cluster {url}: invalid port in {item!r}")
        endpoints.append(f"{host}:{port}")
    if not endpoints:
        raise ClusterConfigError(f"--cluster {url}: no etcd endpoint")
    prefix = unquote(parts.path).strip("/") or "triomq"
    return endpoints, f"/{prefix}/"


def read_secret(path: str) -> bytes:
    """The secret in ``path`` (surrounding whitespace ignored), at least 16 bytes."""
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise ClusterConfigError(f"--cluster-secret-file {path}: {exc.strerror or exc}") from None
    if len(secret) < 16:
        raise ClusterConfigError(f"--cluster-secret-file {path}: the secret must be at least "
                                 f"16 bytes")
    return secret


def build_settings(url: str, node_name: str | None, advertise: str | None, amqp_host: str,
                   amqp_port: int, secret_file: str | None, ttl: float) -> ClusterSettings:
    endpoints, prefix = parse_cluster_url(url)
    if not node_name:
        raise ClusterConfigError("--cluster needs --node-name NAME")
    if not all(c.isalnum() or c in "-_.@" for c in node_name):
        raise ClusterConfigError(f"--node-name {node_name!r}: use letters, digits, '-', '_', '.', '@'")
    if advertise is None:
        host = amqp_host if amqp_host not in ("", "0.0.0.0", "::", "*") else socket.gethostname()
        advertise = f"{host}:{amqp_port}"
    elif ":" not in advertise or not advertise.rpartition(":")[2].isdigit():
        raise ClusterConfigError(f"--advertise {advertise}: expected HOST:PORT")
    secret = read_secret(secret_file) if secret_file else None
    return ClusterSettings(endpoints, prefix, node_name, advertise, secret, ttl)
