"""A hung broker (SIGSTOP) does not defeat the producers, the admin or the unary calls.

A stopped process still accepts connections, so an attempt sent to it only
runs out of its own ``timeout`` (DEADLINE_EXCEEDED). The call must then move
on to the next broker and finish within ``retry_timeout``; the enqueue it
retries carries the same dedup ids, so it is stored once even when the hung
attempt was stored too.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from brokers import Broker, start_file_broker
from test_batch_split import Call, FakeBrokers, fake  # noqa: F401 - fake is a fixture

import casq
import casq.aio
from casq.v1 import queue_service_pb2

BOUND = 30.0  # upper bound of every wait: a hang fails the test instead of blocking the suite


def test_retried_enqueue_reuses_its_dedup_ids(fake: FakeBrokers) -> None:  # noqa: F811 - the fixture
    """Broker 0 stores the batch and then hangs; the retry at broker 1 sends the same dedup ids."""
    release = threading.Event()

    def store_then_hang(call: Call) -> grpc.StatusCode | None:
        if call.broker == 0:
            with fake.lock:
                fake.store(queue_service_pb2.EnqueueRequest(queue="q", messages=call.messages))
            release.wait(BOUND)
        return None

    fake.leader_of = {key: 1 for key in fake.leader_of}
    fake.on_call = store_then_hang
    messages = [casq.NewMessage("p-a", key="a"), casq.NewMessage("p-b", key="b", dedup_id="mine")]
    try:
        with casq.Client(fake.addresses, timeout=0.5, backoff_initial=0.001, backoff_max=0.01) as c:
            results = casq.Producer(c).enqueue_batch("q", messages)
    finally:
        release.set()
    assert [call.broker for call in fake.calls] == [0, 1]
    first, retry = ([m.dedup_id for m in call.messages] for call in fake.calls)
    assert first == retry and first[1] == "mine" and first[0] and first[0] != "mine"
    assert len(fake.stored) == 2  # stored once, by the hung attempt
    # The generated id was this call's own: not a duplicate to the caller; the user's id keeps the flag.
    assert [(r.id, r.duplicate) for r in results] == [("id-p-a", False), ("id-p-b", True)]

    # Each call chooses new ids; auto_dedup=False sends none.
    fake.on_call = None
    with casq.Client([fake.addresses[1]]) as c:
        casq.Producer(c).enqueue("q", "p-c", key="c")
        casq.Producer(c, auto_dedup=False).enqueue("q", "p-d", key="d")
    third, fourth = fake.calls[2].messages[0].dedup_id, fake.calls[3].messages[0].dedup_id
    assert third and third != first[0] and fourth == ""


@pytest.fixture
def leader_pair() -> Iterator[tuple[Broker, Broker, str]]:
    """Two ``casq serve`` on one file store (2 s leader lease); the first leads a new queue holding "before".

    Yields (leader, other, queue). Cleanup resumes (if stopped) and kills both.
    """
    store = Path(tempfile.mkdtemp(prefix="casq-py-hung-"))
    running: list[Broker] = []
    try:
        running += [start_file_broker(store), start_file_broker(store)]
        b0, b1 = running
        queue = f"py-hung-{uuid.uuid4().hex[:8]}"
        with casq.Client([b0.address], timeout=10.0) as only_b0:
            casq.Admin(only_b0).create_queue(queue)
            casq.Producer(only_b0).enqueue(queue, "before")
            shard = casq.Admin(only_b0).get_queue(queue).shards[0]
        assert shard.leader.address == b0.address
        yield b0, b1, queue
    finally:
        for broker in running:
            if broker.process.poll() is None:
                broker.process.send_signal(signal.SIGCONT)
            broker.kill()
        shutil.rmtree(store, ignore_errors=True)


@pytest.fixture
def stopped_leader(leader_pair: tuple[Broker, Broker, str]) -> tuple[Broker, Broker, str]:
    """``leader_pair`` with the leader SIGSTOPped: it keeps its connections and never answers."""
    leader_pair[0].process.send_signal(signal.SIGSTOP)
    return leader_pair


def test_enqueue_and_admin_leave_a_stopped_leader(stopped_leader: tuple[Broker, Broker, str]) -> None:
    b0, b1, queue = stopped_leader
    brokers = [b0.address, b1.address]

    # Each attempt at b0 runs out of its 3 s; b1 takes the shard over once b0's lease is over.
    with casq.Client(brokers, timeout=3.0, retry_timeout=20.0) as client:
        result = casq.Producer(client).enqueue(queue, "sync")
        assert not result.duplicate
        assert client.current_broker == b1.address

    async def aio_enqueue() -> casq.EnqueueResult:
        async with casq.aio.Client(brokers, timeout=3.0, retry_timeout=20.0) as client:
            return await casq.aio.Producer(client).enqueue(queue, "aio")

    aio_result = asyncio.run(aio_enqueue())
    assert not aio_result.duplicate

    with casq.Client(brokers, timeout=3.0, retry_timeout=20.0) as client:
        assert casq.Admin(client).get_queue(queue).queue == queue

    async def aio_admin() -> str:
        async with casq.aio.Client(brokers, timeout=3.0, retry_timeout=20.0) as client:
            return (await casq.aio.Admin(client).get_queue(queue)).queue

    assert asyncio.run(aio_admin()) == queue

    # b0 resumes: what it still had of the timed-out attempts must not be stored a second time.
    b0.process.send_signal(signal.SIGCONT)
    with casq.Client([b0.address], timeout=10.0) as only_b0:
        casq.Admin(only_b0).get_queue(queue)  # b0 answers again, so it has read what was queued for it
    with casq.Client([b1.address], timeout=10.0) as only_b1:
        payloads = drain(only_b1, queue)
    assert sorted(payloads) == ["aio", "before", "sync"]


def drain(client: casq.Client, queue: str) -> list[str]:
    """Every stored message's payload, claimed and acked through the unary API (until a claim finds none)."""
    stub = client.queue_stub(client.current_broker)
    payloads: list[str] = []
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        claimed = stub.Claim(
            queue_service_pb2.ClaimRequest(queue=queue, subscription="default", worker_id="drain", max_messages=10),
            timeout=10.0,
        )
        if not claimed.messages:
            return payloads
        payloads += [m.message.payload.decode() for m in claimed.messages]
        stub.Ack(
            queue_service_pb2.AckRequest(
                queue=queue, subscription="default", receipts=[m.receipt for m in claimed.messages]
            ),
            timeout=10.0,
        )
    raise AssertionError(f"still claiming after {BOUND}s")
