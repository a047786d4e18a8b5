"""Clustering (docs/cluster.md): nodes coordinated through etcd.

``etcd`` is the coordination client (a typed ``Coordinator``), ``node`` a node's
membership, queue masterships and fencing, ``store`` the store wrapper that keeps
definitions and metadata in etcd, ``tools`` the ``cluster`` subcommand.
"""
from __future__ import annotations

from .settings import ClusterConfigError, ClusterSettings, build_settings


def _settings(args) -> ClusterSettings:
    return build_settings(args.cluster, args.node_name, args.advertise, args.host, args.port,
                          args.cluster_secret_file, args.cluster_ttl)


def cluster_problem(args) -> str | None:
    """One line saying what is wrong with the cluster options, or None."""
    try:
        _settings(args)
    except ClusterConfigError as exc:
        return str(exc)
    return None


def clustered_store(store, args):
    """``store`` wrapped for the cluster named by the command line (checked before)."""
    from .etcd import EtcdGateway
    from .node import ClusterNode
    from .store import ClusterStore
    settings = _settings(args)
    coord = EtcdGateway(settings.endpoints, settings.etcd_timeout)
    return ClusterStore(store, coord, ClusterNode(coord, settings))
