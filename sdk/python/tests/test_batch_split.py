"""Enqueue batches spanning shards led by several brokers (BatchRedirect).

Mostly against fake brokers; the last test uses two real ``casq serve``
(the sync producer against real brokers is covered by the
shards-on-several-leaders scenario).

The fake brokers answer Enqueue the way ``casq serve`` does when a queue's
shards have different leaders: a batch whose keys all belong to this broker
is stored; one whose keys all belong to a single other broker gets a
LeaderRedirect; one spanning several brokers gets UNAVAILABLE with a
BatchRedirect detail and nothing is stored. Tests can move a key's
leadership after a call, to make a sub-batch itself span leaders.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pytest
from google.protobuf.any_pb2 import Any
from test_errors import FakeRpcError
from test_several_leaders import Brokers, brokers, split_shards  # noqa: F401 - brokers is a fixture

import casq
import casq.aio
from casq._messages import MAX_BATCH_SPLITS
from casq.errors import LEADER_ADDRESS_KEY, BatchRedirectError, error_from_rpc, error_from_status
from casq.v1 import errors_pb2, message_pb2, queue_service_pb2

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
KEYS = "abcdefgh"


@dataclass
class Call:
    broker: int
    keys: list[str]
    messages: list[message_pb2.NewMessage]
    metadata: dict[str, str]


@dataclass
class FakeBrokers:
    """Fake brokers on localhost; ``leader_of`` maps a message key to the index of the broker leading it."""

    leader_of: dict[str, int]
    addresses: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    stored: dict[str, str] = field(default_factory=dict)  # dedup id (or payload) -> message id
    # Called with each Call before it is answered; may change leader_of or raise an RpcError code.
    on_call: Callable[[Call], grpc.StatusCode | None] | None = None
    # Answer every batch with a BatchRedirect sending it all back to the same broker.
    always_split: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enqueue(
        self, broker: int, request: queue_service_pb2.EnqueueRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.EnqueueResponse:
        metadata = {key: value for key, value in context.invocation_metadata() if isinstance(value, str)}
        call = Call(broker, [m.key for m in request.messages], list(request.messages), metadata)
        with self.lock:
            self.calls.append(call)
        failure = self.on_call(call) if self.on_call is not None else None
        if failure is not None:
            context.abort(failure, "failed on purpose")
        with self.lock:
            owners = [self.leader_of[m.key] for m in request.messages]
            if self.always_split:
                route = errors_pb2.BatchRoute(
                    leader_address=self.addresses[broker], message_indexes=range(len(request.messages))
                )
                self.abort_with(context, errors_pb2.BatchRedirect(queue=request.queue, routes=[route]))
            if set(owners) == {broker}:
                return self.store(request)
            if len(set(owners)) == 1:
                leader = owners[0]
                self.abort_with(
                    context,
                    errors_pb2.LeaderRedirect(leader_address=self.addresses[leader], queue=request.queue),
                    ((LEADER_ADDRESS_KEY, self.addresses[leader]),),
                )
            routes: dict[int, list[int]] = {}
            for index, owner in enumerate(owners):
                routes.setdefault(owner, []).append(index)
            redirect = errors_pb2.BatchRedirect(
                queue=request.queue,
                routes=[
                    errors_pb2.BatchRoute(leader_address=self.addresses[owner], message_indexes=indexes)
                    for owner, indexes in routes.items()
                ],
            )
            self.abort_with(context, redirect)
        raise AssertionError("unreachable: abort raises")

    def store(self, request: queue_service_pb2.EnqueueRequest) -> queue_service_pb2.EnqueueResponse:
        response = queue_service_pb2.EnqueueResponse()
        for message in request.messages:
            name = message.dedup_id or message.payload.decode()
            duplicate = name in self.stored
            if not duplicate:
                self.stored[name] = f"id-{message.payload.decode()}"
            response.messages.add(id=self.stored[name], shard=KEYS.index(message.key), duplicate=duplicate)
        return response

    @staticmethod
    def abort_with(
        context: grpc.ServicerContext,
        detail: errors_pb2.LeaderRedirect | errors_pb2.BatchRedirect,
        trailers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        packed = Any()
        packed.Pack(detail)
        status = errors_pb2.RpcStatus(code=14, message="led elsewhere", details=[packed])
        context.set_trailing_metadata((*trailers, ("grpc-status-details-bin", status.SerializeToString())))
        context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader of every shard of the batch")


@pytest.fixture
def fake() -> Iterator[FakeBrokers]:
    """Two fake brokers: broker 0 leads keys a-d, broker 1 leads e-h."""
    brokers = FakeBrokers(leader_of={key: (0 if key < "e" else 1) for key in KEYS})
    servers: list[grpc.Server] = []
    for index in range(2):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.method_handlers_generic_handler(
            "casq.v1.QueueService",
            {
                "Enqueue": grpc.unary_unary_rpc_method_handler(
                    lambda request, context, index=index: brokers.enqueue(index, request, context),
                    request_deserializer=queue_service_pb2.EnqueueRequest.FromString,
                    response_serializer=queue_service_pb2.EnqueueResponse.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        brokers.addresses.append(f"127.0.0.1:{port}")
    try:
        yield brokers
    finally:
        for server in servers:
            server.stop(None)


def batch(keys: str = "aebfcgdh") -> list[casq.NewMessage]:
    """Messages interleaving the two brokers' keys, with dedup ids and other fields to carry over."""
    return [
        casq.NewMessage(f"p-{key}", key=key, priority=i, headers={"h": key}, max_attempts=3, dedup_id=f"d-{key}")
        for i, key in enumerate(keys)
    ]


def client(fake: FakeBrokers, retry_timeout: float = 30.0) -> casq.Client:
    """A client that knows broker 0 only (it learns of broker 1 from the redirects)."""
    only_first = [fake.addresses[0]]
    return casq.Client(only_first, token="t", backoff_initial=0.001, backoff_max=0.01, retry_timeout=retry_timeout)


def aio_client(fake: FakeBrokers) -> casq.aio.Client:
    return casq.aio.Client([fake.addresses[0]], token="t", timeout=10.0, backoff_initial=0.001, backoff_max=0.01)


def check_split_results(fake: FakeBrokers, results: list[casq.EnqueueResult], keys: str = "aebfcgdh") -> None:
    assert [r.id for r in results] == [f"id-p-{key}" for key in keys]
    assert [r.shard for r in results] == [KEYS.index(key) for key in keys]
    assert not any(r.duplicate for r in results)
    for call in fake.calls:
        assert call.metadata.get("traceparent") == TRACEPARENT
        assert call.metadata.get("authorization") == "Bearer t"
        for message in call.messages:
            # Every field travelled unchanged into every (sub-)batch.
            i = keys.index(message.key)
            fields = (message.payload, message.priority, dict(message.headers), message.max_attempts, message.dedup_id)
            assert fields == (f"p-{message.key}".encode(), i, {"h": message.key}, 3, f"d-{message.key}")


def test_batch_redirect_detail_becomes_a_typed_error() -> None:
    redirect = errors_pb2.BatchRedirect(
        queue="q",
        routes=[
            errors_pb2.BatchRoute(leader_address="a:1", message_indexes=[0, 2]),
            errors_pb2.BatchRoute(leader_address="b:1", message_indexes=[1]),
        ],
    )
    packed = Any()
    packed.Pack(redirect)
    status = errors_pb2.RpcStatus(code=14, message="split", details=[packed])
    trailers = (("grpc-status-details-bin", status.SerializeToString()),)
    error = error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "split", trailers))
    assert isinstance(error, BatchRedirectError) and not isinstance(error, casq.UnavailableError)
    assert (error.code, error.queue) == (grpc.StatusCode.UNAVAILABLE, "q")
    assert error.routes == [("a:1", [0, 2]), ("b:1", [1])]
    assert isinstance(error_from_status(status), BatchRedirectError)
    # Final for the retry loop: one attempt, no failover.
    attempts: list[str] = []

    def attempt(address: str) -> None:
        attempts.append(address)
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "split", trailers)

    with pytest.raises(BatchRedirectError):
        casq.Client(["x:1", "y:1"]).call(attempt)
    assert attempts == ["x:1"]


def test_sync_batch_is_split_by_routes_and_merged_in_request_order(fake: FakeBrokers) -> None:
    with client(fake) as c:
        results = casq.Producer(c).enqueue_batch("q", batch(), traceparent=TRACEPARENT)
    check_split_results(fake, results)
    # The whole batch to broker 0, then one sub-batch per broker (original order, parallel).
    assert fake.calls[0].broker == 0 and fake.calls[0].keys == list("aebfcgdh")
    assert sorted((c.broker, c.keys) for c in fake.calls[1:]) == [(0, list("abcd")), (1, list("efgh"))]
    # Sent again, the dedup ids make every message a duplicate of the stored one.
    with client(fake) as c:
        again = casq.Producer(c).enqueue_batch("q", batch(), traceparent=TRACEPARENT)
    assert [r.id for r in again] == [r.id for r in results] and all(r.duplicate for r in again)


def test_sub_batch_split_again_and_redirected_when_leadership_moves(fake: FakeBrokers) -> None:
    def on_call(call: Call) -> grpc.StatusCode | None:
        # Leadership moves while the first split is under way: "c" to broker 1,
        # so broker 0's part spans both brokers again (a second split), and
        # e-h to broker 0, so broker 1 redirects its whole part there.
        with fake.lock:
            if call.broker == 0 and call.keys == list("abcd"):
                fake.leader_of["c"] = 1
            if call.broker == 1 and call.keys == list("efgh"):
                fake.leader_of.update({"e": 0, "f": 0, "g": 0, "h": 0})
        return None

    fake.on_call = on_call
    with client(fake) as c:
        results = casq.Producer(c).enqueue_batch("q", batch(), traceparent=TRACEPARENT)
    check_split_results(fake, results)
    calls = [(c.broker, c.keys) for c in fake.calls]
    assert (0, list("abd")) in calls and (1, ["c"]) in calls  # the second split of broker 0's part
    assert (0, list("efgh")) in calls  # broker 1's part, all redirected to broker 0
    assert len(fake.stored) == len(KEYS)


def test_split_limit_fails_with_a_batch_redirect_error(fake: FakeBrokers) -> None:
    fake.always_split = True
    with client(fake) as c, pytest.raises(BatchRedirectError, match="after 3 splits") as raised:
        casq.Producer(c).enqueue_batch("q", batch("ab"))
    assert raised.value.routes == [(fake.addresses[0], [0, 1])]
    assert len(fake.calls) == MAX_BATCH_SPLITS + 1 and not fake.stored


def test_failed_sub_batch_fails_the_call_after_the_others_finished(fake: FakeBrokers) -> None:
    fake.on_call = lambda call: grpc.StatusCode.INVALID_ARGUMENT if call.keys == list("efgh") else None
    with client(fake) as c, pytest.raises(casq.InvalidArgumentError):
        casq.Producer(c).enqueue_batch("q", batch())
    assert sorted(fake.stored) == ["d-a", "d-b", "d-c", "d-d"]


def test_sub_batches_share_the_call_retry_budget(fake: FakeBrokers) -> None:
    # Broker 1 is "down" for good: its sub-batch fails over (broker 0 redirects
    # it back to broker 1) and retries until the call's retry_timeout, then the
    # call fails with UNAVAILABLE: the outage, or the last redirect to the dead
    # broker, whichever attempt the budget ran out on.
    fake.on_call = lambda call: grpc.StatusCode.UNAVAILABLE if call.broker == 1 else None
    with client(fake, retry_timeout=0.2) as c, pytest.raises(casq.CasqError) as failure:
        casq.Producer(c).enqueue_batch("q", batch())
    assert failure.value.code == grpc.StatusCode.UNAVAILABLE
    assert not isinstance(failure.value, casq.BatchRedirectError)


def test_aio_batch_is_split_and_merged(fake: FakeBrokers) -> None:
    async def main() -> list[casq.EnqueueResult]:
        async with aio_client(fake) as c:
            return await casq.aio.Producer(c).enqueue_batch("q", batch(), traceparent=TRACEPARENT)

    results = asyncio.run(main())
    check_split_results(fake, results)
    assert sorted((c.broker, c.keys) for c in fake.calls[1:]) == [(0, list("abcd")), (1, list("efgh"))]


def test_aio_split_limit_and_cancellation(fake: FakeBrokers) -> None:
    fake.always_split = True

    async def limited() -> None:
        async with aio_client(fake) as c:
            await casq.aio.Producer(c).enqueue_batch("q", batch("ab"))

    with pytest.raises(BatchRedirectError):
        asyncio.run(limited())
    assert len(fake.calls) == MAX_BATCH_SPLITS + 1

    # A sub-batch that hangs: cancelling the call (here by wait_for) cancels it.
    fake.always_split = False
    release = threading.Event()

    def hang(call: Call) -> None:
        if call.broker == 1:
            release.wait(30)
        return None

    fake.on_call = hang

    async def cancelled() -> None:
        async with aio_client(fake) as c:
            await asyncio.wait_for(casq.aio.Producer(c).enqueue_batch("q", batch()), 0.5)

    try:
        with pytest.raises(asyncio.TimeoutError):
            asyncio.run(cancelled())
    finally:
        release.set()


def test_aio_batch_spanning_real_leaders(brokers: Brokers) -> None:  # noqa: F811 - the fixture
    """Two ``casq serve`` leading one shard each: the asyncio producer's batch is split and stored once."""
    queue = split_shards(brokers)
    messages = [casq.NewMessage(f"b-{key}", key=key, dedup_id=f"b-{key}") for key in KEYS]

    async def main() -> tuple[list[casq.EnqueueResult], list[casq.EnqueueResult]]:
        async with casq.aio.Client([brokers.addresses[0]], timeout=10.0) as c:
            producer = casq.aio.Producer(c)
            return await producer.enqueue_batch(queue, messages), await producer.enqueue_batch(queue, messages)

    first, again = asyncio.run(main())
    assert len(first) == len(KEYS) and all(r.id and not r.duplicate for r in first)
    assert {r.shard for r in first} == {0, 1}
    assert [r.id for r in again] == [r.id for r in first] and all(r.duplicate for r in again)
