"""Proves that the generated Python code of the casq.v1 API works.

The messages survive binary and JSON round trips, the descriptors describe the
service, and the gRPC stubs carry real calls over loopback TCP.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from casq.v1 import message_pb2, queue_service_pb2, queue_service_pb2_grpc


def sample_message() -> message_pb2.Message:
    return message_pb2.Message(
        id="01J0000000000000000000000",
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
        attempt=2,
        trace_context=message_pb2.TraceContext(
            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            tracestate="vendor=value",
        ),
    )


def test_message_binary_round_trip() -> None:
    original = sample_message()
    decoded = message_pb2.Message.FromString(original.SerializeToString())
    assert decoded == original
    assert decoded.headers["schema"] == "v3"
    assert decoded.trace_context.tracestate == "vendor=value"


def test_message_json_round_trip() -> None:
    original = sample_message()
    js = json_format.MessageToJson(original)
    assert '"dedupId": "order-9"' in js
    decoded = json_format.Parse(js, message_pb2.Message())
    assert decoded == original


def test_new_message_schedule_oneof() -> None:
    msg = message_pb2.NewMessage(payload=b"job", delay=Duration(seconds=90))
    assert msg.WhichOneof("schedule") == "delay"
    msg.run_at.FromSeconds(1_893_553_445)
    assert msg.WhichOneof("schedule") == "run_at"
    req = queue_service_pb2.EnqueueRequest(queue="q", messages=[msg])
    decoded = queue_service_pb2.EnqueueRequest.FromString(req.SerializeToString())
    assert decoded.messages[0].run_at.seconds == 1_893_553_445


def test_service_descriptor() -> None:
    service = queue_service_pb2.DESCRIPTOR.services_by_name["QueueService"]
    assert service.full_name == "casq.v1.QueueService"
    methods = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in service.methods}
    assert methods == {
        "Enqueue": ("casq.v1.EnqueueRequest", "casq.v1.EnqueueResponse"),
        "Claim": ("casq.v1.ClaimRequest", "casq.v1.ClaimResponse"),
        "Ack": ("casq.v1.AckRequest", "casq.v1.AckResponse"),
    }


class FakeQueue(queue_service_pb2_grpc.QueueServiceServicer):
    """Echoes enqueues, never has anything to claim, and knows no receipt."""

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

    def Ack(self, request: queue_service_pb2.AckRequest, context: grpc.ServicerContext) -> queue_service_pb2.AckResponse:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"unknown receipt {request.receipts[0]!r}")


@pytest.fixture
def stub() -> Iterator[queue_service_pb2_grpc.QueueServiceStub]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    queue_service_pb2_grpc.add_QueueServiceServicer_to_server(FakeQueue(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield queue_service_pb2_grpc.QueueServiceStub(channel)
    finally:
        channel.close()
        server.stop(grace=None)


def test_grpc_stubs_over_loopback(stub: queue_service_pb2_grpc.QueueServiceStub) -> None:
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

    with pytest.raises(grpc.RpcError) as failure:
        stub.Ack(queue_service_pb2.AckRequest(queue="emails", receipts=["r1"]), timeout=10)
    assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert failure.value.details() == "unknown receipt 'r1'"
