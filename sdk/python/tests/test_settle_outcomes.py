"""A settle whose answer has no result for the job's receipt failed: UNKNOWN, never taken for a success.

The scripted broker leaves some receipts out of its ack and nack answers, on
the stream (where one answer may be a whole ack batch's) and as unary calls;
each such job is reported with an UNKNOWN CasqError, as the TypeScript and Go
SDKs do, and the job whose result is there is reported with nothing.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from scripted_broker import QUEUE, ScriptedBroker, serve
from test_aio_worker import eventually
from test_sdk import run_in_thread, wait_for

import casq
import casq.aio
from casq._settle import ack_failures, nack_failures
from casq.v1 import message_pb2

JOBS = ["acked", "ack-missing", "nack-missing"]
MISSING = {"ack-missing", "nack-missing"}


def unknowns(errors: list[tuple[Exception, casq.Job | None]]) -> dict[str, casq.CasqError]:
    """The UNKNOWN settle failures reported, by the receipt of their job."""
    return {
        job.receipt: error
        for error, job in errors
        if job is not None and isinstance(error, casq.CasqError) and error.code == grpc.StatusCode.UNKNOWN
    }


def check(broker: ScriptedBroker, errors: list[tuple[Exception, casq.Job | None]], via: str) -> None:
    found = unknowns(errors)
    assert set(found) == MISSING
    assert not any(isinstance(error, casq.LeaseLostError) for error, _ in errors)
    assert "no result" in found["ack-missing"].message and "ack of receipt ack-missing" in found["ack-missing"].message
    assert "nack of receipt nack-missing" in found["nack-missing"].message
    # Besides those, only the handler's own failure.
    others = [(type(error), job.receipt if job else None) for error, job in errors if error not in found.values()]
    assert others == [(RuntimeError, "nack-missing")]
    if via == "unary":
        assert {receipt for how, receipt in broker.settles if how.startswith("unary")} == set(JOBS)


def handler_for(job: casq.Job) -> None:
    if job.receipt == "nack-missing":
        raise RuntimeError("boom")


@pytest.mark.parametrize("via", ["stream", "unary"])
def test_sync_worker_reports_a_receipt_missing_from_the_answer_as_unknown(via: str) -> None:
    broker = ScriptedBroker(JOBS, missing=MISSING, fail_on_stream=via == "unary")
    errors: list[tuple[Exception, casq.Job | None]] = []
    with serve(broker) as address, casq.Client([address], timeout=10.0, retry_timeout=10.0) as client:
        worker = casq.Worker(client)
        thread = run_in_thread(
            worker, QUEUE, handler_for, concurrency=3, prefetch=3, on_error=lambda e, j: errors.append((e, j))
        )
        try:
            wait_for(lambda: len(unknowns(errors)) == 2 and broker.settled() == set(JOBS))
        finally:
            worker.stop(5)
            thread.join(5)
        assert not thread.is_alive()
    check(broker, errors, via)


@pytest.mark.parametrize("via", ["stream", "unary"])
def test_aio_worker_reports_a_receipt_missing_from_the_answer_as_unknown(via: str) -> None:
    broker = ScriptedBroker(JOBS, missing=MISSING, fail_on_stream=via == "unary")
    errors: list[tuple[Exception, casq.Job | None]] = []

    async def handler(job: casq.Job) -> None:
        handler_for(job)

    async def main(address: str) -> None:
        async with casq.aio.Client([address], timeout=10.0, retry_timeout=10.0) as client:
            worker = casq.aio.Worker(client)
            task = asyncio.create_task(
                worker.run(QUEUE, handler, concurrency=3, prefetch=3, on_error=lambda e, j: errors.append((e, j)))
            )
            try:
                await eventually(lambda: len(unknowns(errors)) == 2 and broker.settled() == set(JOBS), "the settles")
            finally:
                await asyncio.wait_for(worker.stop(5), 10)
                await task

    with serve(broker) as address:
        asyncio.run(asyncio.wait_for(main(address), 30))
    check(broker, errors, via)


def test_each_receipt_sent_needs_a_known_outcome() -> None:
    """The outcomes of a batch, receipt by receipt: a missing result or an outcome the SDK does not know is UNKNOWN."""
    acked = [
        message_pb2.AckResult(receipt="a", outcome=message_pb2.ACK_OUTCOME_ACKED),
        message_pb2.AckResult(receipt="b", outcome=message_pb2.ACK_OUTCOME_ALREADY_ACKED),
        message_pb2.AckResult(receipt="c", outcome=message_pb2.ACK_OUTCOME_LEASE_LOST),
        message_pb2.AckResult(receipt="d", outcome=message_pb2.ACK_OUTCOME_UNSPECIFIED),
    ]
    failures = ack_failures(["a", "b", "c", "d", "e"], acked)
    assert [(type(f), f.code) for f in failures] == [
        (casq.LeaseLostError, grpc.StatusCode.ABORTED),
        (casq.CasqError, grpc.StatusCode.UNKNOWN),
        (casq.CasqError, grpc.StatusCode.UNKNOWN),
    ]
    assert "outcome 0" in failures[1].message and "receipt d" in failures[1].message
    assert "no result" in failures[2].message and "receipt e" in failures[2].message
    nacked = [
        message_pb2.NackResult(receipt="a", outcome=message_pb2.NACK_OUTCOME_RETRY_SCHEDULED),
        message_pb2.NackResult(receipt="b", outcome=message_pb2.NACK_OUTCOME_DEAD_LETTERED),
        message_pb2.NackResult(receipt="c", outcome=message_pb2.NACK_OUTCOME_LEASE_LOST),
    ]
    failures = nack_failures(["a", "b", "c", "d"], nacked)
    assert [(type(f), f.code) for f in failures] == [
        (casq.LeaseLostError, grpc.StatusCode.ABORTED),
        (casq.CasqError, grpc.StatusCode.UNKNOWN),
    ]
