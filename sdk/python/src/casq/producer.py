"""Producer: durable enqueues (synchronous)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from casq._messages import (
    EnqueueResult,
    NewMessage,
    Payload,
    SubBatch,
    build_batch,
    merge_results,
    split_batch,
    to_results,
)
from casq.client import Client, Metadata, attempt_timeout
from casq.errors import BatchRedirectError
from casq.v1 import queue_service_pb2


class Producer:
    """Enqueues messages; each call returns once the messages are durable.

    A batch whose messages fall on shards led by different brokers is
    answered with a BatchRedirect; the producer then sends each broker its
    part in parallel (following redirects, splitting again up to
    ``MAX_BATCH_SPLITS`` times if leadership moved meanwhile) and returns
    the results in request order, all within the call's ``retry_timeout``
    (+ ``timeout``).

    A call is retried after failures that leave it unknown whether the
    broker stored the messages (an attempt that timed out at a hung broker),
    so with ``auto_dedup`` (the default) every message enqueued without a
    ``dedup_id`` gets a random one, chosen once per call: a retry that meets
    the stored original is answered with it instead of storing it twice.
    Such a message is routed by that id (like a key) and its result never
    says ``duplicate``. The id costs ~150 bytes of the shard document for the
    queue's dedup window (5 min by default); ``auto_dedup=False`` saves that
    at the price of possible duplicates after such retries.
    """

    def __init__(self, client: Client, *, auto_dedup: bool = True) -> None:
        self.client = client
        self.auto_dedup = auto_dedup

    def enqueue(
        self,
        queue: str,
        payload: Payload,
        *,
        key: str | None = None,
        priority: int = 0,
        delay: float | datetime.timedelta | None = None,
        headers: Mapping[str, str] | None = None,
        max_attempts: int | None = None,
        dedup_id: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> EnqueueResult:
        message = NewMessage(payload, key, priority, delay, headers, max_attempts, dedup_id)
        return self.enqueue_batch(queue, [message], traceparent=traceparent, tracestate=tracestate)[0]

    def enqueue_batch(
        self,
        queue: str,
        messages: Iterable[NewMessage],
        *,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> list[EnqueueResult]:
        batch = build_batch(queue, messages, self.auto_dedup)
        # Computed once, in the caller's thread: the sub-batches of a split run
        # in other threads, which do not see the caller's active span.
        metadata = self.client.metadata(traceparent, tracestate)
        deadline = time.monotonic() + self.client.retry_timeout
        return batch.results(self._send(batch.request, metadata, deadline, None, 0))

    def _send(
        self,
        request: queue_service_pb2.EnqueueRequest,
        metadata: Metadata,
        deadline: float,
        start: str | None,
        splits: int,
    ) -> list[EnqueueResult]:
        """Enqueue ``request`` starting at ``start``, splitting it on a BatchRedirect (``splits`` done so far)."""
        try:
            response = self.client.call(
                lambda address: self.client.queue_stub(address).Enqueue(
                    request, timeout=attempt_timeout(self.client.timeout, deadline), metadata=metadata
                ),
                start=start,
                deadline=deadline,
            )
        except BatchRedirectError as redirect:
            parts = split_batch(request, redirect, splits + 1)
            return merge_results(len(request.messages), self._send_parts(parts, metadata, deadline, splits + 1))
        return to_results(response, len(request.messages))

    def _send_parts(
        self, parts: list[SubBatch], metadata: Metadata, deadline: float, splits: int
    ) -> list[tuple[SubBatch, list[EnqueueResult]]]:
        """Send the sub-batches in parallel, each to its broker; raises the first failure (in route order)."""
        if len(parts) == 1:
            return [(parts[0], self._send(parts[0].request, metadata, deadline, parts[0].address, splits))]
        # Leaving the with block waits for every sub-batch, also when one
        # failed: once the call is over, nothing more is stored on its behalf.
        with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="casq-enqueue-split") as pool:
            futures = [
                pool.submit(self._send, part.request, metadata, deadline, part.address, splits) for part in parts
            ]
            return [(part, future.result()) for part, future in zip(parts, futures, strict=True)]
