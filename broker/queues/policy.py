"""A queue's policies: the definition in force and switching a running queue to new
options; not policy matching or validation (broker/policies)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from . import max_length
from .args import QueueOptions, with_policy
from .message_groups import GROUPS_ARGUMENT
from .message_groups import reconfigure as reconfigure_groups

if TYPE_CHECKING:
    from ..timers import TimerHandle
    from ..vhost import VirtualHost
    from .entry import QueueEntry
    from .flow import FlowWaiter
    from .queue import Queue
    from .retry import RetryPolicy
    from .ttl import ExpiryTimer
    from .types import QueueType


def make_retry(queue: Queue) -> RetryPolicy | None:
    try:
        from .retry import make_retry_policy
    except ImportError:
        return None
    return make_retry_policy(queue)


class PolicyQueue:
    """Mixed into ``Queue``: what these methods use of it."""
    vhost: VirtualHost
    queue_type: QueueType
    arguments: dict[str, Any]
    opts: QueueOptions
    _base_opts: QueueOptions
    policy: str | None
    operator_policy: str | None
    effective_policy_definition: dict[str, Any]
    retry: RetryPolicy | None
    deleted: bool
    _expires_handle: TimerHandle | None
    _expiry: ExpiryTimer
    flow_waiters: set[FlowWaiter] | None

    def touch(self) -> None:
        raise NotImplementedError

    def expire_ready(self, now: float) -> None:
        raise NotImplementedError

    def discard(self, entries: list[QueueEntry], reason: str) -> None:
        raise NotImplementedError

    def flow_check(self) -> None:
        raise NotImplementedError

    def apply_policy(self, policy: str | None, operator_policy: str | None,
                     definition: dict[str, Any]) -> None:
        """Run with this (validated) policy definition, operator policy merged in, from
        now on (``{}``: none). What RabbitMQ's classic queues do on a policy change: a
        lower max-length drops or dead-letters the overflowing head (drop-head only), a
        new DLX serves the next dead letters, a message TTL applies to messages enqueued
        from now on, an expiry restarts the idle timer, a delivery limit counts from the
        deliveries already made. Arguments keep their precedence (``args.with_policy``)."""
        self.policy = policy
        self.operator_policy = operator_policy
        self.effective_policy_definition = dict(definition)
        self.reconfigure(self.queue_type.effective(
            with_policy(self._base_opts, self.arguments, definition)))

    def reconfigure(self, opts: QueueOptions) -> None:
        """Switch to ``opts`` (the policy-controlled fields may differ; the priority and
        single-active-consumer fields must not, as no policy sets them)."""
        if self.deleted:
            return
        old, self.opts = self.opts, opts
        limit = opts.extra.get("x-delivery-limit")
        if opts.extra.get(GROUPS_ARGUMENT) != old.extra.get(GROUPS_ARGUMENT):
            reconfigure_groups(cast("Queue", self))  # a policy's message-groups (a mixin of Queue)
        if self.retry is not None:
            self.retry.set_limit(limit)
            if self.retry.idle:
                self.retry = None
        elif limit is not None:
            self.retry = make_retry(cast("Queue", self))
        if opts.expires is None:
            if self._expires_handle is not None:
                self._expires_handle.cancel()
                self._expires_handle = None
        elif opts.expires != old.expires or self._expires_handle is None:
            self.touch()
        if opts.message_ttl is not None or old.message_ttl is not None:
            self.expire_ready(self.vhost.timers.now())
            self._expiry.arm()
        if opts.overflow == "drop-head" and max_length.is_limited(opts):
            dropped = max_length.drop_head(cast("Queue", self))
            if dropped:
                self.discard(dropped, "maxlen")
                self._expiry.arm()
                if self.flow_waiters:
                    self.flow_check()
