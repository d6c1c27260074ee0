"""Worker: runs a handler over the bidirectional Work stream (synchronous)."""

from __future__ import annotations

import itertools
import queue as queue_mod
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from casq._backoff import backoff_delay
from casq._messages import to_duration
from casq._tracing import processing_span
from casq.client import Client
from casq.errors import (
    CasqError,
    DeadLetter,
    RedirectError,
    error_from_rpc,
    error_from_status,
)
from casq.job import Job
from casq.v1 import queue_service_pb2, work_pb2

Handler = Callable[[Job], None]
ErrorCallback = Callable[[Exception, "Job | None"], None]

# Failures retrying cannot fix: run() raises them.
FATAL_CODES = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)


@dataclass
class _Session:
    """One Work stream: its outbox (None half-closes) and unanswered requests."""

    outbox: queue_mod.Queue[work_pb2.WorkRequest | None] = field(default_factory=queue_mod.Queue)
    pending: dict[int, Callable[[], object]] = field(default_factory=dict)
    heartbeat_interval: float = 20.0
    address: str = ""
    open: bool = True
    draining: bool = False


class Worker:
    """Consumes a queue with a handler: ack on return, nack on exception."""

    def __init__(self, client: Client, worker_id: str | None = None) -> None:
        self.client = client
        self.worker_id = worker_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._session: _Session | None = None
        self._held: dict[str, Job] = {}
        self._running = 0
        self._ids = itertools.count(1)
        self._queue = ""
        self._subscription = ""
        self._on_error: ErrorCallback | None = None

    # -- public API -------------------------------------------------------------

    def run(
        self,
        queue: str,
        handler: Handler,
        *,
        subscription: str = "default",
        concurrency: int = 1,
        prefetch: int | None = None,
        lease_ttl: float | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        """Run until :meth:`stop`; raises only for failures retrying cannot fix."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._queue, self._subscription = queue, subscription
        self._handler, self._on_error = handler, on_error
        credits = prefetch if prefetch is not None else concurrency
        self._stopping.clear()
        self._done.clear()
        executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="casq-worker")
        self._executor = executor
        failures = 0
        try:
            while not self._stopping.is_set():
                session = _Session()
                try:
                    self._run_stream(session, queue, subscription, credits, lease_ttl)
                    failures = 0
                except grpc.RpcError as rpc_error:
                    error = error_from_rpc(rpc_error)
                    if error.code in FATAL_CODES:
                        raise error from None
                    if isinstance(error, RedirectError) and error.leader_address:
                        self.client.follow_redirect(error.leader_address)
                        continue
                    self._report(error, None)
                    if not session.draining:
                        self._stopping.wait(backoff_delay(failures, self.client.backoff_initial, self.client.backoff_max))
                        failures += 1
                    self.client.fail_over(session.address)
                finally:
                    self._close_session(session)
        finally:
            executor.shutdown(wait=False, cancel_futures=False)
            self._done.set()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop taking jobs, wait up to ``timeout`` for running handlers, then end the stream.

        Handlers still running afterwards are not acked: their leases expire and
        casq redelivers them. Returns once ``run()`` has returned (or ``timeout`` passed).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._stopping.set()
        with self._lock:
            while self._running > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._lock.wait(remaining)
            session = self._session
            if session is not None and session.open:
                session.outbox.put(None)  # half-close: the broker answers what is outstanding, then OK
        remaining = None if deadline is None else max(0.5, deadline - time.monotonic())
        self._done.wait(remaining)

    # -- the stream -------------------------------------------------------------

    def _run_stream(
        self, session: _Session, queue: str, subscription: str, prefetch: int, lease_ttl: float | None
    ) -> None:
        address = session.address = self.client.current_broker
        with self._lock:
            credits = max(0, prefetch - len(self._held))
        open_request = work_pb2.WorkOpen(
            queue=queue, subscription=subscription, worker_id=self.worker_id, credits=min(credits, 1000)
        )
        if lease_ttl is not None:
            open_request.lease_ttl.CopyFrom(to_duration(lease_ttl))
        session.outbox.put(work_pb2.WorkRequest(open=open_request))

        def requests() -> Iterator[work_pb2.WorkRequest]:
            while True:
                item = session.outbox.get()
                if item is None:
                    return
                yield item

        call = self.client.queue_stub(address).Work(requests(), metadata=self.client.metadata())
        heartbeats: threading.Thread | None = None
        try:
            for response in call:
                event = response.WhichOneof("event")
                if event == "opened":
                    session.heartbeat_interval = max(0.05, response.opened.heartbeat_interval.ToTimedelta().total_seconds())
                    with self._lock:
                        self._session = session
                        if self._stopping.is_set():
                            session.outbox.put(None)
                    heartbeats = threading.Thread(target=self._heartbeat_loop, args=(session,), daemon=True)
                    heartbeats.start()
                elif event == "job":
                    self._start_job(Job(response.job))
                elif event == "leases_lost":
                    with self._lock:
                        for receipt in response.leases_lost.receipts:
                            job = self._held.pop(receipt, None)
                            if job is not None:
                                job.lost.set()
                elif event in ("heartbeated", "acked", "nacked"):
                    with self._lock:
                        session.pending.pop(response.request_id, None)
                    if event == "heartbeated":
                        self._lost_from_heartbeat(response.heartbeated)
                elif event == "request_failed":
                    with self._lock:
                        fallback = session.pending.pop(response.request_id, None)
                    error = error_from_status(response.request_failed.status)
                    if isinstance(error, RedirectError) and fallback is not None:
                        self._unary(fallback)
                    else:
                        self._report(error, None)
                elif event == "draining":
                    session.draining = True
        finally:
            with self._lock:
                session.open = False
                if self._session is session:
                    self._session = None
            call.cancel()

    def _close_session(self, session: _Session) -> None:
        """Resend what the ended stream left unanswered, as unary calls (idempotent)."""
        with self._lock:
            session.open = False
            leftovers = list(session.pending.values())
            session.pending.clear()
        session.outbox.put(None)
        for fallback in leftovers:
            self._unary(fallback)

    def _send(self, build: Callable[[int], work_pb2.WorkRequest], fallback: Callable[[], object] | None) -> None:
        """Send on the open stream (remembering the unary fallback), else call unary at once."""
        with self._lock:
            session = self._session
            if session is not None and session.open:
                request_id = next(self._ids)
                if fallback is not None:
                    session.pending[request_id] = fallback
                session.outbox.put(build(request_id))
                return
        if fallback is not None:
            self._unary(fallback)

    def _unary(self, fallback: Callable[[], object]) -> None:
        try:
            fallback()
        except CasqError as error:
            self._report(error, None)

    def _heartbeat_loop(self, session: _Session) -> None:
        while not self._done.is_set():
            time.sleep(session.heartbeat_interval)
            with self._lock:
                if not session.open:
                    return
                receipts = list(self._held)
            if receipts:
                self._send(
                    lambda rid: work_pb2.WorkRequest(request_id=rid, heartbeat=work_pb2.WorkHeartbeat(receipts=receipts)),
                    None,
                )

    def _lost_from_heartbeat(self, heartbeated: work_pb2.WorkHeartbeated) -> None:
        from casq.v1 import message_pb2

        with self._lock:
            for result in heartbeated.results:
                if result.outcome == message_pb2.HEARTBEAT_OUTCOME_LOST:
                    job = self._held.pop(result.receipt, None)
                    if job is not None:
                        job.lost.set()

    # -- jobs -------------------------------------------------------------------

    def _start_job(self, job: Job) -> None:
        with self._lock:
            self._held[job.receipt] = job
        self._executor.submit(self._run_job, job)

    def _run_job(self, job: Job) -> None:
        if self._stopping.is_set():
            # Never started: hand it back at once.
            self._settle(job, ok=False, dead_letter=False, reason="worker stopping", delay=0.0)
            return
        with self._lock:
            self._running += 1
        try:
            try:
                # The handler runs as the current span; a failure escaping it marks the span failed.
                with processing_span(job, self._queue):
                    self._handler(job)
            except DeadLetter as dead:
                self._settle(job, ok=False, dead_letter=True, reason=dead.reason or "dead-lettered by handler")
            except Exception as error:  # noqa: BLE001 - any handler failure means nack
                self._report(error, job)
                self._settle(job, ok=False, dead_letter=False, reason=f"{type(error).__name__}: {error}")
            else:
                self._settle(job, ok=True)
        finally:
            with self._lock:
                self._running -= 1
                self._lock.notify_all()
            if not self._stopping.is_set():
                self._send(lambda rid: work_pb2.WorkRequest(request_id=rid, credit=work_pb2.WorkCredit(credits=1)), None)

    def _settle(
        self, job: Job, *, ok: bool, dead_letter: bool = False, reason: str = "", delay: float | None = None
    ) -> None:
        with self._lock:
            still_held = self._held.pop(job.receipt, None) is not None
        if not still_held or job.lost.is_set():
            return  # the lease is gone: settling would answer LEASE_LOST
        receipts = [job.receipt]
        queue, subscription, client = self._queue, self._subscription, self.client
        if ok:
            ack = queue_service_pb2.AckRequest(queue=queue, subscription=subscription, receipts=receipts)
            self._send(
                lambda rid: work_pb2.WorkRequest(request_id=rid, ack=work_pb2.WorkAck(receipts=receipts)),
                lambda: client.call(lambda a: client.queue_stub(a).Ack(ack, timeout=client.timeout, metadata=client.metadata())),
            )
            return
        nack = work_pb2.WorkNack(receipts=receipts, dead_letter=dead_letter, reason=reason)
        unary = queue_service_pb2.NackRequest(
            queue=queue, subscription=subscription, receipts=receipts, dead_letter=dead_letter, reason=reason
        )
        if delay is not None:
            nack.delay.CopyFrom(to_duration(delay))
            unary.delay.CopyFrom(to_duration(delay))
        self._send(
            lambda rid: work_pb2.WorkRequest(request_id=rid, nack=nack),
            lambda: client.call(lambda a: client.queue_stub(a).Nack(unary, timeout=client.timeout, metadata=client.metadata())),
        )

    def _report(self, error: Exception, job: Job | None) -> None:
        if self._on_error is not None:
            try:
                self._on_error(error, job)
            except Exception:  # noqa: BLE001 - a failing callback must not kill the worker
                pass
