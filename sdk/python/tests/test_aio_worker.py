"""casq.aio.Worker against a real broker: ack, retry, dead letters, concurrency, stop, failover, tracing."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import casq
import casq.aio
from casq.errors import LEADER_ADDRESS_KEY
from casq.v1 import admin_service_pb2, queue_config_pb2, work_pb2

BOUND = 15.0  # upper bound of every wait: a hang fails the test instead of blocking the suite


def run(server_address: str, body: Callable[[casq.aio.Client], Awaitable[None]], **client_options: Any) -> None:
    """Runs ``body`` with a fresh asyncio client in a fresh event loop (there is no pytest-asyncio)."""

    async def main() -> None:
        async with casq.aio.Client(brokers=[server_address], timeout=10.0, **client_options) as client:
            await asyncio.wait_for(body(client), 60)

    asyncio.run(main())


async def fresh_queue(client: casq.aio.Client, *, max_attempts: int = 5) -> str:
    """A new queue with fast retries (the default backoff starts at 1 s)."""
    name = f"py-aio-{uuid.uuid4().hex[:12]}"
    config = queue_config_pb2.QueueConfig(
        max_attempts=max_attempts,
        backoff=queue_config_pb2.BackoffPolicy(
            initial_delay=Duration(nanos=20_000_000), max_delay=Duration(nanos=50_000_000), jitter=0.0
        ),
    )
    request = admin_service_pb2.CreateQueueRequest(queue=name, config=config)
    await client.admin_stub().CreateQueue(request, timeout=10)
    return name


async def stats(client: casq.aio.Client, queue: str) -> admin_service_pb2.SubscriptionStats:
    """The default subscription's figures (ready, in_flight, delayed, ...)."""
    response = await client.admin_stub().GetQueue(admin_service_pb2.GetQueueRequest(queue=queue), timeout=10)
    return [s for s in response.subscriptions if s.subscription == "default"][0]


async def eventually(predicate: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    """Polls ``predicate`` until it holds, for at most BOUND seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"not in time: {what}")
        await asyncio.sleep(0.02)


async def settled(client: casq.aio.Client, queue: str) -> bool:
    figures = await stats(client, queue)
    return figures.ready + figures.in_flight + figures.delayed == 0


def start(
    worker: casq.aio.Worker, queue: str, handler: casq.aio.worker.Handler, **options: Any
) -> asyncio.Task[None]:
    return asyncio.create_task(worker.run(queue, handler, **options))


async def stop(worker: casq.aio.Worker, task: asyncio.Task[None], timeout: float = 5.0) -> None:
    await asyncio.wait_for(worker.stop(timeout), BOUND)
    assert task.done()  # stop() returns once run() has returned
    assert task.result() is None


def test_success_acks(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        producer = casq.aio.Producer(client)
        await producer.enqueue(queue, "hello", headers={"tenant": "acme"})
        await producer.enqueue_batch(queue, [casq.NewMessage(b"\x00two"), casq.NewMessage("three", key="k")])
        seen: list[casq.Job] = []

        async def handler(job: casq.Job) -> None:
            seen.append(job)

        worker = casq.aio.Worker(client, worker_id="aio-test")
        task = start(worker, queue, handler, concurrency=2)
        await eventually(lambda: len(seen) == 3, "three jobs handled")
        await eventually(lambda: settled(client, queue), "all acked")
        await stop(worker, task)
        assert {job.payload for job in seen} == {b"hello", b"\x00two", b"three"}
        hello = [job for job in seen if job.payload == b"hello"][0]
        assert hello.headers == {"tenant": "acme"} and hello.attempt == 1 and not hello.lost.is_set()

    run(server_address, body)


def test_exception_nacks_and_retries(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        await casq.aio.Producer(client).enqueue(queue, "flaky")
        attempts: list[int] = []
        errors: list[tuple[Exception, casq.Job | None]] = []

        async def handler(job: casq.Job) -> None:
            attempts.append(job.attempt)
            if job.attempt == 1:
                raise RuntimeError("boom")

        worker = casq.aio.Worker(client)
        task = start(worker, queue, handler, on_error=lambda error, job: errors.append((error, job)))
        await eventually(lambda: attempts == [1, 2], "a second attempt")
        await eventually(lambda: settled(client, queue), "acked on attempt 2")
        await stop(worker, task)
        assert attempts == [1, 2]
        assert isinstance(errors[0][0], RuntimeError) and errors[0][1] is not None

    run(server_address, body)


def test_dead_letter(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        sent = await casq.aio.Producer(client).enqueue(queue, "poison")
        handled: list[int] = []

        async def handler(job: casq.Job) -> None:
            handled.append(job.attempt)
            raise casq.DeadLetter("cannot parse")

        async def dead_letters() -> list[admin_service_pb2.DeadLetter]:
            request = admin_service_pb2.ListDeadLettersRequest(queue=queue)
            return list((await client.admin_stub().ListDeadLetters(request, timeout=10)).dead_letters)

        worker = casq.aio.Worker(client)
        task = start(worker, queue, handler)

        async def one_dead_letter() -> bool:
            return len(await dead_letters()) == 1

        await eventually(one_dead_letter, "a dead letter")
        await stop(worker, task)
        dead = (await dead_letters())[0]
        assert dead.message.id == sent.id and dead.reason == "cannot parse" and dead.attempts == 1
        assert handled == [1]  # no retry
        assert await settled(client, queue)

    run(server_address, body)


def test_concurrency_runs_handlers_at_once(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        await casq.aio.Producer(client).enqueue_batch(queue, [casq.NewMessage(f"m{i}") for i in range(5)])
        # A barrier: the first three handlers can only return once all three run at the
        # same time. With fewer at once the first one would time out and fail.
        all_in = asyncio.Event()
        running = 0
        most = 0
        done: list[str] = []

        async def handler(job: casq.Job) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            try:
                if most >= 3:
                    all_in.set()
                await asyncio.wait_for(all_in.wait(), BOUND)
                await asyncio.sleep(0)  # give a fourth handler the chance to start (it must not)
                done.append(job.text())
            finally:
                running -= 1

        errors: list[Exception] = []
        worker = casq.aio.Worker(client)
        task = start(worker, queue, handler, concurrency=3, on_error=lambda error, job: errors.append(error))
        await eventually(lambda: len(done) == 5, "five jobs handled")
        await eventually(lambda: settled(client, queue), "all acked")
        await stop(worker, task)
        assert errors == []
        assert most == 3  # three at once, never more
        assert sorted(done) == [f"m{i}" for i in range(5)]

    run(server_address, body)


def test_graceful_stop_finishes_running_and_releases_prefetched(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        await casq.aio.Producer(client).enqueue_batch(queue, [casq.NewMessage(f"m{i}") for i in range(3)])
        started: list[casq.Job] = []
        release = asyncio.Event()
        finished: list[str] = []

        async def handler(job: casq.Job) -> None:
            started.append(job)
            await release.wait()
            finished.append(job.id)

        worker = casq.aio.Worker(client)
        task = start(worker, queue, handler, concurrency=1, prefetch=3)

        async def all_leased() -> bool:
            return (await stats(client, queue)).in_flight == 3

        await eventually(lambda: len(started) == 1, "one handler running")
        await eventually(all_leased, "three jobs held: one running, two prefetched")

        stopping = asyncio.create_task(worker.stop(timeout=BOUND))

        async def prefetched_released() -> bool:
            figures = await stats(client, queue)
            return figures.ready == 2 and figures.in_flight == 1

        await eventually(prefetched_released, "the two unstarted jobs handed back")
        assert not stopping.done() and not task.done()  # still waiting for the running handler
        release.set()
        await asyncio.wait_for(stopping, BOUND)
        assert task.done() and task.result() is None
        assert len(started) == 1 and finished == [started[0].id]
        figures = await stats(client, queue)
        assert (figures.ready, figures.in_flight, figures.delayed) == (2, 0, 0)  # the running one was acked

    run(server_address, body)


def test_stop_deadline_cancels_stuck_handler(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        sent = await casq.aio.Producer(client).enqueue(queue, "stuck")
        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def stuck(job: casq.Job) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        worker = casq.aio.Worker(client)
        task = start(worker, queue, stuck, lease_ttl=1.0)
        await asyncio.wait_for(started.wait(), BOUND)
        await stop(worker, task, timeout=0.05)
        assert cancelled.is_set()
        figures = await stats(client, queue)
        assert (figures.ready, figures.in_flight) == (0, 1)  # neither acked nor nacked: the lease runs out

        redelivered: list[casq.Job] = []

        async def handler(job: casq.Job) -> None:
            redelivered.append(job)

        second = casq.aio.Worker(client)
        task = start(second, queue, handler)
        await eventually(lambda: len(redelivered) == 1, "redelivery after the lease expired")
        await eventually(lambda: settled(client, queue), "acked on the second attempt")
        await stop(second, task)
        assert redelivered[0].id == sent.id and redelivered[0].attempt == 2

    run(server_address, body)


def test_cancelling_run_stops_cleanly(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        await casq.aio.Producer(client).enqueue_batch(queue, [casq.NewMessage("a"), casq.NewMessage("b")])
        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def blocked(job: casq.Job) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        worker = casq.aio.Worker(client)
        task = start(worker, queue, blocked, concurrency=1, prefetch=2)

        async def both_leased() -> bool:
            return (await stats(client, queue)).in_flight == 2

        await asyncio.wait_for(started.wait(), BOUND)
        await eventually(both_leased, "one running, one prefetched")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, BOUND)
        assert cancelled.is_set()
        figures = await stats(client, queue)
        # The prefetched job went back; the cancelled one keeps its lease until it expires.
        assert (figures.ready, figures.in_flight) == (1, 1)
        await asyncio.wait_for(worker.stop(), BOUND)  # nothing left to stop

    run(server_address, body)


def test_heartbeats_keep_a_long_job(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        await casq.aio.Producer(client).enqueue(queue, "long")
        attempts: list[int] = []
        lost: list[bool] = []

        async def handler(job: casq.Job) -> None:
            attempts.append(job.attempt)
            await asyncio.sleep(1.0)  # several lease TTLs: only heartbeats keep the lease
            lost.append(job.lost.is_set())

        worker = casq.aio.Worker(client)
        task = start(worker, queue, handler, lease_ttl=0.3)
        await eventually(lambda: len(lost) == 1, "the long job finished")
        await eventually(lambda: settled(client, queue), "acked")
        await stop(worker, task)
        assert attempts == [1] and lost == [False]

    run(server_address, body)


def test_lost_lease_sets_job_lost(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        await casq.aio.Producer(client).enqueue(queue, "purged")
        started = asyncio.Event()
        saw_lost: list[bool] = []

        async def handler(job: casq.Job) -> None:
            started.set()
            await eventually(job.lost.is_set, "job.lost set")
            saw_lost.append(True)

        worker = casq.aio.Worker(client)
        task = start(worker, queue, handler)
        await asyncio.wait_for(started.wait(), BOUND)
        # A purge takes the lease away; the broker tells the worker on the stream.
        purge = admin_service_pb2.PurgeQueueRequest(queue=queue, subscription="default")
        await client.admin_stub().PurgeQueue(purge, timeout=10)
        await eventually(lambda: saw_lost == [True], "the handler saw the lost lease")
        await stop(worker, task)
        assert await settled(client, queue)

    run(server_address, body)


def test_fatal_error_raises(server_address: str) -> None:
    async def body(client: casq.aio.Client) -> None:
        async def handler(job: casq.Job) -> None:
            raise AssertionError("no job expected")

        with pytest.raises(casq.NotFoundError) as caught:
            await asyncio.wait_for(casq.aio.Worker(client).run("no-such-queue-aio", handler), BOUND)
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ValueError):
            await casq.aio.Worker(client).run("q", handler, concurrency=0)

    run(server_address, body)


def test_fails_over_from_a_dead_broker(server_address: str) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"

    async def body(client: casq.aio.Client) -> None:
        async with casq.aio.Client(brokers=[server_address], timeout=10.0) as setup:
            queue = await fresh_queue(setup)
            await casq.aio.Producer(setup).enqueue(queue, "survivor")
        seen: list[str] = []
        errors: list[Exception] = []

        async def handler(job: casq.Job) -> None:
            seen.append(job.text())

        worker = casq.aio.Worker(client)
        task = start(worker, queue, handler, on_error=lambda error, job: errors.append(error))
        await eventually(lambda: seen == ["survivor"], "the job, from the live broker")
        await stop(worker, task)
        assert client.current_broker == server_address
        assert any(isinstance(error, casq.UnavailableError) for error in errors)

    async def main() -> None:
        async with casq.aio.Client(
            brokers=[dead, server_address], timeout=10.0, backoff_initial=0.01, backoff_max=0.05
        ) as client:
            await asyncio.wait_for(body(client), 60)

    asyncio.run(main())


def test_follows_redirect_trailer(server_address: str) -> None:
    """A broker that does not lead the queue ends Work with UNAVAILABLE and casq-leader-address."""
    calls: list[str] = []

    async def redirect(
        requests: Any, context: grpc.aio.ServicerContext[work_pb2.WorkRequest, work_pb2.WorkResponse]
    ) -> None:
        calls.append("Work")
        trailers = ((LEADER_ADDRESS_KEY, server_address),)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader", trailing_metadata=trailers)

    async def main() -> None:
        rpc_handler = grpc.method_handlers_generic_handler(
            "casq.v1.QueueService",
            {
                "Work": grpc.stream_stream_rpc_method_handler(
                    redirect,
                    request_deserializer=work_pb2.WorkRequest.FromString,
                    response_serializer=work_pb2.WorkResponse.SerializeToString,
                )
            },
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((rpc_handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        follower = f"127.0.0.1:{port}"
        try:
            async with casq.aio.Client(brokers=[follower], timeout=10.0) as client:
                async with casq.aio.Client(brokers=[server_address], timeout=10.0) as setup:
                    queue = await fresh_queue(setup)
                    await casq.aio.Producer(setup).enqueue(queue, "redirected")
                seen: list[str] = []

                async def handler(job: casq.Job) -> None:
                    seen.append(job.text())

                worker = casq.aio.Worker(client)
                task = start(worker, queue, handler)
                await eventually(lambda: seen == ["redirected"], "the job, from the leader")
                await stop(worker, task)
                assert client.current_broker == server_address
                assert calls == ["Work"]
        finally:
            await server.stop(None)

    asyncio.run(asyncio.wait_for(main(), 60))


_EXPORTER: list[InMemorySpanExporter] = []


def span_exporter() -> InMemorySpanExporter:
    """An in-memory exporter on the global SDK tracer provider (settable once per process: reuse one)."""
    if not _EXPORTER:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            trace.set_tracer_provider(TracerProvider())
            provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            pytest.skip("a tracer provider that is not the OpenTelemetry SDK's is installed")
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        _EXPORTER.append(exporter)
    return _EXPORTER[0]


def test_each_job_runs_in_a_processing_span(server_address: str) -> None:
    exporter = span_exporter()

    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client)
        tracer = trace.get_tracer("casq-tests")
        with tracer.start_as_current_span("produce") as produce:
            parent = produce.get_span_context()
            traceparent = f"00-{parent.trace_id:032x}-{parent.span_id:016x}-01"
            sent = await casq.aio.Producer(client).enqueue(queue, "traced", traceparent=traceparent)
        current: list[trace.SpanContext] = []

        async def handler(job: casq.Job) -> None:
            current.append(trace.get_current_span().get_span_context())
            if job.attempt == 1:
                raise RuntimeError("first attempt fails")

        worker = casq.aio.Worker(client)
        task = start(worker, queue, handler)
        await eventually(lambda: len(current) == 2, "two attempts")
        await eventually(lambda: settled(client, queue), "acked")
        await stop(worker, task)

        spans = sorted(
            (s for s in exporter.get_finished_spans() if s.name == f"process {queue}"),
            key=lambda s: s.start_time or 0,
        )
        assert len(spans) == 2
        for span, seen in zip(spans, current):
            assert span.kind == SpanKind.CONSUMER
            assert span.parent is not None and span.parent.span_id == parent.span_id
            assert span.context is not None and span.context.trace_id == parent.trace_id
            assert seen.span_id == span.context.span_id  # the handler ran as the current span
            assert span.attributes is not None and span.attributes["messaging.message.id"] == sent.id
        assert spans[0].status.status_code == StatusCode.ERROR
        assert spans[1].status.status_code != StatusCode.ERROR

    run(server_address, body)


def test_handler_raising_cancelled_error_on_its_own_is_a_failure(server_address: str) -> None:
    """A CancelledError the handler raises itself (not stop()'s) nacks the job, and the worker takes the next ones."""

    async def body(client: casq.aio.Client) -> None:
        queue = await fresh_queue(client, max_attempts=1)  # a nack dead-letters the job with the SDK's reason
        await casq.aio.Producer(client).enqueue_batch(queue, [casq.NewMessage(f"m{i}") for i in range(3)])
        failed: list[casq.Job] = []
        done: list[str] = []
        errors: list[tuple[BaseException, casq.Job | None]] = []

        async def handler(job: casq.Job) -> None:
            if not failed:
                failed.append(job)
                upstream = asyncio.get_running_loop().create_future()
                upstream.cancel("upstream gone")  # someone else cancelled what the handler awaits
                await upstream
            done.append(job.text())

        async def dead_letters() -> list[admin_service_pb2.DeadLetter]:
            request = admin_service_pb2.ListDeadLettersRequest(queue=queue)
            return list((await client.admin_stub().ListDeadLetters(request, timeout=10)).dead_letters)

        async def one_dead_letter() -> bool:
            return len(await dead_letters()) == 1

        worker = casq.aio.Worker(client)
        # Concurrency 1: the failed job's credit must come back for the next job to arrive. The
        # lease outlives the test: only a nack settles the job in time.
        task = start(
            worker, queue, handler, concurrency=1, lease_ttl=60.0, on_error=lambda error, job: errors.append((error, job))
        )
        await eventually(lambda: len(done) == 2, "the two other jobs handled after the failed one")
        await eventually(one_dead_letter, "the failed job nacked (its last attempt: dead-lettered)")
        await eventually(lambda: settled(client, queue), "the others acked")
        await stop(worker, task)
        dead = (await dead_letters())[0]
        assert dead.message.id == failed[0].id and dead.attempts == 1
        assert dead.reason == "CancelledError: upstream gone"  # the reason of any handler failure: "Type: message"
        assert sorted(done + [failed[0].text()]) == ["m0", "m1", "m2"]
        assert [(type(error), job.id if job else None) for error, job in errors] == [
            (asyncio.CancelledError, failed[0].id)
        ]

    run(server_address, body)
