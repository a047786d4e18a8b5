"""What the composition root hands the features: typed services, never the whole ``Broker``.

Each feature declares here, as a ``Protocol``, the services it uses (read-only: a feature
never replaces one); ``Services`` is the one object ``Broker.__init__`` builds, which has
them all, and hands to each feature's constructor (``Scheduler``, ``Transactions``,
``Hermes``, ``AuditTrail``). A service a feature needs beyond these (the policies, built
after the features that come before them) is its own constructor argument. Not here: the
broker's wiring lists (publish hooks, recovery hooks, background tasks), which each
feature's ``install`` fills, and anything a feature owns itself.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .audit.recorder import AuditTrail
    from .config import Config
    from .persistence.base import Store
    from .publishing import Publishing
    from .recovery_progress import RecoveryProgress
    from .security import AccessControl
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


class HermesServices(RoutingServices, Protocol):
    """What Hermes (``hermes.service.Hermes``, its HTTP routes and front end) uses."""

    @property
    def config(self) -> Config: ...
    @property
    def store(self) -> Store: ...
    @property
    def access(self) -> AccessControl: ...
    @property
    def alarms(self) -> set[str]: ...
    @property
    def audit(self) -> AuditTrail | None: ...


class AuditServices(RoutingServices, Protocol):
    """What the audit trail (``audit.recorder.AuditTrail``, its stream sink) uses besides
    the policies (its own constructor argument)."""

    @property
    def set_alarm(self) -> Callable[[str, bool], None]: ...


@dataclass(eq=False)
class Services:
    """The broker's services, built once by ``Broker.__init__`` (the same objects as its
    attributes: ``vhosts`` is the live registry, ``alarms`` the live set of raised alarms,
    read only). ``audit`` is set by the root once the trail is installed (it follows the
    features built before it); None while it is off."""

    config: Config
    timers: TimerQueue
    vhosts: dict[str, VirtualHost]
    store: Store
    publishing: Publishing
    recovery: RecoveryProgress
    access: AccessControl
    alarms: set[str]
    set_alarm: Callable[[str, bool], None]
    audit: AuditTrail | None = None
