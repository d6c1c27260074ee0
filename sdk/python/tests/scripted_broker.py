"""A scripted broker for the worker tests: a QueueService over loopback gRPC whose answers a test sets.

Its Work stream delivers the jobs it is given when the worker opens it and
answers acks, nacks and heartbeats; a test makes it leave receipts out of the
answers (as a faulty broker could), fail the stream's settles (so that they go
as unary calls), or hold an ack's answer back until an event is set.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
from google.protobuf.duration_pb2 import Duration

from casq.v1 import errors_pb2, message_pb2, queue_service_pb2, queue_service_pb2_grpc, shard_pb2, work_pb2

QUEUE = "scripted"


def claimed(receipt: str) -> message_pb2.ClaimedMessage:
    """A job of the scripted queue whose receipt, id and payload are all ``receipt``."""
    return message_pb2.ClaimedMessage(
        message=message_pb2.Message(id=receipt, queue=QUEUE, shard=0, payload=receipt.encode(), max_attempts=5),
        subscription="default",
        receipt=receipt,
        attempt=1,
        max_attempts=5,
    )


class ScriptedBroker(queue_service_pb2_grpc.QueueServiceServicer):
    """One broker leading the only shard of :data:`QUEUE`; records every settle it gets."""

    def __init__(
        self,
        jobs: Iterable[str],
        *,
        missing: Iterable[str] = (),
        fail_on_stream: bool = False,
        hold_acks: threading.Event | None = None,
        hold_timeout: float = 3.0,
    ) -> None:
        """``jobs``: the receipts delivered on each open; ``missing``: receipts every settle answer leaves out;
        ``fail_on_stream``: acks and nacks on the stream fail with UNAVAILABLE; ``hold_acks``: an ack on the
        stream is answered once it is set (or after ``hold_timeout``)."""
        self.jobs = list(jobs)
        self.missing = set(missing)
        self.fail_on_stream = fail_on_stream
        self.hold_acks = hold_acks
        self.hold_timeout = hold_timeout
        self.lock = threading.Lock()
        # (how, receipt): how is "stream ack", "stream nack", "unary ack" or "unary nack" (+ " release").
        self.settles: list[tuple[str, str]] = []
        # Per held ack answer: whether hold_acks was set before hold_timeout ran out.
        self.held_in_time: list[bool] = []

    def settled(self) -> set[str]:
        with self.lock:
            return {receipt for _, receipt in self.settles}

    def _record(self, how: str, receipts: Iterable[str]) -> None:
        with self.lock:
            self.settles += [(how, receipt) for receipt in receipts]

    def _acked(self, receipts: Iterable[str]) -> list[message_pb2.AckResult]:
        return [
            message_pb2.AckResult(receipt=r, outcome=message_pb2.ACK_OUTCOME_ACKED)
            for r in receipts
            if r not in self.missing
        ]

    def _nacked(self, receipts: Iterable[str]) -> list[message_pb2.NackResult]:
        return [
            message_pb2.NackResult(receipt=r, outcome=message_pb2.NACK_OUTCOME_RETRY_SCHEDULED)
            for r in receipts
            if r not in self.missing
        ]

    def Work(
        self, request_iterator: Iterator[work_pb2.WorkRequest], context: grpc.ServicerContext
    ) -> Iterator[work_pb2.WorkResponse]:
        first = next(request_iterator)
        yield work_pb2.WorkResponse(
            request_id=first.request_id,
            opened=work_pb2.WorkOpened(
                session_id="scripted",
                queue=first.open.queue,
                subscription="default",
                lease_ttl=Duration(seconds=60),
                heartbeat_interval=Duration(seconds=20),
                max_credits=1000,
                routing=work_pb2.WorkRouting(serving_shards=[0], shards=[shard_pb2.ShardRoute(shard=0)]),
            ),
        )
        for receipt in self.jobs:
            yield work_pb2.WorkResponse(job=claimed(receipt))
        for request in request_iterator:
            command = request.WhichOneof("command")
            if command in ("ack", "nack") and self.fail_on_stream:
                receipts = request.ack.receipts if command == "ack" else request.nack.receipts
                self._record(f"stream {command} failed", receipts)
                status = errors_pb2.RpcStatus(code=grpc.StatusCode.UNAVAILABLE.value[0], message="scripted outage")
                yield work_pb2.WorkResponse(
                    request_id=request.request_id, request_failed=work_pb2.WorkRequestFailed(status=status)
                )
            elif command == "ack":
                self._record("stream ack", request.ack.receipts)
                if self.hold_acks is not None:
                    self.held_in_time.append(self.hold_acks.wait(self.hold_timeout))
                yield work_pb2.WorkResponse(
                    request_id=request.request_id,
                    acked=work_pb2.WorkAcked(results=self._acked(request.ack.receipts)),
                )
            elif command == "nack":
                self._record("stream nack" + (" release" if request.nack.release else ""), request.nack.receipts)
                yield work_pb2.WorkResponse(
                    request_id=request.request_id,
                    nacked=work_pb2.WorkNacked(results=self._nacked(request.nack.receipts)),
                )
            elif command == "heartbeat":
                yield work_pb2.WorkResponse(
                    request_id=request.request_id,
                    heartbeated=work_pb2.WorkHeartbeated(
                        results=[
                            message_pb2.HeartbeatResult(receipt=r, outcome=message_pb2.HEARTBEAT_OUTCOME_EXTENDED)
                            for r in request.heartbeat.receipts
                        ]
                    ),
                )

    def Enqueue(
        self, request: queue_service_pb2.EnqueueRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.EnqueueResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the scripted broker only delivers its jobs")

    def EnqueueStream(
        self,
        request_iterator: Iterator[queue_service_pb2.EnqueueStreamRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[queue_service_pb2.EnqueueStreamResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the scripted broker only delivers its jobs")

    def Claim(
        self, request: queue_service_pb2.ClaimRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.ClaimResponse:
        return queue_service_pb2.ClaimResponse()

    def LookupShards(
        self, request: queue_service_pb2.LookupShardsRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.LookupShardsResponse:
        return queue_service_pb2.LookupShardsResponse(shards=[shard_pb2.ShardRoute(shard=0)])

    def Ack(
        self, request: queue_service_pb2.AckRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.AckResponse:
        self._record("unary ack", request.receipts)
        return queue_service_pb2.AckResponse(results=self._acked(request.receipts))

    def Nack(
        self, request: queue_service_pb2.NackRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.NackResponse:
        self._record("unary nack" + (" release" if request.release else ""), request.receipts)
        return queue_service_pb2.NackResponse(results=self._nacked(request.receipts))

    def Heartbeat(
        self, request: queue_service_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> queue_service_pb2.HeartbeatResponse:
        return queue_service_pb2.HeartbeatResponse(
            results=[
                message_pb2.HeartbeatResult(receipt=r, outcome=message_pb2.HEARTBEAT_OUTCOME_EXTENDED)
                for r in request.receipts
            ]
        )


@contextmanager
def serve(broker: ScriptedBroker) -> Iterator[str]:
    """Serves ``broker`` on a loopback port; yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    queue_service_pb2_grpc.add_QueueServiceServicer_to_server(broker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
