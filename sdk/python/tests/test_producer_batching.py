"""Merged enqueues: concurrent calls share requests, and each caller gets its own outcome (both producers)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

import casq
import casq.aio
from casq.v1 import queue_service_pb2


def _queue() -> str:
    return f"py-merge-{uuid.uuid4().hex[:12]}"


def _count_requests(producer: Any) -> list[int]:
    """Wraps the producer's request sender: the list gets each Enqueue request's message count."""
    sizes: list[int] = []
    send = producer._send

    def counting(request: queue_service_pb2.EnqueueRequest, *args: Any) -> Any:
        sizes.append(len(request.messages))
        return send(request, *args)

    producer._send = counting
    return sizes


def _threads_enqueue(producer: casq.Producer, queue: str, n: int, bad: int = -1) -> list[Any]:
    outcomes: list[Any] = [None] * n
    start = threading.Barrier(n)

    def one(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = producer.enqueue(queue, f"m{i}", priority=5000 if i == bad else 0)
        except casq.CasqError as error:
            outcomes[i] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_threaded_calls_are_merged_and_each_gets_its_own_result(client: casq.Client) -> None:
    producer = casq.Producer(client)
    sizes = _count_requests(producer)
    queue = _queue()
    outcomes = _threads_enqueue(producer, queue, 32)
    assert all(isinstance(o, casq.EnqueueResult) for o in outcomes)
    assert len({o.id for o in outcomes}) == 32
    assert sum(sizes) == 32 and len(sizes) < 32
    # Each result is its caller's: the message with payload m<i> has the id call i got.
    ids = {o.id: f"m{i}" for i, o in enumerate(outcomes)}
    got: dict[str, str] = {}
    worker = casq.Worker(client)

    def handle(job: casq.Job) -> None:
        got[job.id] = job.payload.decode()
        if len(got) == 32:
            threading.Thread(target=worker.stop, daemon=True).start()

    worker.run(queue, handle, concurrency=4)
    assert got == ids


def test_one_bad_message_fails_only_its_caller(client: casq.Client) -> None:
    outcomes = _threads_enqueue(casq.Producer(client), _queue(), 16, bad=5)
    assert isinstance(outcomes[5], casq.CasqError) and outcomes[5].code.name == "INVALID_ARGUMENT"
    assert all(isinstance(o, casq.EnqueueResult) for i, o in enumerate(outcomes) if i != 5)


def test_a_failed_request_reaches_every_caller(client: casq.Client) -> None:
    outcomes = _threads_enqueue(casq.Producer(client), "Not A Queue Name", 8)
    assert all(isinstance(o, casq.CasqError) and o.code.name == "INVALID_ARGUMENT" for o in outcomes)


def test_batching_off_sends_one_request_per_call(client: casq.Client) -> None:
    producer = casq.Producer(client, batching=False)
    sizes = _count_requests(producer)
    _threads_enqueue(producer, _queue(), 8)
    assert sizes == [1] * 8


def test_asyncio_calls_are_merged(server_address: str) -> None:
    async def main() -> None:
        async with casq.aio.Client(brokers=[server_address], timeout=10.0) as c:
            producer = casq.aio.Producer(c)
            sizes = _count_requests(producer)
            queue = _queue()
            results = await asyncio.gather(*(producer.enqueue(queue, f"m{i}") for i in range(64)))
            assert len({r.id for r in results}) == 64
            assert sum(sizes) == 64 and len(sizes) < 64
            # A cancelled caller does not stop the others' request.
            tasks = [asyncio.create_task(producer.enqueue(queue, f"c{i}")) for i in range(8)]
            await asyncio.sleep(0)
            tasks[0].cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, casq.EnqueueResult) for r in done[1:])

    asyncio.run(main())


def test_limits_are_checked(client: casq.Client) -> None:
    with pytest.raises(ValueError):
        casq.Producer(client, max_batch_messages=1001)


def test_a_refused_merged_request_is_resent_in_parallel_lanes_keeping_each_keys_order() -> None:
    from casq._enqueue_merge import RESEND_PARALLEL, Call, resend_lanes
    from casq._messages import build_batch

    def call(key: str, n: int) -> Call:
        batch = build_batch("q", [casq.NewMessage(payload=f"{key}{n}".encode(), key=key or None)], True)
        return Call(batch=batch, traceparent=None, tracestate=None, future=None)

    calls = [call("", i) for i in range(40)] + [call("k", i) for i in range(5)] + [call("j", i) for i in range(3)]
    lanes = resend_lanes(calls)
    # Unkeyed calls do not wait for each other in one lane (they did: all 40 one after another).
    assert len(lanes) == RESEND_PARALLEL
    assert max(sum(1 for c in lane if c.message.key == "") for lane in lanes) <= 3
    assert sorted(id(c) for lane in lanes for c in lane) == sorted(id(c) for c in calls)
    for key in ("k", "j"):
        holding = [lane for lane in lanes if any(c.message.key == key for c in lane)]
        assert len(holding) == 1
        assert [c.message.payload for c in holding[0] if c.message.key == key] == [
            f"{key}{i}".encode() for i in range(5 if key == "k" else 3)
        ]
    assert resend_lanes(calls[:3]) == [[calls[0]], [calls[1]], [calls[2]]]


def test_a_resend_that_fails_with_something_else_still_answers_its_caller(server_address: str) -> None:
    async def main() -> None:
        async with casq.aio.Client(brokers=[server_address], timeout=10.0) as c:
            producer = casq.aio.Producer(c)
            send = producer._send
            sizes: list[int] = []

            async def failing(request: queue_service_pb2.EnqueueRequest, *args: Any) -> Any:
                sizes.append(len(request.messages))
                if len(request.messages) == 1 and request.messages[0].payload == b"m3":
                    raise RuntimeError("not a casq error")
                return await send(request, *args)

            setattr(producer, "_send", failing)
            queue = _queue()
            # One turn, m5's priority out of range.
            calls = [producer.enqueue(queue, f"m{i}", priority=5000 if i == 5 else 0) for i in range(8)]
            outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=30)
            # The first call goes alone, the other 7 merged: refused for m5, then resent one by one.
            assert sorted(sizes) == [1] * 8 + [7]
            assert isinstance(outcomes[5], casq.CasqError) and outcomes[5].code.name == "INVALID_ARGUMENT"
            assert isinstance(outcomes[3], RuntimeError) and str(outcomes[3]) == "not a casq error"
            assert all(isinstance(o, casq.EnqueueResult) for i, o in enumerate(outcomes) if i not in (3, 5))

    asyncio.run(main())


def test_a_shard_fault_of_a_merged_request_is_resent_per_message(server_address: str) -> None:
    import grpc

    async def main() -> None:
        async with casq.aio.Client(brokers=[server_address], timeout=10.0) as c:
            producer = casq.aio.Producer(c)
            send = producer._send

            async def shard_fault(request: queue_service_pb2.EnqueueRequest, *args: Any) -> Any:
                healthy = [m for m in request.messages if m.payload != b"broken"]
                if len(healthy) == len(request.messages):
                    return await send(request, *args)
                if healthy:  # the healthy shard's part is stored, then the broken one fails the call
                    part = queue_service_pb2.EnqueueRequest(queue=request.queue, messages=healthy)
                    await send(part, *args)
                raise casq.CasqError(grpc.StatusCode.DATA_LOSS, "test: shard 1 is unreadable")

            setattr(producer, "_send", shard_fault)
            queue = _queue()
            payloads = ["h0", "h1", "broken", "h3", "h4"]
            outcomes = await asyncio.wait_for(
                asyncio.gather(*(producer.enqueue(queue, p) for p in payloads), return_exceptions=True), timeout=30
            )
            assert isinstance(outcomes[2], casq.CasqError) and outcomes[2].code == grpc.StatusCode.DATA_LOSS
            for i in (0, 1, 3, 4):
                # Stored by the merged request: each caller hears its own store, not a duplicate.
                result = outcomes[i]
                assert isinstance(result, casq.EnqueueResult) and not result.duplicate, result

    asyncio.run(main())


def test_calls_without_dedup_ids_are_merged_unless_keyed(client: casq.Client) -> None:
    producer = casq.Producer(client, auto_dedup=False)
    sizes = _count_requests(producer)
    outcomes = _threads_enqueue(producer, _queue(), 32)
    assert all(isinstance(o, casq.EnqueueResult) for o in outcomes)
    assert sum(sizes) == 32 and len(sizes) < 32
    # A refused merged request stored nothing (the broker puts it on one shard): resent one by one.
    outcomes = _threads_enqueue(producer, _queue(), 16, bad=5)
    assert isinstance(outcomes[5], casq.CasqError) and outcomes[5].code.name == "INVALID_ARGUMENT"
    assert all(isinstance(o, casq.EnqueueResult) for i, o in enumerate(outcomes) if i != 5)
    # Keyed calls without a dedup id go alone.
    sizes.clear()
    queue = _queue()
    threads = [threading.Thread(target=producer.enqueue, args=(queue, f"k{i}"), kwargs={"key": "k"}) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sizes == [1] * 8


def test_a_merged_request_without_dedup_ids_is_not_resent_after_internal(server_address: str) -> None:
    import grpc

    async def main() -> None:
        async with casq.aio.Client(brokers=[server_address], timeout=10.0) as c:
            producer = casq.aio.Producer(c, auto_dedup=False)
            send = producer._send
            sizes: list[int] = []

            async def internal(request: queue_service_pb2.EnqueueRequest, *args: Any) -> Any:
                sizes.append(len(request.messages))
                if len(request.messages) > 1:
                    raise casq.CasqError(grpc.StatusCode.INTERNAL, "test: a bug")
                return await send(request, *args)

            setattr(producer, "_send", internal)
            queue = _queue()
            outcomes = await asyncio.wait_for(
                asyncio.gather(*(producer.enqueue(queue, f"m{i}") for i in range(8)), return_exceptions=True),
                timeout=30,
            )
            # One call goes alone, the other 7 merged: INTERNAL (maybe stored) reaches each, nothing resent.
            assert sorted(sizes) == [1, 7]
            assert sum(isinstance(o, casq.EnqueueResult) for o in outcomes) == 1
            assert sum(isinstance(o, casq.CasqError) and o.code == grpc.StatusCode.INTERNAL for o in outcomes) == 7

    asyncio.run(main())
