"""Proves that the generated Python code of the casq.v1 API works.

The messages survive binary and JSON round trips (oneofs and optional fields
included), the descriptors describe both services (Work is a bidirectional
stream), the redirect detail decodes from a real gRPC error, and the gRPC stubs
carry unary calls and the Work stream over loopback TCP.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.timestamp_pb2 import Timestamp

from casq.errors import LEADER_ADDRESS_KEY, STATUS_DETAILS_KEY
from casq.v1 import (
    admin_service_pb2,
    errors_pb2,
    message_pb2,
    queue_config_pb2,
    queue_service_pb2,
    queue_service_pb2_grpc,
    shard_pb2,
    work_pb2,
)


def sample_message() -> message_pb2.Message:
    return message_pb2.Message(
        id="01J00000000000000000000000",
        queue="emails",
        shard=2,
        offset=1 << 40,
        payload=b"\x00\xffhi",
        headers={"content-type": "application/json", "schema": "v3"},
        key="customer-42",
        priority=-7,
        run_at=Timestamp(seconds=1_893_553_445, nanos=6),
        max_attempts=5,
        dedup_id="order-9",
        enqueued_at=Timestamp(seconds=1_893_553_440),
        trace_context=message_pb2.TraceContext(
            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            tracestate="vendor=value",
        ),
    )


def sample_job(receipt: str = "r-2-1099511627776-3") -> message_pb2.ClaimedMessage:
    return message_pb2.ClaimedMessage(
        message=sample_message(),
        subscription="default",
        receipt=receipt,
        attempt=3,
        max_attempts=5,
        lease_deadline=Timestamp(seconds=1_893_553_500),
    )


def assert_round_trips(original: ProtoMessage) -> None:
    decoded = type(original).FromString(original.SerializeToString())
    assert decoded == original
    from_json = json_format.Parse(json_format.MessageToJson(original), type(original)())
    assert from_json == original


def test_message_round_trips() -> None:
    assert_round_trips(sample_message())
    assert_round_trips(sample_job())
    js = json_format.MessageToJson(sample_job())
    assert '"dedupId": "order-9"' in js
    assert '"leaseDeadline": "2030-01-02T03:05:00Z"' in js


def test_new_message_schedule_oneof() -> None:
    msg = message_pb2.NewMessage(payload=b"job", delay=Duration(seconds=90))
    assert msg.WhichOneof("schedule") == "delay"
    msg.run_at.FromSeconds(1_893_553_445)
    assert msg.WhichOneof("schedule") == "run_at"
    req = queue_service_pb2.EnqueueRequest(queue="q", messages=[msg])
    decoded = queue_service_pb2.EnqueueRequest.FromString(req.SerializeToString())
    assert decoded.messages[0].run_at.seconds == 1_893_553_445


def test_work_request_oneof_round_trip() -> None:
    requests = [
        work_pb2.WorkRequest(
            open=work_pb2.WorkOpen(queue="emails", worker_id="host-1/pid-7", credits=10, lease_ttl=Duration(seconds=30))
        ),
        work_pb2.WorkRequest(credit=work_pb2.WorkCredit(credits=3)),
        work_pb2.WorkRequest(request_id=7, heartbeat=work_pb2.WorkHeartbeat(receipts=["a", "b"])),
        work_pb2.WorkRequest(request_id=8, ack=work_pb2.WorkAck(receipts=["a"])),
        work_pb2.WorkRequest(
            request_id=9,
            nack=work_pb2.WorkNack(receipts=["b"], delay=Duration(), dead_letter=True, reason="bad input"),
        ),
    ]
    for request in requests:
        assert_round_trips(request)
    assert [r.WhichOneof("command") for r in requests] == ["open", "credit", "heartbeat", "ack", "nack"]

    decoded = work_pb2.WorkRequest.FromString(requests[4].SerializeToString())
    assert decoded.WhichOneof("command") == "nack"
    assert decoded.request_id == 9
    assert not decoded.HasField("open")
    # An explicit zero delay (retry at once) stays distinguishable from none (backoff).
    assert decoded.nack.HasField("delay")
    assert decoded.nack.dead_letter and decoded.nack.reason == "bad input"

    job = work_pb2.WorkResponse(job=sample_job())
    assert_round_trips(job)
    assert work_pb2.WorkResponse.FromString(job.SerializeToString()).WhichOneof("event") == "job"


def test_queue_config_presence() -> None:
    patch = admin_service_pb2.UpdateQueueRequest(
        queue="q",
        config=queue_config_pb2.QueueConfig(
            max_attempts=0, limits=queue_config_pb2.QueueLimits(dead_letter_limit=0)
        ),
    )
    assert_round_trips(patch)
    config = admin_service_pb2.UpdateQueueRequest.FromString(patch.SerializeToString()).config
    # Explicit zeros survive (set to 0); unset fields stay unset (keep the current value).
    assert config.HasField("max_attempts") and config.limits.HasField("dead_letter_limit")
    assert not config.limits.HasField("max_batch")
    assert not config.HasField("backoff") and not config.HasField("lease_ttl")


Shape = tuple[str, str, bool, bool]


def unary(name: str) -> Shape:
    return (f"casq.v1.{name}Request", f"casq.v1.{name}Response", False, False)


def test_service_descriptors() -> None:
    queue = queue_service_pb2.DESCRIPTOR.services_by_name["QueueService"]
    assert queue.full_name == "casq.v1.QueueService"
    assert {
        m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
        for m in queue.methods
    } == {
        "Enqueue": unary("Enqueue"),
        "EnqueueStream": ("casq.v1.EnqueueStreamRequest", "casq.v1.EnqueueStreamResponse", True, True),
        "Claim": unary("Claim"),
        "Heartbeat": unary("Heartbeat"),
        "Ack": unary("Ack"),
        "Nack": unary("Nack"),
        "Work": ("casq.v1.WorkRequest", "casq.v1.WorkResponse", True, True),
        "LookupShards": unary("LookupShards"),
    }

    admin = admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"]
    assert admin.full_name == "casq.v1.AdminService"
    assert {
        m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
        for m in admin.methods
    } == {
        "ListQueues": unary("ListQueues"),
        "GetQueue": unary("GetQueue"),
        "CreateQueue": unary("CreateQueue"),
        "UpdateQueue": unary("UpdateQueue"),
        "DeleteQueue": unary("DeleteQueue"),
        "CreateSubscription": unary("CreateSubscription"),
        "DeleteSubscription": unary("DeleteSubscription"),
        "PurgeQueue": unary("PurgeQueue"),
        "ListDeadLetters": unary("ListDeadLetters"),
        "RedriveDeadLetters": unary("RedriveDeadLetters"),
        "GetDocument": ("casq.v1.GetDocumentRequest", "casq.v1.GetDocumentResponse", False, True),
        "RepairShard": unary("RepairShard"),
    }


REDIRECT = errors_pb2.LeaderRedirect(
    leader_address="10.0.0.7:7070", leader_id="broker-b", epoch=12, queue="emails", shard=1
)


class FakeQueue(queue_service_pb2_grpc.QueueServiceServicer):
    """Echoes enqueues, never has anything to claim, redirects acks, and runs a tiny Work session."""

    def Enqueue(
        self, request: queue_service_pb2.EnqueueRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.EnqueueResponse:
        return queue_service_pb2.EnqueueResponse(
            messages=[
                queue_service_pb2.EnqueuedMessage(id=f"{request.queue}/{m.payload.decode()}", offset=i)
                for i, m in enumerate(request.messages)
            ]
        )

    def Claim(
        self, request: queue_service_pb2.ClaimRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.ClaimResponse:
        return queue_service_pb2.ClaimResponse()

    def Heartbeat(
        self, request: queue_service_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.HeartbeatResponse:
        return queue_service_pb2.HeartbeatResponse(
            results=[
                message_pb2.HeartbeatResult(receipt=r, outcome=message_pb2.HEARTBEAT_OUTCOME_LOST)
                for r in request.receipts
            ]
        )

    def Nack(
        self, request: queue_service_pb2.NackRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.NackResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "nack is not implemented by this fake")

    def EnqueueStream(
        self,
        request_iterator: Iterator[queue_service_pb2.EnqueueStreamRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[queue_service_pb2.EnqueueStreamResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the stream is not implemented by this fake")

    def LookupShards(
        self, request: queue_service_pb2.LookupShardsRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.LookupShardsResponse:
        return queue_service_pb2.LookupShardsResponse(shards=[shard_pb2.ShardRoute(shard=0)])

    def Ack(self, request: queue_service_pb2.AckRequest, context: grpc.ServicerContext) -> queue_service_pb2.AckResponse:
        message = "shard emails/1 is led by broker-b; resend to 10.0.0.7:7070"
        details = errors_pb2.RpcStatus(code=grpc.StatusCode.UNAVAILABLE.value[0], message=message)
        details.details.add().Pack(REDIRECT)
        context.set_trailing_metadata(
            (
                (LEADER_ADDRESS_KEY, REDIRECT.leader_address),
                (STATUS_DETAILS_KEY, details.SerializeToString()),
            )
        )
        context.abort(grpc.StatusCode.UNAVAILABLE, message)

    def Work(
        self, request_iterator: Iterator[work_pb2.WorkRequest], context: grpc.ServicerContext
    ) -> Iterator[work_pb2.WorkResponse]:
        first = next(request_iterator)
        if first.WhichOneof("command") != "open":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message of a Work stream must be open")
        yield work_pb2.WorkResponse(
            request_id=first.request_id,
            opened=work_pb2.WorkOpened(
                session_id="s-1",
                queue=first.open.queue,
                subscription="default",
                lease_ttl=Duration(seconds=30),
                heartbeat_interval=Duration(seconds=10),
                max_credits=1000,
                routing=work_pb2.WorkRouting(serving_shards=[0], shards=[shard_pb2.ShardRoute(shard=0)]),
            ),
        )
        for i in range(first.open.credits):
            yield work_pb2.WorkResponse(job=sample_job(receipt=f"r{i}"))
        for request in request_iterator:
            if request.WhichOneof("command") == "ack":
                yield work_pb2.WorkResponse(
                    request_id=request.request_id,
                    acked=work_pb2.WorkAcked(
                        results=[
                            message_pb2.AckResult(receipt=r, outcome=message_pb2.ACK_OUTCOME_ACKED)
                            for r in request.ack.receipts
                        ]
                    ),
                )


@pytest.fixture
def stub() -> Iterator[queue_service_pb2_grpc.QueueServiceStub]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    queue_service_pb2_grpc.add_QueueServiceServicer_to_server(FakeQueue(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield queue_service_pb2_grpc.QueueServiceStub(channel)
    finally:
        channel.close()
        server.stop(grace=None)


def test_unary_stubs_over_loopback(stub: queue_service_pb2_grpc.QueueServiceStub) -> None:
    response = stub.Enqueue(
        queue_service_pb2.EnqueueRequest(
            queue="emails",
            messages=[message_pb2.NewMessage(payload=b"a"), message_pb2.NewMessage(payload=b"b")],
        ),
        timeout=10,
    )
    assert [(m.id, m.offset) for m in response.messages] == [("emails/a", 0), ("emails/b", 1)]

    claimed = stub.Claim(queue_service_pb2.ClaimRequest(queue="emails", worker_id="w1"), timeout=10)
    assert list(claimed.messages) == []

    beat = stub.Heartbeat(queue_service_pb2.HeartbeatRequest(queue="emails", worker_id="w1", receipts=["r9"]), timeout=10)
    assert [(r.receipt, r.outcome, r.HasField("lease_deadline")) for r in beat.results] == [
        ("r9", message_pb2.HEARTBEAT_OUTCOME_LOST, False)
    ]

    routes = stub.LookupShards(queue_service_pb2.LookupShardsRequest(queue="emails"), timeout=10)
    assert [(r.shard, r.HasField("leader")) for r in routes.shards] == [(0, False)]

    with pytest.raises(grpc.RpcError) as failure:
        stub.Nack(queue_service_pb2.NackRequest(queue="emails", receipts=["r1"]), timeout=10)
    assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_redirect_detail_over_loopback(stub: queue_service_pb2_grpc.QueueServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        stub.Ack(queue_service_pb2.AckRequest(queue="emails", receipts=["r1"]), timeout=10)
    error = failure.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    # Text values arrive as str, "-bin" values as bytes.
    trailers: dict[str, str | bytes] = {m.key: m.value for m in error.trailing_metadata()}
    assert trailers[LEADER_ADDRESS_KEY] == "10.0.0.7:7070"
    raw = trailers[STATUS_DETAILS_KEY]
    assert isinstance(raw, bytes)
    status = errors_pb2.RpcStatus.FromString(raw)
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert status.details[0].type_url == "type.googleapis.com/casq.v1.LeaderRedirect"
    redirect = errors_pb2.LeaderRedirect()
    assert status.details[0].Unpack(redirect)
    assert redirect == REDIRECT


def test_work_stream_over_loopback(stub: queue_service_pb2_grpc.QueueServiceStub) -> None:
    def requests() -> Iterator[work_pb2.WorkRequest]:
        yield work_pb2.WorkRequest(request_id=1, open=work_pb2.WorkOpen(queue="emails", worker_id="w-1", credits=2))
        yield work_pb2.WorkRequest(request_id=42, ack=work_pb2.WorkAck(receipts=["r0", "r1"]))

    responses = list(stub.Work(requests(), timeout=10))
    assert [r.WhichOneof("event") for r in responses] == ["opened", "job", "job", "acked"]
    opened, job, _, acked = responses
    assert opened.request_id == 1
    assert opened.opened.heartbeat_interval.ToSeconds() == 10
    assert list(opened.opened.routing.serving_shards) == [0]
    assert job.request_id == 0 and job.job.receipt == "r0"
    assert acked.request_id == 42
    assert [(r.receipt, r.outcome) for r in acked.acked.results] == [
        ("r0", message_pb2.ACK_OUTCOME_ACKED),
        ("r1", message_pb2.ACK_OUTCOME_ACKED),
    ]
