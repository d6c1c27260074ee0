"""Workers report settles the broker did not apply, settle off the handlers' threads, and leave a Work stream whose broker hangs.

A hung broker (SIGSTOP) keeps the connection up and never answers: without
a timeout on the stream's open and on its requests (acks, nacks,
heartbeats), a worker would wait on it forever. The workers end such a
stream after the client's ``timeout``, resend what was unanswered as unary
calls (which move on to another broker) and reconnect elsewhere.
"""

from __future__ import annotations

import asyncio
import signal
import threading

from brokers import Broker
from scripted_broker import QUEUE, ScriptedBroker, serve
from test_aio_worker import eventually
from test_aio_worker import fresh_queue as aio_fresh_queue
from test_hung_broker import BOUND, leader_pair, stopped_leader  # noqa: F401 - fixtures
from test_sdk import fresh_queue, outstanding, run_in_thread, wait_for

import casq
import casq.aio
from casq.v1 import admin_service_pb2, queue_service_pb2, queue_service_pb2_grpc


def dead_letter_own_delivery(stub: queue_service_pb2_grpc.QueueServiceStub, job: casq.Job) -> None:
    """Someone else settles the delivery first (here: a unary nack to the dead letters), so the worker's ack finds it gone."""
    stub.Nack(
        queue_service_pb2.NackRequest(
            queue=job.queue, subscription=job.subscription, receipts=[job.receipt], dead_letter=True, reason="taken"
        ),
        timeout=10.0,
    )


def test_sync_worker_reports_an_ack_that_found_the_lease_lost(client: casq.Client) -> None:
    queue = fresh_queue(client)
    casq.Producer(client).enqueue(queue, "x")
    errors: list[tuple[Exception, casq.Job | None]] = []
    handled = threading.Event()

    def handler(job: casq.Job) -> None:
        dead_letter_own_delivery(client.queue_stub(client.current_broker), job)
        handled.set()

    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, handler, on_error=lambda error, job: errors.append((error, job)))
    assert handled.wait(10)
    wait_for(lambda: any(isinstance(e, casq.LeaseLostError) for e, _ in errors))
    worker.stop(5)
    thread.join(5)
    error, job = next((e, j) for e, j in errors if isinstance(e, casq.LeaseLostError))
    assert job is not None and isinstance(error, casq.LeaseLostError) and error.receipt == job.receipt


def test_aio_worker_reports_an_ack_that_found_the_lease_lost(server_address: str) -> None:
    errors: list[tuple[Exception, casq.Job | None]] = []

    async def main() -> None:
        async with casq.aio.Client([server_address], timeout=10.0) as client:
            queue = await aio_fresh_queue(client)
            await casq.aio.Producer(client).enqueue(queue, "x")

            async def handler(job: casq.Job) -> None:
                with casq.Client([server_address], timeout=10.0) as sync_client:
                    dead_letter_own_delivery(sync_client.queue_stub(server_address), job)

            worker = casq.aio.Worker(client)
            task = asyncio.create_task(
                worker.run(queue, handler, on_error=lambda error, job: errors.append((error, job)))
            )
            await eventually(lambda: any(isinstance(e, casq.LeaseLostError) for e, _ in errors), "LEASE_LOST")
            await asyncio.wait_for(worker.stop(5), BOUND)
            await task

    asyncio.run(main())
    error, job = next((e, j) for e, j in errors if isinstance(e, casq.LeaseLostError))
    assert job is not None and isinstance(error, casq.LeaseLostError) and error.receipt == job.receipt


def test_workers_leave_a_stopped_broker_that_never_opens_the_stream(
    stopped_leader: tuple[Broker, Broker, str],
) -> None:
    b0, b1, queue = stopped_leader
    brokers = [b0.address, b1.address]
    got: list[str] = []
    errors: list[Exception] = []

    with casq.Client(brokers, timeout=3.0, retry_timeout=20.0) as client:
        worker = casq.Worker(client)
        thread = run_in_thread(
            worker, queue, lambda job: got.append(job.text()), on_error=lambda error, job: errors.append(error)
        )
        wait_for(lambda: got == ["before"], timeout=BOUND)
        worker.stop(5)
        thread.join(5)
    assert any(isinstance(e, casq.StreamTimeoutError) and b0.address in str(e) for e in errors)

    with casq.Client([b1.address], timeout=10.0) as only_b1:
        casq.Producer(only_b1).enqueue(queue, "after")
        wait_for(lambda: outstanding(only_b1, queue) == 1)  # "before" was acked (through b1)

    async def aio_worker() -> None:
        async with casq.aio.Client(brokers, timeout=3.0, retry_timeout=20.0) as client:
            done = asyncio.Event()

            async def handler(job: casq.Job) -> None:
                got.append(job.text())
                done.set()

            worker = casq.aio.Worker(client)
            task = asyncio.create_task(worker.run(queue, handler, on_error=lambda error, job: errors.append(error)))
            await asyncio.wait_for(done.wait(), BOUND)
            await asyncio.wait_for(worker.stop(5), BOUND)
            await task

    errors.clear()
    asyncio.run(aio_worker())
    assert got == ["before", "after"]
    assert any(isinstance(e, casq.StreamTimeoutError) for e in errors)
    with casq.Client([b1.address], timeout=10.0) as only_b1:
        wait_for(lambda: outstanding(only_b1, queue) == 0)


def test_sync_ack_on_a_stream_whose_broker_hangs_is_resent_elsewhere(
    leader_pair: tuple[Broker, Broker, str],
) -> None:
    """The leader hangs while a job runs: its ack, unanswered on the stream, lands through the other broker."""
    b0, b1, queue = leader_pair
    started, release = threading.Event(), threading.Event()
    attempts: list[int] = []
    errors: list[Exception] = []

    def handler(job: casq.Job) -> None:
        attempts.append(job.attempt)
        started.set()
        release.wait(BOUND)

    with casq.Client([b0.address, b1.address], timeout=3.0, retry_timeout=20.0) as client:
        worker = casq.Worker(client)
        thread = run_in_thread(worker, queue, handler, on_error=lambda error, job: errors.append(error))
        assert started.wait(BOUND)
        b0.process.send_signal(signal.SIGSTOP)
        release.set()
        with casq.Client([b1.address], timeout=10.0) as only_b1:
            wait_for(lambda: outstanding(only_b1, queue) == 0, timeout=BOUND)
        worker.stop(5)
        thread.join(5)
    assert attempts == [1]
    assert not any(isinstance(e, casq.LeaseLostError) for e in errors)


def test_sync_ack_waiting_for_its_answer_does_not_hold_a_handler_slot() -> None:
    """With concurrency 1, the second job starts while the first one's ack is still unanswered.

    The scripted broker answers the first ack only once the second handler
    started (or gives up after a while): a worker that waited for the answer on
    the handler's pool thread would run no handler meanwhile.
    """
    second_started = threading.Event()
    broker = ScriptedBroker(["first", "second"], hold_acks=second_started, hold_timeout=5.0)
    started: list[str] = []

    def handler(job: casq.Job) -> None:
        started.append(job.receipt)
        if job.receipt == "second":
            second_started.set()

    with serve(broker) as address, casq.Client([address], timeout=10.0) as client:
        worker = casq.Worker(client)
        thread = run_in_thread(worker, QUEUE, handler, concurrency=1, prefetch=2)
        try:
            wait_for(lambda: broker.settled() == {"first", "second"} and len(broker.held_in_time) >= 1, timeout=BOUND)
        finally:
            worker.stop(5)
            thread.join(5)
        assert not thread.is_alive()
    assert started == ["first", "second"]
    assert broker.settles[0] == ("stream ack", "first")
    assert broker.held_in_time[0], "the second handler waited for the first job's ack to be answered"


def test_sync_stop_hands_back_prefetched_jobs_while_a_handler_still_runs(client: casq.Client) -> None:
    """stop() hands the jobs received but not started back at once, not once the running handlers are over."""
    queue = fresh_queue(client)
    casq.Producer(client).enqueue_batch(queue, [casq.NewMessage(f"m{i}") for i in range(3)])
    started: list[str] = []
    running, finish = threading.Event(), threading.Event()

    def default_figures() -> tuple[int, int]:
        figures = client.admin_stub().GetQueue(admin_service_pb2.GetQueueRequest(queue=queue), timeout=10)
        default = [s for s in figures.subscriptions if s.subscription == "default"][0]
        return int(default.ready), int(default.in_flight)

    def handler(job: casq.Job) -> None:
        started.append(job.text())
        running.set()
        finish.wait(BOUND)

    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, handler, concurrency=1, prefetch=3, lease_ttl=60.0)
    assert running.wait(10)
    wait_for(lambda: default_figures() == (0, 3))  # one running, two received and waiting
    stopper = threading.Thread(target=worker.stop, kwargs={"timeout": BOUND}, daemon=True)
    stopper.start()
    try:
        # Handed back while the handler still runs: claimable again, not leased to the stopping worker.
        wait_for(lambda: default_figures() == (2, 1), timeout=5.0)
        assert not finish.is_set()
    finally:
        finish.set()
    stopper.join(10)
    thread.join(10)
    assert not thread.is_alive()
    assert len(started) == 1
    wait_for(lambda: default_figures() == (2, 0))  # the running job acked once its handler returned
