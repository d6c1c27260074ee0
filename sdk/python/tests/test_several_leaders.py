"""casq.aio.Worker on a queue whose shards are led by two brokers: one stream per leader.

The split is arranged like the shards-on-several-leaders scenario: two
``casq serve`` on one file store; broker 0 restarts gracefully on the same
address (releasing its leases), then an enqueue through broker 1 alone makes
it take over the shard of key "a", and enqueues through broker 0 alone make it
take the other one. (The sync Worker is covered by that scenario.)
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from brokers import Broker, start_file_broker

import casq
import casq.aio

BOUND = 30.0  # upper bound of every wait: a hang fails the test instead of blocking the suite
KEYS = "abcdefgh"


@dataclass
class Brokers:
    store: Path
    running: list[Broker] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [b.address for b in self.running]


@pytest.fixture
def brokers() -> Iterator[Brokers]:
    """Two ``casq serve`` on one fresh file store (2 s leader lease), killed afterwards."""
    pair = Brokers(Path(tempfile.mkdtemp(prefix="casq-py-several-leaders-")))
    try:
        pair.running += [start_file_broker(pair.store), start_file_broker(pair.store)]
        yield pair
    finally:
        for broker in pair.running:
            broker.kill()
        shutil.rmtree(pair.store, ignore_errors=True)


def split_shards(brokers: Brokers) -> str:
    """A new 2-shard queue whose shards are led one by each broker, holding k-a .. k-h; returns its name."""
    queue = f"py-aio-leaders-{uuid.uuid4().hex[:8]}"
    with casq.Client(brokers=brokers.addresses, timeout=10.0) as client:
        casq.Admin(client).create_queue(queue, 2, lease_ttl=2.0)
    # Creating the queue made one broker lead both shards; a graceful restart frees them.
    first = brokers.running[0]
    first.terminate(30.0)
    brokers.running[0] = start_file_broker(brokers.store, listen=first.address)
    for index, keys in ((1, KEYS[:1]), (0, KEYS[1:])):
        with casq.Client(brokers=[brokers.running[index].address], timeout=10.0) as only:
            producer = casq.Producer(only)
            for key in keys:
                producer.enqueue(queue, f"k-{key}", key=key)
    with casq.Client(brokers=brokers.addresses, timeout=10.0) as client:
        described = casq.Admin(client).get_queue(queue)
    now = time.time()
    leaders = {
        s.leader.address
        for s in described.shards
        if s.HasField("leader") and s.leader.lease_until.ToNanoseconds() / 1e9 > now
    }
    assert leaders == set(brokers.addresses), f"shards not split over both brokers: {described.shards}"
    return queue


def test_aio_worker_gets_jobs_from_every_shard_leader(brokers: Brokers) -> None:
    queue = split_shards(brokers)
    seen: list[str] = []
    errors: list[Exception] = []

    async def main() -> None:
        async with casq.aio.Client(brokers=brokers.addresses, timeout=10.0) as client:
            worker = casq.aio.Worker(client)

            async def handle(job: casq.Job) -> None:
                seen.append(job.text())

            task = asyncio.create_task(
                worker.run(queue, handle, concurrency=2, on_error=lambda error, job: errors.append(error))
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + BOUND
            while len(seen) < len(KEYS) and not task.done():
                assert loop.time() < deadline, f"only {sorted(seen)} of {len(KEYS)} jobs in time"
                await asyncio.sleep(0.05)
            await asyncio.wait_for(worker.stop(10.0), BOUND)
            await asyncio.wait_for(task, BOUND)  # raises if run() failed

    asyncio.run(main())
    assert sorted(seen) == [f"k-{key}" for key in KEYS]
    assert not errors, errors
    with casq.Client(brokers=brokers.addresses, timeout=10.0) as client:
        described = casq.Admin(client).get_queue(queue)
    default = [s for s in described.subscriptions if s.subscription == "default"][0]
    assert (default.ready, default.in_flight, default.counters.acked) == (0, 0, len(KEYS))


def test_sync_worker_carries_on_when_a_secondary_leader_dies(brokers: Brokers) -> None:
    """Broker 1 (secondary stream) is killed: its shard moves to broker 0 and the primary stream serves it."""
    queue = split_shards(brokers)
    seen: list[str] = []
    lock = threading.Lock()

    def handle(job: casq.Job) -> None:
        with lock:
            seen.append(job.text())

    def count() -> int:
        with lock:
            return len(seen)

    with casq.Client(brokers=brokers.addresses, timeout=10.0, retry_timeout=30.0) as client:
        worker = casq.Worker(client)
        failures: list[BaseException] = []

        def run() -> None:
            try:
                worker.run(queue, handle, concurrency=2)
            except BaseException as error:  # noqa: BLE001 - checked below
                failures.append(error)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            wait(lambda: count() >= len(KEYS), f"the first {len(KEYS)} jobs")
            brokers.running[1].kill()
            # The enqueue waits out broker 1's leader lease; broker 0 then leads both shards.
            casq.Producer(client).enqueue(queue, "k-a-again", key="a")
            wait(lambda: count() >= len(KEYS) + 1, "the job enqueued after the kill")
        finally:
            worker.stop(10.0)
            thread.join(BOUND)
        assert not thread.is_alive() and not failures, failures
    assert sorted(seen) == sorted([f"k-{key}" for key in KEYS] + ["k-a-again"])


def wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"not in time: {what}"
        time.sleep(0.05)
