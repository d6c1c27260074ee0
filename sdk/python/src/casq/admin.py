"""Admin: queues, subscriptions, statistics and dead letters (synchronous).

Every method goes through :meth:`casq.Client.call`, so it follows leader
redirects and fails over between brokers like the producer does. Changes are
safe to resend (the server leaves shards that already have the requested
state alone), which is what makes those retries safe.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from casq._messages import to_duration
from casq.client import Client, Metadata
from casq.v1 import admin_service_pb2, admin_service_pb2_grpc, queue_config_pb2

_R = TypeVar("_R")
_AdminCall = Callable[[admin_service_pb2_grpc.AdminServiceStub, Metadata], _R]

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


class Admin:
    """The casq AdminService over a :class:`casq.Client` (redirects and failover included).

    Durations are float seconds or ``timedelta``. Methods return the generated
    ``casq.v1.admin_service_pb2`` responses, except the paged lists (every page,
    as a list) and :meth:`get_document` (the document's bytes).
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    def list_queues(self) -> list[admin_service_pb2.QueueSummary]:
        """Every queue in the store, sorted by name."""
        queues: list[admin_service_pb2.QueueSummary] = []
        token = ""
        while True:
            request = admin_service_pb2.ListQueuesRequest(page_size=1000, page_token=token)
            page = self._call(lambda stub, md: stub.ListQueues(request, timeout=self.client.timeout, metadata=md))
            queues.extend(page.queues)
            token = page.next_page_token
            if not token:
                return queues

    def get_queue(self, queue: str) -> admin_service_pb2.GetQueueResponse:
        """A queue's config, totals, per-subscription figures and shards (with their leaders)."""
        request = admin_service_pb2.GetQueueRequest(queue=queue)
        return self._call(lambda stub, md: stub.GetQueue(request, timeout=self.client.timeout, metadata=md))

    def create_queue(
        self,
        queue: str,
        shards: int = 1,
        *,
        lease_ttl: Seconds | None = None,
        max_attempts: int | None = None,
        backoff_initial: Seconds | None = None,
        backoff_max: Seconds | None = None,
        backoff_multiplier: float | None = None,
        backoff_jitter: float | None = None,
        dedup_window: Seconds | None = None,
        retention: Seconds | None = None,
    ) -> admin_service_pb2.CreateQueueResponse:
        """Creates a queue with ``shards`` shards and the subscription ``default``; unset fields take defaults."""
        config = build_config(
            lease_ttl=lease_ttl,
            max_attempts=max_attempts,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            backoff_multiplier=backoff_multiplier,
            backoff_jitter=backoff_jitter,
            dedup_window=dedup_window,
            retention=retention,
        )
        request = admin_service_pb2.CreateQueueRequest(queue=queue, shard_count=shards, config=config)
        return self._call(lambda stub, md: stub.CreateQueue(request, timeout=self.client.timeout, metadata=md))

    def update_queue(
        self,
        queue: str,
        *,
        lease_ttl: Seconds | None = None,
        max_attempts: int | None = None,
        backoff_initial: Seconds | None = None,
        backoff_max: Seconds | None = None,
        backoff_multiplier: float | None = None,
        backoff_jitter: float | None = None,
        dedup_window: Seconds | None = None,
        retention: Seconds | None = None,
    ) -> admin_service_pb2.UpdateQueueResponse:
        """Changes the given config fields in every shard; the others keep their values."""
        config = build_config(
            lease_ttl=lease_ttl,
            max_attempts=max_attempts,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            backoff_multiplier=backoff_multiplier,
            backoff_jitter=backoff_jitter,
            dedup_window=dedup_window,
            retention=retention,
        )
        request = admin_service_pb2.UpdateQueueRequest(queue=queue, config=config)
        return self._call(lambda stub, md: stub.UpdateQueue(request, timeout=self.client.timeout, metadata=md))

    def delete_queue(self, queue: str, *, force: bool = False) -> admin_service_pb2.DeleteQueueResponse:
        """Deletes a queue; without ``force`` it must hold no unsettled messages or dead letters."""
        request = admin_service_pb2.DeleteQueueRequest(queue=queue, force=force)
        return self._call(lambda stub, md: stub.DeleteQueue(request, timeout=self.client.timeout, metadata=md))

    def create_subscription(
        self, queue: str, subscription: str, *, start: SubscriptionStartName = "latest"
    ) -> admin_service_pb2.CreateSubscriptionResponse:
        """Adds a subscription reading from the ``"latest"`` message on, or the ``"earliest"`` still stored."""
        request = admin_service_pb2.CreateSubscriptionRequest(
            queue=queue, subscription=subscription, start=subscription_start(start)
        )
        return self._call(lambda stub, md: stub.CreateSubscription(request, timeout=self.client.timeout, metadata=md))

    def delete_subscription(self, queue: str, subscription: str) -> admin_service_pb2.DeleteSubscriptionResponse:
        """Removes a subscription with its leases, ack state and dead letters."""
        request = admin_service_pb2.DeleteSubscriptionRequest(queue=queue, subscription=subscription)
        return self._call(lambda stub, md: stub.DeleteSubscription(request, timeout=self.client.timeout, metadata=md))

    def purge(
        self,
        queue: str,
        subscription: str | None = None,
        *,
        all_subscriptions: bool = False,
        dead_letters: bool = False,
    ) -> admin_service_pb2.PurgeQueueResponse:
        """Throws away the unsettled work of ``subscription`` (or of all), or their dead letters."""
        request = purge_request(queue, subscription, all_subscriptions, dead_letters)
        return self._call(lambda stub, md: stub.PurgeQueue(request, timeout=self.client.timeout, metadata=md))

    def list_dead_letters(self, queue: str, subscription: str = "default") -> list[admin_service_pb2.DeadLetter]:
        """Every dead letter of the subscription: shard by shard, oldest first within a shard."""
        letters: list[admin_service_pb2.DeadLetter] = []
        token = ""
        while True:
            request = admin_service_pb2.ListDeadLettersRequest(
                queue=queue, subscription=subscription, page_size=1000, page_token=token
            )
            page = self._call(lambda stub, md: stub.ListDeadLetters(request, timeout=self.client.timeout, metadata=md))
            letters.extend(page.dead_letters)
            token = page.next_page_token
            if not token:
                return letters

    def redrive(
        self, queue: str, subscription: str = "default", *, ids: Sequence[str] | None = None, limit: int = 0
    ) -> admin_service_pb2.RedriveDeadLettersResponse:
        """Makes dead letters runnable again: all of them (``ids=None``) or those ids, at most ``limit`` if set."""
        request = redrive_request(queue, subscription, ids, limit)
        return self._call(lambda stub, md: stub.RedriveDeadLetters(request, timeout=self.client.timeout, metadata=md))

    def get_document(self, queue: str, shard: int = 0) -> bytes:
        """The raw stored JSON document of one shard, its chunks put back together."""
        request = admin_service_pb2.GetDocumentRequest(queue=queue, shard=shard)

        def read(address: str) -> bytes:
            # The whole stream is read inside one attempt so that a retry starts over.
            stream = self.client.admin_stub(address).GetDocument(
                request, timeout=self.client.timeout, metadata=self.client.metadata()
            )
            return b"".join(chunk.chunk for chunk in stream)

        return self.client.call(read)

    def _call(self, fn: _AdminCall[_R]) -> _R:
        metadata = self.client.metadata()
        return self.client.call(lambda address: fn(self.client.admin_stub(address), metadata))

