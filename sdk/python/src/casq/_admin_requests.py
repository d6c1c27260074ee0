"""The AdminService requests built from Python values, checked before any call (shared by both Admins)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Literal

from casq._messages import to_duration
from casq.v1 import admin_service_pb2, queue_config_pb2

Seconds = float | datetime.timedelta
SubscriptionStartName = Literal["earliest", "latest"]

_STARTS: dict[str, admin_service_pb2.SubscriptionStart.ValueType] = {
    "earliest": admin_service_pb2.SUBSCRIPTION_START_EARLIEST,
    "latest": admin_service_pb2.SUBSCRIPTION_START_LATEST,
}


def subscription_start(start: str) -> admin_service_pb2.SubscriptionStart.ValueType:
    """The proto enum value of ``"earliest"`` or ``"latest"``."""
    try:
        return _STARTS[start]
    except KeyError:
        raise ValueError(f"start must be 'earliest' or 'latest', not {start!r}") from None


def build_config(
    *,
    lease_ttl: Seconds | None = None,
    max_attempts: int | None = None,
    backoff_initial: Seconds | None = None,
    backoff_max: Seconds | None = None,
    backoff_multiplier: float | None = None,
    backoff_jitter: float | None = None,
    dedup_window: Seconds | None = None,
    retention: Seconds | None = None,
) -> queue_config_pb2.QueueConfig:
    """A QueueConfig with only the given fields set (unset ones: defaults, or unchanged on update)."""
    config = queue_config_pb2.QueueConfig()
    if lease_ttl is not None:
        config.lease_ttl.CopyFrom(to_duration(lease_ttl))
    if max_attempts is not None:
        config.max_attempts = max_attempts
    if backoff_initial is not None:
        config.backoff.initial_delay.CopyFrom(to_duration(backoff_initial))
    if backoff_max is not None:
        config.backoff.max_delay.CopyFrom(to_duration(backoff_max))
    if backoff_multiplier is not None:
        config.backoff.multiplier = backoff_multiplier
    if backoff_jitter is not None:
        config.backoff.jitter = backoff_jitter
    if dedup_window is not None:
        config.dedup_window.CopyFrom(to_duration(dedup_window))
    if retention is not None:
        config.retention.CopyFrom(to_duration(retention))
    return config


def redrive_request(
    queue: str, subscription: str, ids: Sequence[str] | None, limit: int
) -> admin_service_pb2.RedriveDeadLettersRequest:
    """All dead letters when ``ids`` is None (up to ``limit`` if set), else those ids."""
    if isinstance(ids, str):
        raise TypeError("ids must be a sequence of message ids, not a string")
    request = admin_service_pb2.RedriveDeadLettersRequest(queue=queue, subscription=subscription, limit=limit)
    if ids is None:
        request.all = True
    else:
        request.ids.extend(ids)
    return request


def purge_request(
    queue: str, subscription: str | None, all_subscriptions: bool, dead_letters: bool
) -> admin_service_pb2.PurgeQueueRequest:
    """Exactly one of ``subscription`` and ``all_subscriptions``, checked before any call."""
    if (subscription is None) == (not all_subscriptions):
        raise ValueError("purge needs exactly one of subscription and all_subscriptions=True")
    return admin_service_pb2.PurgeQueueRequest(
        queue=queue, subscription=subscription or "", all_subscriptions=all_subscriptions, dead_letters=dead_letters
    )
