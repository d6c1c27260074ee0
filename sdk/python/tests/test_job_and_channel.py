"""A Job carries the message's place and lease (as the TypeScript Job does); clients take channel options
and interceptors (sync and asyncio), and every call goes through them."""

from __future__ import annotations

import asyncio
import datetime
import threading
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc import aio
from test_sdk import fresh_queue, run_in_thread

import casq
import casq.aio


class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Records the method of every unary and bidi call made through it."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        self.methods.append(details.method)
        return continuation(details, request)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        self.methods.append(details.method)
        return continuation(details, requests)


class AioUnaryRecorder(aio.UnaryUnaryClientInterceptor):
    """grpc.aio files each interceptor under one kind of call only, so there is one per kind."""

    def __init__(self, methods: list[str]) -> None:
        self.methods = methods

    async def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        self.methods.append(_name(details.method))
        return await continuation(details, request)


class AioStreamRecorder(aio.StreamStreamClientInterceptor):
    def __init__(self, methods: list[str]) -> None:
        self.methods = methods

    async def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        self.methods.append(_name(details.method))
        return await continuation(details, requests)


def _name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


def check_job(job: casq.Job, queue: str, result: casq.EnqueueResult, before: datetime.datetime) -> None:
    assert (job.id, job.queue, job.shard, job.offset) == (result.id, queue, result.shard, result.offset)
    assert job.dedup_id == "order-7"
    assert job.enqueued_at is not None and job.lease_deadline is not None
    assert job.enqueued_at.tzinfo is not None and job.lease_deadline.tzinfo is not None
    # The lease was granted with the claim, after the enqueue; the queue's lease TTL is 60 s.
    assert before - datetime.timedelta(seconds=5) <= job.enqueued_at < job.lease_deadline
    assert job.lease_deadline <= job.enqueued_at + datetime.timedelta(seconds=120)


def test_sync_job_fields_options_and_interceptors(server_address: str) -> None:
    recorder = Recorder()
    before = datetime.datetime.now(datetime.timezone.utc)
    with casq.Client([server_address], timeout=10.0, interceptors=[recorder]) as client:
        queue = fresh_queue(client)
        producer = casq.Producer(client)
        result = producer.enqueue(queue, "first", dedup_id="order-7", key="k")
        result2 = producer.enqueue(queue, "second", key="k")
        jobs: list[casq.Job] = []
        done = threading.Event()

        def handler(job: casq.Job) -> None:
            jobs.append(job)
            if len(jobs) == 2:
                done.set()

        worker = casq.Worker(client)
        thread = run_in_thread(worker, queue, handler)
        assert done.wait(15)
        worker.stop(5)
        thread.join(5)
    check_job(jobs[0], queue, result, before)
    assert jobs[1].offset == result2.offset == result.offset + 1
    assert jobs[1].dedup_id  # the producer's own, by default
    assert recorder.methods[:3] == [
        "/casq.v1.AdminService/CreateQueue",  # fresh_queue's raw stub uses the client's channel too
        "/casq.v1.QueueService/Enqueue",
        "/casq.v1.QueueService/Enqueue",
    ]
    assert "/casq.v1.QueueService/Work" in recorder.methods

    # Options reach the channel: a 64-byte send limit refuses a bigger request before it is sent.
    with casq.Client([server_address], timeout=10.0, options=[("grpc.max_send_message_length", 64)]) as small:
        with pytest.raises(casq.CasqError) as raised:
            casq.Producer(small).enqueue(queue, "x" * 200)
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_aio_job_fields_options_and_interceptors(server_address: str) -> None:
    methods: list[str] = []
    interceptors = [AioUnaryRecorder(methods), AioStreamRecorder(methods)]
    before = datetime.datetime.now(datetime.timezone.utc)

    async def main() -> tuple[str, casq.EnqueueResult, casq.Job]:
        async with casq.aio.Client([server_address], timeout=10.0, interceptors=interceptors) as client:
            queue = (await casq.aio.Admin(client).create_queue(f"py-aio-chan-{uuid.uuid4().hex[:8]}")).queue
            result = await casq.aio.Producer(client).enqueue(queue, "first", dedup_id="order-7")
            got: asyncio.Future[casq.Job] = asyncio.get_running_loop().create_future()

            async def handler(job: casq.Job) -> None:
                if not got.done():
                    got.set_result(job)

            worker = casq.aio.Worker(client)
            task = asyncio.create_task(worker.run(queue, handler))
            job = await asyncio.wait_for(got, 15)
            await asyncio.wait_for(worker.stop(5), 15)
            await task
        async with casq.aio.Client(
            [server_address], timeout=10.0, options=[("grpc.max_send_message_length", 64)]
        ) as small:
            with pytest.raises(casq.CasqError) as raised:
                await casq.aio.Producer(small).enqueue(queue, "x" * 200)
            assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        return queue, result, job

    queue, result, job = asyncio.run(main())
    check_job(job, queue, result, before)
    assert methods[:2] == ["/casq.v1.AdminService/CreateQueue", "/casq.v1.QueueService/Enqueue"]
    assert "/casq.v1.QueueService/Work" in methods


def test_keepalive_defaults_and_user_override() -> None:
    """Every client pings idle connections by default; a user's channel option of the same name wins."""
    for client_class in (casq.Client, casq.aio.Client):
        defaults = dict(client_class(["127.0.0.1:1"]).options)
        assert defaults["grpc.keepalive_time_ms"] == 10_000
        assert defaults["grpc.keepalive_permit_without_calls"] == 1
        assert defaults["grpc.http2.max_pings_without_data"] == 0
        assert defaults["grpc.http2.ping_timeout_ms"] == 10_000
        mine = client_class(["127.0.0.1:1"], options=[("grpc.keepalive_time_ms", 60_000)]).options
        assert [value for key, value in mine if key == "grpc.keepalive_time_ms"] == [60_000]


def test_job_times_and_lost_are_made_when_first_read() -> None:
    """A Job's datetimes and its ``lost`` Event are made lazily, and read as before: one Event whoever reads it."""
    from google.protobuf.timestamp_pb2 import Timestamp

    from casq.v1 import message_pb2

    claimed = message_pb2.ClaimedMessage(
        message=message_pb2.Message(id="m1", queue="q", enqueued_at=Timestamp(seconds=1_893_553_440, nanos=5_000)),
        receipt="r1",
        attempt=2,
        lease_deadline=Timestamp(seconds=1_893_553_470),
    )
    job = casq.Job(claimed)
    assert job._times is None and job._lost is None
    utc = datetime.timezone.utc
    assert job.enqueued_at == datetime.datetime(2030, 1, 2, 3, 4, 0, 5, tzinfo=utc)
    assert job.lease_deadline == datetime.datetime(2030, 1, 2, 3, 4, 30, tzinfo=utc)
    assert casq.Job(message_pb2.ClaimedMessage(receipt="r2")).lease_deadline is None

    assert not job._lost_set() and job._lost is None
    seen: list[threading.Event] = []
    readers = [threading.Thread(target=lambda: seen.append(job.lost)) for _ in range(8)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert all(event is seen[0] for event in seen)
    job.lost.set()
    assert job._lost_set() and seen[0].is_set()
