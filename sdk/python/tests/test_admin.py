"""casq.Admin and casq.aio.Admin against a real broker."""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid

import grpc
import pytest

import casq
import casq.aio
from casq.aio.admin import Admin as AsyncAdmin
from casq.v1 import admin_service_pb2


def fresh_name() -> str:
    return f"py-admin-{uuid.uuid4().hex[:12]}"


def test_queue_lifecycle(client: casq.Client) -> None:
    admin = casq.Admin(client)
    queue = fresh_name()
    created = admin.create_queue(
        queue,
        2,
        lease_ttl=1.5,
        max_attempts=3,
        backoff_initial=datetime.timedelta(milliseconds=200),
        backoff_max=0.4,
        backoff_multiplier=1.5,
        backoff_jitter=0.0,
        dedup_window=60,
        retention=0,
    )
    assert created.queue == queue and created.shard_count == 2
    assert created.config.lease_ttl.ToMilliseconds() == 1500
    assert created.config.max_attempts == 3
    assert created.config.backoff.initial_delay.ToMilliseconds() == 200
    assert created.config.backoff.max_delay.ToMilliseconds() == 400
    assert created.config.backoff.multiplier == 1.5 and created.config.backoff.jitter == 0.0
    assert created.config.dedup_window.ToSeconds() == 60

    assert created.created
    with pytest.raises(casq.AlreadyExistsError) as exists:
        admin.create_queue(queue)
    assert exists.value.code == grpc.StatusCode.ALREADY_EXISTS
    # if_not_exists: the existing queue as it is, not the shard count asked for.
    existing = admin.create_queue(queue, 1, if_not_exists=True)
    assert not existing.created and existing.shard_count == 2

    assert queue in [q.name for q in admin.list_queues()]
    described = admin.get_queue(queue)
    assert described.shard_count == 2 and len(described.shards) == 2
    assert [s.subscription for s in described.subscriptions] == ["default"]

    updated = admin.update_queue(queue, max_attempts=7)
    assert updated.config.max_attempts == 7
    assert updated.config.lease_ttl.ToMilliseconds() == 1500  # unset fields keep their values

    casq.Producer(client).enqueue(queue, "kept")
    with pytest.raises(casq.CasqError):
        admin.delete_queue(queue)  # FAILED_PRECONDITION: still holds a message
    admin.delete_queue(queue, force=True)
    with pytest.raises(casq.NotFoundError):
        admin.get_queue(queue)


def test_subscriptions_purge_and_documents(client: casq.Client) -> None:
    admin = casq.Admin(client)
    queue = fresh_name()
    admin.create_queue(queue)
    producer = casq.Producer(client)
    producer.enqueue_batch(queue, [casq.NewMessage("a"), casq.NewMessage("b")])

    earliest = admin.create_subscription(queue, "audit", start="earliest")
    assert earliest.start == admin_service_pb2.SUBSCRIPTION_START_EARLIEST and earliest.backlog == 2
    latest = admin.create_subscription(queue, "live")
    assert latest.start == admin_service_pb2.SUBSCRIPTION_START_LATEST and latest.backlog == 0
    with pytest.raises(ValueError):
        admin.create_subscription(queue, "bad", start="middle")  # type: ignore[arg-type]

    purged = admin.purge(queue, "audit")
    assert purged.messages_purged == 2
    with pytest.raises(ValueError):
        admin.purge(queue)
    dropped = admin.delete_subscription(queue, "live")
    assert dropped.leases_dropped == 0
    assert [s.subscription for s in admin.get_queue(queue).subscriptions] == ["audit", "default"]

    document = json.loads(admin.get_document(queue, 0))
    assert isinstance(document, dict)
    assert admin.purge(queue, all_subscriptions=True).messages_purged == 2


def test_dead_letters_and_redrive(client: casq.Client) -> None:
    admin = casq.Admin(client)
    queue = fresh_name()
    admin.create_queue(queue, max_attempts=1)
    first = casq.Producer(client).enqueue(queue, "one")
    casq.Producer(client).enqueue(queue, "two")
    claimed = client.queue_stub(client.current_broker).Claim(
        casq.v1.queue_service_pb2.ClaimRequest(queue=queue, worker_id="test", max_messages=2), timeout=10
    )
    receipts = [m.receipt for m in claimed.messages]
    client.queue_stub(client.current_broker).Nack(
        casq.v1.queue_service_pb2.NackRequest(queue=queue, receipts=receipts, dead_letter=True, reason="bad"),
        timeout=10,
    )
    letters = admin.list_dead_letters(queue)
    assert sorted(letter.message.payload for letter in letters) == [b"one", b"two"]
    assert {letter.reason for letter in letters} == {"bad"}

    by_id = admin.redrive(queue, ids=[first.id, "no-such-id"])
    assert by_id.redriven == 1 and list(by_id.missing_ids) == ["no-such-id"]
    assert admin.redrive(queue).redriven == 1
    assert admin.list_dead_letters(queue) == []
    with pytest.raises(TypeError):
        admin.redrive(queue, ids="abc")


def test_async_admin(server_address: str) -> None:
    async def scenario() -> None:
        async with casq.aio.Client(brokers=[server_address], timeout=10.0) as aclient:
            admin = AsyncAdmin(aclient)
            queue = fresh_name()
            created = await admin.create_queue(queue, 1, lease_ttl=datetime.timedelta(seconds=3), max_attempts=2)
            again = await admin.create_queue(queue, if_not_exists=True)
            assert not again.created and again.queue == queue
            assert created.config.lease_ttl.ToSeconds() == 3
            assert queue in [q.name for q in await admin.list_queues()]
            await casq.aio.Producer(aclient).enqueue(queue, b"x")
            assert (await admin.get_queue(queue)).totals.ready == 1
            assert (await admin.update_queue(queue, max_attempts=4)).config.max_attempts == 4
            assert (await admin.create_subscription(queue, "late", start="latest")).backlog == 0
            assert (await admin.delete_subscription(queue, "late")).messages_dropped == 0
            assert await admin.list_dead_letters(queue) == []
            assert (await admin.redrive(queue)).redriven == 0
            assert json.loads(await admin.get_document(queue))
            assert (await admin.purge(queue, "default")).messages_purged == 1
            await admin.delete_queue(queue, force=True)
            with pytest.raises(casq.NotFoundError):
                await admin.get_queue(queue)

    asyncio.run(scenario())
