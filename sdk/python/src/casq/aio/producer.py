"""Producer: durable enqueues.

The asyncio casq/aio/producer.py is the source of the threaded casq/producer.py, which
sdk/python/scripts/generate-sync.py writes from it with unasync: edit that one.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Iterable, Mapping

from casq._connection import Metadata, build_metadata
from casq._enqueue_merge import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_MESSAGES,
    LEAD,
    Call,
    Lanes,
    lane_of,
    mergeable,
    merged_request,
    resend_lanes,
    resendable_faults,
    settle,
)
from casq._messages import (
    EnqueueResult,
    NewMessage,
    Payload,
    build_batch,
    merge_results,
    split_batch,
    to_results,
)
from casq._retry import attempt_timeout
from casq._tracing import trace_metadata
from casq.errors import BatchRedirectError, CasqError
from casq.v1 import queue_service_pb2

from ._concurrency import detached, new_future, new_lock, run_parallel, wait_future
from .client import Client


class Producer:
    """Enqueues messages; each call returns once the messages are durable.

    A batch whose messages fall on shards led by different brokers is
    answered with a BatchRedirect; the producer then sends each broker its
    part in parallel (following redirects, splitting again up to
    ``MAX_BATCH_SPLITS`` times if leadership moved meanwhile) and returns
    the results in request order, all within the call's ``retry_timeout``
    (+ ``timeout``). ``casq.Producer`` sends the parts from threads,
    ``casq.aio.Producer`` as tasks (cancelling the call cancels every part).

    A call is retried after failures that leave it unknown whether the
    broker stored the messages (an attempt that timed out at a hung broker),
    so with ``auto_dedup`` (the default) every message enqueued without a
    ``dedup_id`` gets a random one, chosen once per call: a retry that meets
    the stored original is answered with it instead of storing it twice.
    Such a message is routed by that id (like a key) and its result never
    says ``duplicate``. The id costs ~150 bytes of the shard document for the
    queue's dedup window (5 min by default); ``auto_dedup=False`` saves that
    at the price of possible duplicates after such retries.

    With ``batching`` (the default), concurrent :meth:`enqueue` calls for one
    queue are merged into one Enqueue request (see casq/_enqueue_merge.py):
    a call goes out at once when fewer than two requests of its queue are in
    flight, otherwise it waits for one of them to end and goes out with every
    call that came meanwhile (group commit, no timer: a lone call is not
    delayed). Each caller still gets its own result or error: a request that
    fails with an error that may be about one message (``INVALID_ARGUMENT``,
    ``RESOURCE_EXHAUSTED``, ``FAILED_PRECONDITION``, ``ALREADY_EXISTS``,
    ``OUT_OF_RANGE``) is resent message by message, so one bad message fails
    only its own caller; other failures (after the usual retries) reach every
    caller of the request. Calls with a dedup id (``auto_dedup`` or
    ``dedup_id``) are merged with each other, and calls with neither dedup id
    nor key with each other (the broker stores such a request on one shard,
    all or none, so it is resent message by message only after a refusal
    that stored nothing); calls with a key and no dedup id are sent alone, and
    :meth:`enqueue_batch` is always sent as it is.
    Each message keeps its caller's trace context. ``max_batch_messages``
    (1..1000, default 1000) and ``max_batch_bytes`` (default 4 MiB) bound one
    merged request. ``batching=False`` sends every call as its own request.
    """

    def __init__(
        self,
        client: Client,
        *,
        auto_dedup: bool = True,
        batching: bool = True,
        max_batch_messages: int = DEFAULT_BATCH_MESSAGES,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        self.client = client
        self.auto_dedup = auto_dedup
        self._lanes = Lanes(max_batch_messages, max_batch_bytes) if batching else None
        self._lock = new_lock()

    async def enqueue(
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
        batch = build_batch(queue, [message], self.auto_dedup)
        # A keyed message without a dedup id could share a merged request with messages of
        # other shards, and a resend after a partial store would store it twice.
        if self._lanes is None or not mergeable(batch.request.messages[0]):
            results = await self.enqueue_batch(queue, [message], traceparent=traceparent, tracestate=tracestate)
            return results[0]
        parent, state = trace_metadata(traceparent, tracestate)
        call = Call(batch, parent, state, new_future())
        lane = lane_of(queue, call.message)
        with self._lock:
            lead = self._lanes.join(lane, call)
        if not lead:
            try:
                outcome = await wait_future(call.future)
            except BaseException:
                # Cancelled just as the flight was handed to this call: hand it on.
                handed = call.future.done() and not call.future.cancelled() and call.future.exception() is None
                if handed and call.future.result() is LEAD:
                    self._hand_on(lane)
                raise
            if outcome is not LEAD:
                return outcome  # type: ignore[no-any-return]
            call.future = new_future()
        # Led to its end even if this caller is cancelled: the other callers wait for it.
        await detached(functools.partial(self._lead, queue, lane, call))
        return await wait_future(call.future)  # type: ignore[no-any-return]

    def _hand_on(self, lane: str) -> None:
        """A leader is done: its flight goes to the next waiting call of its lane, if any."""
        assert self._lanes is not None
        with self._lock:
            nxt = self._lanes.release(lane)
        if nxt is not None:
            nxt.future.set_result(LEAD)

    async def _lead(self, queue: str, lane: str, leader: Call) -> None:
        """Sends the leader's message with the calls waiting in its lane and settles each of them."""
        assert self._lanes is not None
        with self._lock:
            calls = self._lanes.take(lane, leader)
        try:
            request, parent, state = merged_request(queue, calls)
            metadata = build_metadata(self.client.token, parent, state)
            deadline = time.monotonic() + self.client.retry_timeout
            try:
                results = await self._send(request, metadata, deadline, None, 0)
            except CasqError as error:
                if len(calls) == 1 or error.code not in resendable_faults(calls):
                    for c in calls:
                        settle(c, error=error)
                    return
                await run_parallel([functools.partial(self._send_each, group) for group in resend_lanes(calls)])
                return
            except BaseException as error:
                for c in calls:
                    settle(c, error=error)
                raise
            for c, result in zip(calls, results, strict=True):
                settle(c, c.batch.results([result])[0])
        finally:
            self._hand_on(lane)

    async def _send_each(self, calls: list[Call]) -> None:
        """One request per call, one after another (a lane of :func:`resend_lanes`: one key's calls keep their order)."""
        for at, c in enumerate(calls):
            metadata = build_metadata(self.client.token, c.traceparent, c.tracestate)
            deadline = time.monotonic() + self.client.retry_timeout
            try:
                results = await self._send(c.batch.request, metadata, deadline, None, 0)
            except Exception as error:  # each caller gets its own outcome, whatever it is
                settle(c, error=error)
                continue
            except BaseException as error:
                # Cancelled or interrupted: no caller of the lane is left waiting.
                for rest in calls[at:]:
                    settle(rest, error=error)
                raise
            settle(c, c.batch.results(results)[0])

    async def enqueue_batch(
        self,
        queue: str,
        messages: Iterable[NewMessage],
        *,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> list[EnqueueResult]:
        batch = build_batch(queue, messages, self.auto_dedup)
        # Computed once, by the caller: the sub-batches of a split run in other
        # threads (casq.Producer), which do not see the caller's active span.
        metadata = self.client.metadata(traceparent, tracestate)
        deadline = time.monotonic() + self.client.retry_timeout
        return batch.results(await self._send(batch.request, metadata, deadline, None, 0))

    async def _send(
        self,
        request: queue_service_pb2.EnqueueRequest,
        metadata: Metadata,
        deadline: float,
        start: str | None,
        splits: int,
    ) -> list[EnqueueResult]:
        """Enqueue ``request`` starting at ``start``, splitting it on a BatchRedirect (``splits`` done so far)."""

        async def attempt(address: str) -> queue_service_pb2.EnqueueResponse:
            return await self.client.queue_stub(address).Enqueue(
                request, timeout=attempt_timeout(self.client.timeout, deadline), metadata=metadata
            )

        try:
            response = await self.client.call(attempt, start=start, deadline=deadline)
        except BatchRedirectError as redirect:
            parts = split_batch(request, redirect, splits + 1)
            sends = [functools.partial(self._send, p.request, metadata, deadline, p.address, splits + 1) for p in parts]
            # Every part is over before this returns, also when one failed: once
            # the call is over, nothing more is stored on its behalf.
            results = await run_parallel(sends)
            return merge_results(len(request.messages), list(zip(parts, results, strict=True)))
        return to_results(response, len(request.messages))
