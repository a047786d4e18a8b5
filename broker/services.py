"""What the composition root hands the features: typed services, never the whole ``Broker``.

Each feature declares here, as a ``Protocol``, the services it uses (read-only: a feature
never replaces one); ``Services`` is the one object ``Broker.__init__`` builds, which has
them all, and hands to each feature's constructor (``Scheduler``, ``Transactions``,
``Hermes``, ``AuditTrail``, ``Policies``, ``AccessControl``, the management's
``HttpServer``, ``MessageTotals``, ``Sampler`` and metrics collectors; the cluster's
copies of streams). A service a feature needs beyond these (the policies, built after the
features that come before them; the management's message totals) is its own constructor
argument. Not here: the broker's wiring
lists (publish hooks, recovery hooks, metadata restorers, background tasks), which each
feature's ``install`` fills, and anything a feature owns itself. The protocol listeners'
sessions and the management API's request handlers are the edge: they keep the ``Broker``
(docs/architecture.md, "Extension points").
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .audit.recorder import AuditTrail
    from .churn import Churn
    from .config import Config
    from .persistence.base import Store
    from .publishing import Publishing
    from .recovery_progress import RecoveryProgress
    from .security import AccessControl
    from .streams.log import StreamStore
    from .timers import TimerQueue
    from .vhost import VirtualHost


class RoutingServices(Protocol):
    """What every feature here uses: the vhosts registry and the one publish path."""

    @property
    def vhosts(self) -> dict[str, VirtualHost]: ...
    @property
    def publishing(self) -> Publishing: ...


class TransactionServices(RoutingServices, Protocol):
    """What the half messages (``transactions.core.Transactions``) use."""

    @property
    def timers(self) -> TimerQueue: ...


class SchedulerServices(TransactionServices, Protocol):
    """What the scheduler (``scheduler.core.Scheduler``) uses."""

    @property
    def config(self) -> Config: ...
    @property
    def store(self) -> Store: ...
    @property
    def recovery(self) -> RecoveryProgress: ...
    @property
    def audit(self) -> AuditTrail | None: ...


class OperatorServices(Protocol):
    """What the features facing operators and HTTP clients (Hermes, the metrics) read: the
    config, the store, the access control and the raised alarms."""

    @property
    def config(self) -> Config: ...
    @property
    def store(self) -> Store: ...
    @property
    def access(self) -> AccessControl: ...
    @property
    def alarms(self) -> set[str]: ...


class HermesServices(RoutingServices, OperatorServices, Protocol):
    """What Hermes (``hermes.service.Hermes``, its HTTP routes and front end) uses."""

    @property
    def audit(self) -> AuditTrail | None: ...


class AuditServices(RoutingServices, Protocol):
    """What the audit trail (``audit.recorder.AuditTrail``, its stream sink) uses besides
    the policies (its own constructor argument)."""

    @property
    def set_alarm(self) -> Callable[[str, bool], None]: ...


class PolicyServices(Protocol):
    """What the policies (``policies.registry.Policies``) use: the vhosts they apply to and
    the store their records are kept in."""

    @property
    def vhosts(self) -> dict[str, VirtualHost]: ...
    @property
    def store(self) -> Store: ...


class AccessServices(PolicyServices, Protocol):
    """What the access control (``security.access.AccessControl``) uses besides the
    policies': the vhosts it creates, and the live connections it closes when their user or
    vhost is deleted."""

    @property
    def sessions(self) -> set[Any]: ...
    @property
    def create_vhost(self) -> Callable[[str], VirtualHost]: ...


class StatsServices(Protocol):
    """What the management's counters and sampler (``management.stats``) read."""

    @property
    def vhosts(self) -> dict[str, VirtualHost]: ...
    @property
    def sessions(self) -> set[Any]: ...
    @property
    def churn(self) -> Churn: ...


class MetricsServices(StatsServices, RoutingServices, OperatorServices, Protocol):
    """What the Prometheus collectors (``management.metrics_collectors``) read besides the
    message totals and the scheduler (their own arguments)."""

    @property
    def recovery(self) -> RecoveryProgress: ...


class StreamReplicaServices(Protocol):
    """What a cluster node's copy of a stream (``cluster.stream_replicas._Follower``) uses:
    the vhosts its stream is in and the stream logs it opens, hands over and forgets."""

    @property
    def vhosts(self) -> dict[str, VirtualHost]: ...
    @property
    def streams(self) -> StreamStore: ...


@dataclass(eq=False)
class Services:
    """The broker's services, built once by ``Broker.__init__`` (the same objects as its
    attributes: ``vhosts`` is the live registry, ``sessions`` the live connections,
    ``alarms`` the live set of raised alarms, read only). ``access`` is set by the root
    once the access control is built (from these services); ``audit`` once the trail is
    installed (it follows the features built before it), None while it is off."""

    config: Config
    timers: TimerQueue
    vhosts: dict[str, VirtualHost]
    store: Store
    publishing: Publishing
    recovery: RecoveryProgress
    alarms: set[str]
    set_alarm: Callable[[str, bool], None]
    sessions: set[Any]
    churn: Churn
    create_vhost: Callable[[str], VirtualHost]
    streams: StreamStore
    access: AccessControl = field(init=False)
    audit: AuditTrail | None = None
