"""Delayed and scheduled delivery: the x-delayed-message exchange and ActiveMQ-style schedules.

``install(broker)`` is called from ``Broker.__init__``: it registers the
``x-delayed-message`` exchange type, the retry queue arguments and the
``ScheduledQueue`` variant (so recovery recreates ``amq.triomq.scheduled`` as
one), adds the publish hook, a recovery hook so the scheduler arms its timer
right after recovery (before the listeners open), and the local control socket
task to ``broker.background_tasks`` (started by the server). Module map:
``core`` (docs/scheduler.md, "The scheduler's modules").
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import errors
from ..amqp import spec as amqp_spec
from ..malloc import trim
from .core import INTERNAL_QUEUE, ScheduledQueue, Scheduler
from .spec import AMQ_HEADERS, X_DELAY, ScheduleError, parse_amq, parse_delayed

if TYPE_CHECKING:
    from ..broker import Broker
    from ..services import SchedulerServices
    from ..vhost import VirtualHost

__all__ = ["INTERNAL_QUEUE", "ScheduledQueue", "Scheduler", "install"]

log = logging.getLogger("broker.scheduler")


_AMQ = frozenset(AMQ_HEADERS)


def _refuse(exc: ScheduleError):
    return errors.precondition_failed("invalid header '%s': %s", exc.header, exc.detail)


def make_publish_hook(scheduler: Scheduler):
    def hook(channel, message, mandatory: bool, seq: int) -> bool:
        headers = message.properties.get("headers")
        # every publish passes here (an MQTT one always has headers): one set operation
        # tells the common case, no scheduling header at all
        if not headers or (X_DELAY not in headers and _AMQ.isdisjoint(headers)):
            return False
        vhost = channel.vhost
        x = vhost.exchanges.get(message.exchange)
        delayed_exchange = x is not None and x.type_name == "x-delayed-message"
        try:
            if delayed_exchange and X_DELAY in headers:
                schedule = parse_delayed(headers)
            elif any(h in headers for h in AMQ_HEADERS):
                schedule = parse_amq(headers)
            else:
                return False
        except ScheduleError as exc:
            raise _refuse(exc) from None
        if schedule is None:
            return False  # x-delay 0 / AMQ delay 0: route now, as usual
        if schedule.kind == "amq" and mandatory and not vhost.route(
                message.exchange, message.routing_key, message):
            # nothing to route to now: tell the publisher and do not schedule
            channel.send_return(message, amqp_spec.NO_ROUTE, "NO_ROUTE")
            if seq:
                channel.confirm_decided(seq, True)
            return True
        # the delay runs from the message's arrival: the time its bytes were read, not the
        # moment the broker's turn came for it (later in a burst of publishes)
        lag = scheduler.timers.since_received()
        scheduler.schedule(vhost, message, schedule,
                           scheduler.clock() - lag if lag else None)
        if schedule.kind == "delay" and mandatory:
            # the plugin cannot route at publish time: mandatory always comes back NO_ROUTE
            channel.send_return(message, amqp_spec.NO_ROUTE, "NO_ROUTE")
        if seq:
            q = scheduler.queues.get(vhost.name)
            if q is not None and q.store is not None and message.persistent:
                q.store.when_durable(
                    lambda s=seq: channel.confirm_decided(s, True, external=True),
                    on_failure=lambda s=seq: channel.confirm_decided(s, False, external=True))
            else:
                channel.confirm_decided(seq, True)
        return True

    return hook


def _recovered_queue(broker: Broker, vhost: VirtualHost, name: str, **_queue_kwargs) -> ScheduledQueue:
    """Queue-variant factory: the stored internal queue comes back as a ScheduledQueue
    (its arguments are the variant's own, not the stored ones)."""
    return broker.scheduler.new_queue(vhost)


def install(broker: Broker, services: SchedulerServices) -> Scheduler:
    """The scheduler on the root's ``services``, wired into ``broker``'s hooks and tasks;
    ``Broker.__init__`` keeps it as ``broker.scheduler``."""
    from ..exchanges import register_exchange_type
    from ..exchanges.delayed import DelayedMessageExchange
    from ..persistence.recovery import register_queue_variant
    from ..queues import retry  # noqa: F401  registers x-retry-delays & co.

    register_exchange_type(DelayedMessageExchange)
    scheduler = Scheduler(services)
    broker.publish_hooks.append(make_publish_hook(scheduler))

    register_queue_variant(INTERNAL_QUEUE, _recovered_queue)
    broker.recovery_hooks.append(scheduler.recovered)

    from .control import serve_control

    async def control_task():
        await serve_control(services.config.data_dir, scheduler)

    broker.background_tasks.append(control_task)
    broker.background_tasks.append(lambda: write_index(scheduler))
    return scheduler


INDEX_POLL = 1.0  # seconds between checks of whether the timer index is due
LOG_POLL = 0.1  # seconds between writes of the index log when no group commit writes it


async def write_index(scheduler: Scheduler) -> None:
    """Keep the timer index on disk (checkpoint.py) current: after enough changes, and
    once more at a clean stop; and write what the index log (indexlog.py) buffered that
    no group commit wrote (flush="async", recovery's read-backs). A failed write costs
    the next start time, nothing else."""
    import trio

    from . import checkpoint

    path = scheduler.index_path()
    if path is None:
        return

    async def write_now() -> None:
        snap = scheduler.take_index()
        try:
            await trio.to_thread.run_sync(checkpoint.write, path, snap)
        except OSError as exc:
            log.warning("scheduler: cannot write the timer index %s: %s", path, exc.strerror)
            return
        scheduler.index_written(snap)

    last = trio.current_time()
    if scheduler.recovery_seconds:
        # recovery is over (this task starts after it): what the store and the other
        # recovery hooks freed after the scheduler's own trim goes back too
        trim()
    try:
        while True:
            await trio.sleep(LOG_POLL)
            if scheduler.index_log is not None:
                scheduler.index_log.flush()
            now = trio.current_time()
            if now - last >= INDEX_POLL and scheduler.index_due(now, last):
                last = now
                await write_now()
    finally:
        with trio.CancelScope(shield=True):
            if scheduler.changes:
                await write_now()
            if scheduler.index_log is not None:
                scheduler.index_log.close()
