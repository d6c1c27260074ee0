"""Both workers log every handler failure through ``logging`` (logger ``casq.worker``, WARNING), silenceable."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from test_aio_worker import eventually, settled
from test_aio_worker import fresh_queue as aio_fresh_queue
from test_sdk import fresh_queue, outstanding, run_in_thread, wait_for

import casq
import casq.aio


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "casq.worker" and r.levelno == logging.WARNING]


def check_records(records: list[logging.LogRecord], job_id: str) -> None:
    """Attempt 1 raised (retried), attempt 2 was the last of 2 (dead-lettered), each with its traceback."""
    handler_failures = [r for r in records if "handler failed" in r.getMessage()]
    assert len(handler_failures) == 2, [r.getMessage() for r in records]
    first, last = (r.getMessage() for r in handler_failures)
    assert job_id in first and "attempt 1 of 2" in first and "retried" in first and "RuntimeError: boom 1" in first
    assert "attempt 2 of 2" in last and "dead-lettered" in last
    assert all(r.exc_info is not None and r.exc_info[0] is RuntimeError for r in handler_failures)
    assert all(getattr(r, "casq_job_id", None) == job_id for r in handler_failures)


def test_sync_worker_logs_each_handler_failure(client: casq.Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="casq.worker")
    queue = fresh_queue(client, max_attempts=2)
    sent = casq.Producer(client).enqueue(queue, "flaky")
    attempts: list[int] = []

    def handler(job: casq.Job) -> None:
        attempts.append(job.attempt)
        raise RuntimeError(f"boom {job.attempt}")

    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, handler)
    wait_for(lambda: len(attempts) == 2 and outstanding(client, queue) == 0)
    worker.stop(5)
    thread.join(5)
    check_records(failures(caplog), sent.id)


def test_aio_worker_logs_each_handler_failure(server_address: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="casq.worker")

    async def main() -> str:
        async with casq.aio.Client([server_address], timeout=10.0) as client:
            queue = await aio_fresh_queue(client, max_attempts=2)
            sent = await casq.aio.Producer(client).enqueue(queue, "flaky")
            attempts: list[int] = []

            async def handler(job: casq.Job) -> None:
                attempts.append(job.attempt)
                raise RuntimeError(f"boom {job.attempt}")

            worker = casq.aio.Worker(client)
            task = asyncio.create_task(worker.run(queue, handler))
            await eventually(lambda: len(attempts) == 2, "two attempts")
            await eventually(lambda: settled(client, queue), "dead-lettered")
            await asyncio.wait_for(worker.stop(5), 15)
            await task
            return sent.id

    job_id = asyncio.run(main())
    check_records(failures(caplog), job_id)


def test_dead_letter_is_logged_and_the_logger_can_be_silenced(
    client: casq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="casq.worker")
    queue = fresh_queue(client)
    producer = casq.Producer(client)
    sent = producer.enqueue(queue, "poison")
    handled = threading.Event()

    def handler(job: casq.Job) -> None:
        handled.set()
        raise casq.DeadLetter("cannot parse")

    worker = casq.Worker(client)
    thread = run_in_thread(worker, queue, handler)
    assert handled.wait(10)
    wait_for(lambda: outstanding(client, queue) == 0)
    (record,) = [r for r in failures(caplog) if sent.id in r.getMessage()]
    assert "dead-lettered by its handler: cannot parse" in record.getMessage()

    # Silenced the standard way: nothing more reaches the log.
    caplog.clear()
    logging.getLogger("casq.worker").setLevel(logging.ERROR)
    try:
        handled.clear()
        producer.enqueue(queue, "poison again")
        assert handled.wait(10)
        wait_for(lambda: outstanding(client, queue) == 0)
        assert failures(caplog) == []
    finally:
        logging.getLogger("casq.worker").setLevel(logging.NOTSET)
        worker.stop(5)
        thread.join(5)
