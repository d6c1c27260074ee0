"""The Python SDK against a real broker: produce, work, retry, dead letters, shutdown."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from collections.abc import Callable

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

import casq
import casq.aio
from casq.v1 import admin_service_pb2, queue_config_pb2


def fresh_queue(client: casq.Client, *, max_attempts: int = 5) -> str:
    """A new queue with fast retries (the default backoff starts at 1 s)."""
    name = f"py-{uuid.uuid4().hex[:12]}"
    config = queue_config_pb2.QueueConfig(
        max_attempts=max_attempts,
        backoff=queue_config_pb2.BackoffPolicy(
            initial_delay=Duration(nanos=20_000_000), max_delay=Duration(nanos=50_000_000), jitter=0.0
        ),
    )
    client.admin_stub().CreateQueue(admin_service_pb2.CreateQueueRequest(queue=name, config=config), timeout=10)
    return name


def run_in_thread(worker: casq.Worker, queue: str, handler: Callable[[casq.Job], None], **kwargs: object) -> threading.Thread:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run(queue, handler, **kwargs)  # type: ignore[arg-type]
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
            raise

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def outstanding(client: casq.Client, queue: str) -> int:
    """Messages not yet acked on the default subscription (runnable + leased + delayed)."""
    response = client.admin_stub().GetQueue(admin_service_pb2.GetQueueRequest(queue=queue), timeout=10)
    for sub in response.subscriptions:
        if sub.subscription == "default":
            return int(sub.ready + sub.in_flight + sub.delayed)
    return -1


def test_enqueue_and_consume_acks(client: casq.Client) -> None:
    queue = fresh_queue(client)
    producer = casq.Producer(client)
    result = producer.enqueue(queue, "hello", headers={"tenant": "acme"}, dedup_id="d-1", priority=3)
    assert result.id and not result.duplicate
    assert producer.enqueue(queue, "hello", dedup_id="d-1").duplicate
    batch = producer.enqueue_batch(queue, [casq.NewMessage(b"\x00two"), casq.NewMessage("three", key="k")])
    assert len(batch) == 2

    seen: list[casq.Job] = []
    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, seen.append, concurrency=2)
    wait_for(lambda: len(seen) == 3)
    worker.stop(5)
    thread.join(5)
    assert not thread.is_alive()
    assert seen[0].text() == "hello" and seen[0].headers == {"tenant": "acme"} and seen[0].attempt == 1
    assert {job.payload for job in seen} == {b"hello", b"\x00two", b"three"}
    wait_for(lambda: outstanding(client, queue) == 0)


def test_handler_exception_is_redelivered(client: casq.Client) -> None:
    queue = fresh_queue(client)
    casq.Producer(client).enqueue(queue, "flaky")
    attempts: list[int] = []
    errors: list[Exception] = []

    def handler(job: casq.Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            raise RuntimeError("boom")

    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, handler, on_error=lambda error, job: errors.append(error))
    wait_for(lambda: len(attempts) == 2)
    worker.stop(5)
    thread.join(5)
    assert attempts == [1, 2]
    assert isinstance(errors[0], RuntimeError)
    wait_for(lambda: outstanding(client, queue) == 0)


def test_dead_letter_exception(client: casq.Client) -> None:
    queue = fresh_queue(client)
    sent = casq.Producer(client).enqueue(queue, "poison")
    handled = threading.Event()

    def handler(job: casq.Job) -> None:
        handled.set()
        raise casq.DeadLetter("cannot parse")

    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, handler)
    assert handled.wait(10)

    def dead_letters() -> list[admin_service_pb2.DeadLetter]:
        request = admin_service_pb2.ListDeadLettersRequest(queue=queue)
        return list(client.admin_stub().ListDeadLetters(request, timeout=10).dead_letters)

    wait_for(lambda: len(dead_letters()) == 1)
    worker.stop(5)
    thread.join(5)
    dead = dead_letters()[0]
    assert dead.message.id == sent.id and dead.reason == "cannot parse" and dead.attempts == 1


def test_graceful_stop_waits_for_running_handler(client: casq.Client) -> None:
    queue = fresh_queue(client)
    casq.Producer(client).enqueue(queue, "slow")
    started, finished = threading.Event(), threading.Event()

    def handler(job: casq.Job) -> None:
        started.set()
        time.sleep(0.8)
        finished.set()

    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, handler)
    assert started.wait(10)
    worker.stop(timeout=10)
    assert finished.is_set()
    thread.join(5)
    assert not thread.is_alive()
    assert outstanding(client, queue) == 0  # acked before the stream ended


def test_errors_are_typed(client: casq.Client) -> None:
    with pytest.raises(casq.NotFoundError) as caught:
        casq.Worker(client).run("no-such-queue-py", lambda job: None)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(casq.InvalidArgumentError):
        casq.Producer(client).enqueue("Not A Valid Name!", "x")


def test_traceparent_reaches_the_worker(client: casq.Client) -> None:
    queue = fresh_queue(client)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    casq.Producer(client).enqueue(queue, "traced", traceparent=traceparent)
    seen: list[casq.Job] = []
    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, seen.append)
    wait_for(lambda: len(seen) == 1)
    worker.stop(5)
    thread.join(5)
    assert seen[0].trace_context.get("traceparent", "").startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")


def test_async_producer(server_address: str, client: casq.Client) -> None:
    queue = fresh_queue(client)

    async def produce() -> list[casq.EnqueueResult]:
        async with casq.aio.Client(brokers=[server_address]) as aclient:
            producer = casq.aio.Producer(aclient)
            first = await producer.enqueue(queue, b"async", dedup_id="a-1")
            again = await producer.enqueue(queue, b"async", dedup_id="a-1")
            with pytest.raises(casq.InvalidArgumentError):
                await producer.enqueue("Bad Name!", b"x")
            return [first, again]

    first, again = asyncio.run(produce())
    assert first.id == again.id and again.duplicate
    assert outstanding(client, queue) == 1


def test_heartbeats_keep_a_long_job(client: casq.Client) -> None:
    queue = fresh_queue(client)
    casq.Producer(client).enqueue(queue, "long")
    attempts: list[int] = []
    lost: list[bool] = []

    def handler(job: casq.Job) -> None:
        attempts.append(job.attempt)
        time.sleep(1.0)  # several lease TTLs: only heartbeats keep the lease
        lost.append(job.lost.is_set())

    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, handler, concurrency=2, lease_ttl=0.3)
    wait_for(lambda: len(lost) == 1)
    wait_for(lambda: outstanding(client, queue) == 0)
    worker.stop(5)
    thread.join(5)
    assert attempts == [1] and lost == [False]


def test_failover_skips_a_dead_broker(server_address: str) -> None:
    """A refused first broker costs one backoff, then the call goes to the next one."""
    dead = "127.0.0.1:1"  # nothing listens on port 1
    with casq.Client(brokers=[dead, server_address], timeout=5.0, retry_timeout=10.0) as client:
        queue = casq.Admin(client).create_queue(f"py-{uuid.uuid4().hex[:12]}").queue
        assert casq.Producer(client).enqueue(queue, "x").id
        assert client.current_broker == server_address


def test_retry_budget_gives_up_on_time() -> None:
    """Outages are retried until retry_timeout, not forever."""
    with casq.Client(brokers=["127.0.0.1:1"], timeout=1.0, retry_timeout=0.5, backoff_initial=0.05) as client:
        with pytest.raises(casq.UnavailableError):
            casq.Producer(client).enqueue("q", "x")
    with casq.Client(brokers=["127.0.0.1:1"], max_attempts=2, backoff_initial=0.01) as client:
        with pytest.raises(casq.UnavailableError):
            casq.Producer(client).enqueue("q", "x")


def test_stop_returns_after_the_finished_jobs_are_acked(server_address: str) -> None:
    """run() returns only once the acks of the handlers that finished are answered: closing the client right then loses none."""
    setup = casq.Client(brokers=[server_address])
    queue = fresh_queue(setup)
    jobs = 400
    casq.Producer(setup).enqueue_batch(queue, [casq.NewMessage(payload=b"x") for _ in range(jobs)])
    client = casq.Client(brokers=[server_address])
    worker = casq.Worker(client)
    done = threading.Lock()
    count = [0]

    def handler(job: casq.Job) -> None:
        with done:
            count[0] += 1
            if count[0] == jobs // 2:  # stop with ~50 handlers running: their acks go after the stream's half-close
                threading.Thread(target=worker.stop, kwargs={"timeout": 10.0}, daemon=True).start()
        time.sleep(0.05)

    worker.run(queue, handler, concurrency=50)
    client.close()  # as a process that exits after run() returns
    assert 0 < count[0] < jobs
    # Every job that ran was acked; none is left leased to the closed client.
    assert outstanding(setup, queue) == jobs - count[0]
    setup.close()


def dead_letters(client: casq.Client, queue: str) -> list[admin_service_pb2.DeadLetter]:
    request = admin_service_pb2.ListDeadLettersRequest(queue=queue)
    return list(client.admin_stub().ListDeadLetters(request, timeout=10).dead_letters)


def test_handler_base_exception_nacks_and_the_worker_goes_on(client: casq.Client) -> None:
    """A BaseException that is not an Exception (here a CancelledError out of the handler's asyncio.run) is a failure too."""
    queue = fresh_queue(client, max_attempts=1)  # a nack dead-letters the job with the SDK's reason
    casq.Producer(client).enqueue_batch(queue, [casq.NewMessage(f"m{i}") for i in range(3)])
    failed: list[casq.Job] = []
    done: list[str] = []
    errors: list[tuple[BaseException, casq.Job | None]] = []

    async def fetch() -> None:
        upstream = asyncio.get_running_loop().create_future()
        upstream.cancel("upstream gone")
        await upstream

    def handler(job: casq.Job) -> None:
        if not failed:
            failed.append(job)
            asyncio.run(fetch())  # raises asyncio.CancelledError, a BaseException
        done.append(job.text())

    worker = casq.Worker(client)
    thread = run_in_thread(
        worker, queue, handler, concurrency=1, lease_ttl=60.0, on_error=lambda error, job: errors.append((error, job))
    )
    wait_for(lambda: len(done) == 2)
    wait_for(lambda: len(dead_letters(client, queue)) == 1)  # nacked, not left leased (the lease outlives the test)
    wait_for(lambda: outstanding(client, queue) == 0)
    began = time.monotonic()
    worker.stop(10)
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - began < 2.5  # no held job left for the settle grace (5 s) to wait for
    dead = dead_letters(client, queue)[0]
    assert dead.message.id == failed[0].id and dead.attempts == 1
    assert dead.reason == "CancelledError: upstream gone"  # the reason of any handler failure: "Type: message"
    assert sorted(done + [failed[0].text()]) == ["m0", "m1", "m2"]
    assert [(type(error), job.id if job else None) for error, job in errors] == [
        (asyncio.CancelledError, failed[0].id)
    ]


def test_handler_system_exit_nacks_stops_and_run_raises_it(client: casq.Client) -> None:
    """SystemExit (or KeyboardInterrupt) in a handler: the job is nacked, the worker stops, run() raises it."""
    queue = fresh_queue(client, max_attempts=1)
    casq.Producer(client).enqueue_batch(queue, [casq.NewMessage(f"m{i}") for i in range(3)])
    started: list[casq.Job] = []
    raised: list[float] = []
    outcome: list[BaseException | None] = []
    returned: list[float] = []

    def all_leased() -> bool:
        figures = client.admin_stub().GetQueue(admin_service_pb2.GetQueueRequest(queue=queue), timeout=10)
        return [s for s in figures.subscriptions if s.subscription == "default"][0].in_flight == 3

    def handler(job: casq.Job) -> None:
        started.append(job)
        wait_for(all_leased)  # one running, two waiting
        raised.append(time.monotonic())
        sys.exit(3)

    def target() -> None:
        try:
            casq.Worker(client).run(queue, handler, concurrency=1, prefetch=3, lease_ttl=60.0)
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            outcome.append(error)
        returned.append(time.monotonic())

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(15)
    assert not thread.is_alive(), "run() did not end"
    assert len(outcome) == 1 and isinstance(outcome[0], SystemExit) and outcome[0].code == 3
    assert returned[0] - raised[0] < 2.5  # promptly: nothing waits out a grace period
    assert len(started) == 1  # no job started after it
    (dead,) = dead_letters(client, queue)
    assert dead.message.id == started[0].id and dead.reason == "SystemExit: 3"
    figures = client.admin_stub().GetQueue(admin_service_pb2.GetQueueRequest(queue=queue), timeout=10)
    default = [s for s in figures.subscriptions if s.subscription == "default"][0]
    assert (default.ready, default.in_flight) == (2, 0)  # the two waiting jobs handed back at once
