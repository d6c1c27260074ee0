# Generated from casq/aio/admin.py by sdk/python/scripts/generate-sync.py (unasync): do not edit;
# edit the asyncio source and run the script again (tests/test_generated_sync.py checks it).
"""Admin: queues, subscriptions, statistics and dead letters.

Every method goes through ``Client.call``, so it follows leader redirects and
fails over between brokers like the producer does. Changes are safe to resend
(the server leaves shards that already have the requested state alone), which
is what makes those retries safe.

The asyncio casq/aio/admin.py is the source of the threaded casq/admin.py, which
sdk/python/scripts/generate-sync.py writes from it with unasync: edit that one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from casq._admin_requests import (
    Seconds,
    SubscriptionStartName,
    build_config,
    purge_request,
    redrive_request,
    subscription_start,
)
from casq.v1 import admin_service_pb2, admin_service_pb2_grpc

from ._concurrency import StubCall
from .client import Client

_R = TypeVar("_R")
if TYPE_CHECKING:  # the asyncio stub class exists only in the generated type stubs
    _AdminCall = StubCall[admin_service_pb2_grpc.AdminServiceStub, _R]

# The request builders, also importable from here.
__all__ = [
    "Admin",
    "Seconds",
    "SubscriptionStartName",
    "build_config",
    "purge_request",
    "redrive_request",
    "subscription_start",
]


class Admin:
    """The casq AdminService over a Client (redirects and failover included).

    Durations are float seconds or ``timedelta``. Methods return the generated
    ``casq.v1.admin_service_pb2`` responses, except the paged lists (every page,
    as a list) and :meth:`get_document` (the document's bytes). ``casq.aio.Admin``
    has the same methods, arguments and results, as coroutines.
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
        if_not_exists: bool = False,
    ) -> admin_service_pb2.CreateQueueResponse:
        """Creates a queue with ``shards`` shards and the subscription ``default``; unset fields take defaults.

        An existing queue raises :class:`casq.AlreadyExistsError`, unless ``if_not_exists``: then the
        existing queue is returned as it is (``created`` false; ``shards`` and the config are not applied).
        """
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
        request = admin_service_pb2.CreateQueueRequest(
            queue=queue, shard_count=shards, config=config, if_not_exists=if_not_exists
        )
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
        return self._call(
            lambda stub, md: stub.CreateSubscription(request, timeout=self.client.timeout, metadata=md)
        )

    def delete_subscription(self, queue: str, subscription: str) -> admin_service_pb2.DeleteSubscriptionResponse:
        """Removes a subscription with its leases, ack state and dead letters."""
        request = admin_service_pb2.DeleteSubscriptionRequest(queue=queue, subscription=subscription)
        return self._call(
            lambda stub, md: stub.DeleteSubscription(request, timeout=self.client.timeout, metadata=md)
        )

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
            page = self._call(
                lambda stub, md: stub.ListDeadLetters(request, timeout=self.client.timeout, metadata=md)
            )
            letters.extend(page.dead_letters)
            token = page.next_page_token
            if not token:
                return letters

    def redrive(
        self, queue: str, subscription: str = "default", *, ids: Sequence[str] | None = None, limit: int = 0
    ) -> admin_service_pb2.RedriveDeadLettersResponse:
        """Makes dead letters runnable again: all of them (``ids=None``) or those ids, at most ``limit`` if set."""
        request = redrive_request(queue, subscription, ids, limit)
        return self._call(
            lambda stub, md: stub.RedriveDeadLetters(request, timeout=self.client.timeout, metadata=md)
        )

    def get_document(self, queue: str, shard: int = 0) -> bytes:
        """The raw stored JSON document of one shard, its chunks put back together."""
        request = admin_service_pb2.GetDocumentRequest(queue=queue, shard=shard)
        metadata = self.client.metadata()

        def read(address: str) -> bytes:
            # The whole stream is read inside one attempt so that a retry starts over.
            stub = self.client.admin_stub(address)
            stream = stub.GetDocument(request, timeout=self.client.timeout, metadata=metadata)
            return b"".join([chunk.chunk for chunk in stream])

        return self.client.call(read)

    def _call(self, fn: _AdminCall[_R]) -> _R:
        metadata = self.client.metadata()

        def attempt(address: str) -> _R:
            return fn(self.client.admin_stub(address), metadata)

        return self.client.call(attempt)
