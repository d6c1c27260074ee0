"""Worker: runs a handler over the bidirectional Work stream (synchronous)."""

from __future__ import annotations

import itertools
import queue as queue_mod
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from casq._backoff import backoff_delay
from casq._log import log_handler_failure, log_worker_error
from casq._messages import to_duration
from casq._settle import ack_failures, nack_failures
from casq._tracing import processing_span
from casq.client import Client
from casq.errors import (
    CasqError,
    DeadLetter,
    LeaseLostError,
    RedirectError,
    StreamTimeoutError,
    error_from_rpc,
    error_from_status,
)
from casq.job import Job
from casq.v1 import message_pb2, queue_service_pb2, work_pb2

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


# The lane of the primary session; a secondary session's lane is its broker address.
_PRIMARY = ""
# Opened.max_credits: more outstanding credit ends the stream.
_MAX_CREDITS = 1000
# Receipts per heartbeat request (stays within limits.max_batch).
_HEARTBEAT_CHUNK = 500
# How long run() waits for secondary streams to end after their half-close.
_CLOSE_GRACE = 5.0


@dataclass(eq=False)
class _Pending:
    """A request sent on a stream and not answered yet."""

    on_reply: Callable[[work_pb2.WorkResponse], object]
    # Resends it as a unary call when the stream ends first (None: not resent;
    # heartbeats are not, the next round covers them).
    unary: Callable[[], object] | None
    sent_at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Session:
    """One Work stream: its lane, outbox (None half-closes) and unanswered requests.

    ``open`` is true from creation until the stream ends or is half-closed:
    requests sent meanwhile go on the stream (an opening stream sends them after
    its open), later ones as unary calls.
    """

    lane: str
    address: str
    outbox: queue_mod.Queue[work_pb2.WorkRequest | None] = field(default_factory=queue_mod.Queue)
    pending: dict[int, _Pending] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    opened: bool = False
    # Set by the watchdog when the broker left the open or a request unanswered
    # for the client's timeout (a hung broker): the stream is then cancelled.
    hung: StreamTimeoutError | None = None
    open: bool = True
    draining: bool = False
    routing: work_pb2.WorkRouting | None = None
    cancel: Callable[[], object] | None = None  # ends the call at once

    def half_close(self) -> None:
        """No more requests: the broker answers what is outstanding, then ends with OK (caller holds the lock)."""
        if self.open:
            self.open = False
            self.outbox.put(None)


@dataclass(eq=False)
class _Held:
    """A job the run holds a lease for, from delivery until its handler is over."""

    job: Job
    lane: str
    # The stream whose credit the job uses: the one that delivered it, or the
    # lane's next stream if that one opened while the job was still held.
    session: _Session | None
    settled: bool = False


class Worker:
    """Consumes a queue with a handler: ack on return, nack on exception.

    A run keeps one Work stream per broker that leads shards of the queue: the
    primary stream (to the client's current broker; reconnects with backoff and
    follows redirects) and a secondary stream to every other leader the
    brokers' routing names. ``prefetch`` applies per stream; ``concurrency``
    (the handler threads) is shared by all of them.
    """

    def __init__(self, client: Client, worker_id: str | None = None) -> None:
        self.client = client
        self.worker_id = worker_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._sessions: dict[str, _Session] = {}  # lane -> open or opening stream
        self._secondaries: set[threading.Thread] = set()
        self._recheck_failures: dict[str, int] = {}  # address -> secondary streams that failed in a row
        self._held: dict[str, _Held] = {}
        self._running = 0
        self._ids = itertools.count(1)
        self._queue = ""
        self._subscription = ""
        self._prefetch = 1
        self._lease_ttl: float | None = None
        self._on_error: ErrorCallback | None = None
        self._heartbeat_interval = 20.0
        self._heartbeats: threading.Thread | None = None
        self._run_over = threading.Event()

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
        """Run until :meth:`stop`; raises only for failures retrying cannot fix.

        Up to ``concurrency`` handlers run at once, across all streams.
        ``prefetch`` (default ``concurrency``, at most 1000) is how many jobs
        each stream may hand over before they are finished: a worker whose
        queue's shards are led by *n* brokers holds up to ``n * prefetch`` jobs.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._queue, self._subscription = queue, subscription
        self._handler, self._on_error = handler, on_error
        self._prefetch = min(_MAX_CREDITS, prefetch if prefetch is not None else concurrency)
        self._lease_ttl = lease_ttl
        self._stopping.clear()
        self._done.clear()
        self._run_over = threading.Event()
        self._heartbeats = None
        self._recheck_failures.clear()
        executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="casq-worker")
        self._executor = executor
        threading.Thread(target=self._watchdog, args=(self._run_over,), name="casq-watchdog", daemon=True).start()
        failures = 0
        try:
            while not self._stopping.is_set():
                session = self._new_session(_PRIMARY, self.client.current_broker)
                if session is None:
                    break
                try:
                    self._run_stream(session)
                    failures = 0
                except grpc.RpcError as rpc_error:
                    error = session.hung or error_from_rpc(rpc_error)
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
            # Also after a fatal error: no stream may be opened again and no queued job started.
            self._stopping.set()
            self._end_secondaries()
            self._run_over.set()
            executor.shutdown(wait=False, cancel_futures=False)
            self._done.set()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop taking jobs, wait up to ``timeout`` for running handlers, then end every stream.

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
            for session in self._sessions.values():
                session.half_close()  # the broker answers what is outstanding, then OK
        remaining = None if deadline is None else max(0.5, deadline - time.monotonic())
        self._done.wait(remaining)

    # -- the streams ------------------------------------------------------------

    def _new_session(self, lane: str, address: str) -> _Session | None:
        """Registers the lane's new stream and queues its open; None once stopping."""
        with self._lock:
            if self._stopping.is_set():
                return None
            session = _Session(lane, address)
            # Jobs still held from the lane's earlier stream keep their leases and
            # count against prefetch; their credit comes back to this stream.
            mine = [held for held in self._held.values() if held.lane == lane]
            for held in mine:
                held.session = session
            open_request = work_pb2.WorkOpen(
                queue=self._queue,
                subscription=self._subscription,
                worker_id=self.worker_id,
                credits=max(0, self._prefetch - len(mine)),
            )
            if self._lease_ttl is not None:
                open_request.lease_ttl.CopyFrom(to_duration(self._lease_ttl))
            session.outbox.put(work_pb2.WorkRequest(open=open_request))
            self._sessions[lane] = session
            return session

    def _run_stream(self, session: _Session) -> None:
        """Reads one stream until it ends; raises its grpc.RpcError if it failed."""

        def requests() -> Iterator[work_pb2.WorkRequest]:
            while True:
                item = session.outbox.get()
                if item is None:
                    return
                yield item

        call = self.client.queue_stub(session.address).Work(requests(), metadata=self.client.metadata())
        session.cancel = call.cancel
        try:
            for response in call:
                self._on_response(session, response)
        finally:
            with self._lock:
                session.open = False
            call.cancel()

    def _on_response(self, session: _Session, response: work_pb2.WorkResponse) -> None:
        event = response.WhichOneof("event")
        if event == "opened":
            interval = response.opened.heartbeat_interval.ToTimedelta().total_seconds()
            with self._lock:
                session.opened = True
                self._heartbeat_interval = max(0.05, interval) if interval > 0 else 20.0
                self._recheck_failures.pop(session.address, None)
                if self._heartbeats is None:
                    self._heartbeats = threading.Thread(
                        target=self._heartbeat_loop, args=(self._run_over,), name="casq-heartbeats", daemon=True
                    )
                    self._heartbeats.start()
            self._route(session, response.opened.routing)
        elif event == "job":
            job = Job(response.job)
            with self._lock:
                self._held[job.receipt] = _Held(job, session.lane, session)
            try:
                self._executor.submit(self._run_job, job)
            except RuntimeError:
                # The run is over (a broker sent a job after the half-close): its lease expires.
                with self._lock:
                    self._held.pop(job.receipt, None)
        elif event == "leases_lost":
            self._mark_lost(response.leases_lost.receipts)
        elif event in ("heartbeated", "acked", "nacked"):
            with self._lock:
                pending = session.pending.pop(response.request_id, None)
            if pending is not None:
                pending.on_reply(response)
        elif event == "request_failed":
            with self._lock:
                pending = session.pending.pop(response.request_id, None)
            error = error_from_status(response.request_failed.status)
            if isinstance(error, RedirectError) and pending is not None and pending.unary is not None:
                self._unary(pending.unary)
            else:
                self._report(error, None)
        elif event == "routing":
            self._route(session, response.routing)
        elif event == "draining":
            session.draining = True

    def _route(self, session: _Session, routing: work_pb2.WorkRouting) -> None:
        """Opens a secondary stream to every leader of a shard ``session`` does not serve and no stream reaches."""
        with self._lock:
            session.routing = routing
            if self._stopping.is_set() or not session.open:
                return
            served = set(routing.serving_shards)
            reached = {s.address for s in self._sessions.values()}
            for route in routing.shards:
                # A shard nobody leads is taken over by a broker we already reach,
                # which then announces it in a routing event of its own.
                if route.shard in served or not route.HasField("leader"):
                    continue
                address = route.leader.address
                if not address or address in reached:
                    continue
                reached.add(address)
                secondary = self._new_session(address, address)
                if secondary is None:
                    return
                thread = threading.Thread(
                    target=self._run_secondary, args=(secondary,), name=f"casq-work-{address}", daemon=True
                )
                self._secondaries.add(thread)
                thread.start()

    def _run_secondary(self, session: _Session) -> None:
        """A secondary stream has no reconnect loop: when it ends it is dropped, and its jobs settle by unary call."""
        error: CasqError | None = None
        try:
            self._run_stream(session)
        except grpc.RpcError as rpc_error:
            error = session.hung or error_from_rpc(rpc_error)
        finally:
            self._close_session(session)
            with self._lock:
                self._secondaries.discard(threading.current_thread())
        if self._stopping.is_set():
            return
        if error is not None and not isinstance(error, RedirectError):
            self._report(error, None)
        # Routing events come only when a broker's served shards change, so a
        # stream lost to a passing outage would not be reopened by one: after a
        # backoff, apply the routing the open streams last reported once more
        # (it reopens this stream only if that routing still names the broker).
        with self._lock:
            failures = self._recheck_failures.get(session.address, 0)
            self._recheck_failures[session.address] = failures + 1
        if self._stopping.wait(backoff_delay(failures, self.client.backoff_initial, self.client.backoff_max)):
            return
        with self._lock:
            known = [(s, s.routing) for s in self._sessions.values() if s.routing is not None]
        for other, routing in known:
            if routing is not None:
                self._route(other, routing)

    def _end_secondaries(self) -> None:
        """After the primary loop: half-close the secondary streams and wait (bounded) for them to end."""
        with self._lock:
            for session in self._sessions.values():
                session.half_close()
            threads = list(self._secondaries)
        deadline = time.monotonic() + _CLOSE_GRACE
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            # A broker that does not end a half-closed stream in time: cancel it.
            late = [s.cancel for s in self._sessions.values() if s.lane != _PRIMARY and s.cancel is not None]
        for cancel in late:
            cancel()

    def _close_session(self, session: _Session) -> None:
        """Resend what the ended stream left unanswered, as unary calls (idempotent)."""
        with self._lock:
            session.open = False
            if self._sessions.get(session.lane) is session:
                del self._sessions[session.lane]
            leftovers = [p.unary for p in session.pending.values() if p.unary is not None]
            session.pending.clear()
        session.outbox.put(None)
        for fallback in leftovers:
            self._unary(fallback)

    def _send(
        self,
        session: _Session | None,
        build: Callable[[int], work_pb2.WorkRequest],
        on_reply: Callable[[work_pb2.WorkResponse], object],
        unary: Callable[[], object],
        *,
        heartbeat: bool = False,
    ) -> None:
        """Send on ``session`` while it is open (``on_reply`` gets the answer), else call ``unary`` at once.

        Should the stream end first, ``unary`` is called then (heartbeats excepted).
        """
        with self._lock:
            if session is not None and session.open:
                request_id = next(self._ids)
                session.pending[request_id] = _Pending(on_reply, None if heartbeat else unary)
                session.outbox.put(build(request_id))
                return
        self._unary(unary)

    def _watchdog(self, run_over: threading.Event) -> None:
        """Ends every stream whose broker left its open or a request unanswered for the client's timeout.

        A hung broker (e.g. a stopped process) keeps the connection up and never
        answers, so nothing else would end the stream: its jobs could not be
        settled or heartbeated, and no other broker would be tried. Cancelling
        it resends what was unanswered as unary calls (which move on from the
        hung broker) and reconnects (the primary stream) at the next broker.
        """
        timeout = self.client.timeout
        while not run_over.wait(max(0.05, min(1.0, timeout / 4))):
            now = time.monotonic()
            cancels: list[Callable[[], object]] = []
            with self._lock:
                for session in self._sessions.values():
                    if session.hung is not None or session.cancel is None:
                        continue
                    waited = [] if session.opened else [now - session.started_at]
                    waited += [now - p.sent_at for p in session.pending.values()]
                    if waited and max(waited) > timeout:
                        what = "a request" if session.opened else "the stream's open"
                        session.hung = StreamTimeoutError(
                            grpc.StatusCode.UNAVAILABLE,
                            f"casq: broker {session.address} left {what} unanswered for {timeout:g}s "
                            "(hung?): work stream ended, going elsewhere",
                        )
                        cancels.append(session.cancel)
            for cancel in cancels:
                cancel()

    def _unary(self, fallback: Callable[[], object]) -> None:
        try:
            fallback()
        except CasqError as error:
            self._report(error, None)

    # -- leases -----------------------------------------------------------------

    def _heartbeat_loop(self, run_over: threading.Event) -> None:
        """Heartbeats every held job on the stream that delivered it (unary once that one is gone)."""
        while not run_over.wait(self._heartbeat_interval):
            groups: dict[_Session | None, list[str]] = {}
            with self._lock:
                for receipt, held in self._held.items():
                    if not held.settled and not held.job.lost.is_set():
                        groups.setdefault(held.session, []).append(receipt)
            for session, receipts in groups.items():
                for start in range(0, len(receipts), _HEARTBEAT_CHUNK):
                    self._heartbeat(session, receipts[start : start + _HEARTBEAT_CHUNK])

    def _heartbeat(self, session: _Session | None, receipts: list[str]) -> None:
        client = self.client
        request = queue_service_pb2.HeartbeatRequest(
            queue=self._queue, subscription=self._subscription, worker_id=self.worker_id, receipts=receipts
        )

        def unary() -> None:
            response = client.call(
                lambda a: client.queue_stub(a).Heartbeat(request, timeout=client.timeout, metadata=client.metadata())
            )
            self._lost_from_results(response.results)

        self._send(
            session,
            lambda rid: work_pb2.WorkRequest(request_id=rid, heartbeat=work_pb2.WorkHeartbeat(receipts=receipts)),
            lambda reply: self._lost_from_results(reply.heartbeated.results),
            unary,
            heartbeat=True,
        )

    def _lost_from_results(self, results: Iterable[message_pb2.HeartbeatResult]) -> None:
        self._mark_lost(result.receipt for result in results if result.outcome == message_pb2.HEARTBEAT_OUTCOME_LOST)

    def _mark_lost(self, receipts: Iterable[str]) -> None:
        """The broker no longer leases these to us: the handler sees ``job.lost``, the job is not settled."""
        with self._lock:
            for receipt in receipts:
                held = self._held.get(receipt)
                if held is not None:
                    held.job.lost.set()

    # -- jobs -------------------------------------------------------------------

    def _run_job(self, job: Job) -> None:
        if self._stopping.is_set():
            # Never started: hand it back at once.
            # A release: claimable again at once, and the delivery does not count as an attempt.
            self._settle(job, ok=False, reason="worker stopping", release=True)
            self._finish(job)
            return
        with self._lock:
            self._running += 1
        try:
            try:
                # The handler runs as the current span; a failure escaping it marks the span failed.
                with processing_span(job, self._queue):
                    self._handler(job)
            except DeadLetter as dead:
                log_handler_failure(job, dead)
                self._settle(job, ok=False, dead_letter=True, reason=dead.reason or "dead-lettered by handler")
            except Exception as error:  # noqa: BLE001 - any handler failure means nack
                self._report(error, job, handler_failed=True)
                self._settle(job, ok=False, dead_letter=False, reason=f"{type(error).__name__}: {error}")
            else:
                self._settle(job, ok=True)
        finally:
            with self._lock:
                self._running -= 1
                self._lock.notify_all()
            self._finish(job)

    def _finish(self, job: Job) -> None:
        """Forgets a job whose handler is over; gives its credit back to the stream it uses."""
        with self._lock:
            held = self._held.pop(job.receipt, None)
            session = held.session if held is not None else None
            if session is not None and session.open and not self._stopping.is_set():
                session.outbox.put(work_pb2.WorkRequest(credit=work_pb2.WorkCredit(credits=1)))

    def _settle(
        self,
        job: Job,
        *,
        ok: bool,
        dead_letter: bool = False,
        reason: str = "",
        delay: float | None = None,
        release: bool = False,
    ) -> None:
        with self._lock:
            held = self._held.get(job.receipt)
            if held is None or held.settled:
                return
            # A lost lease does not skip the settle: the broker still applies it
            # if nobody claimed the message since, which spares a redelivery;
            # otherwise it answers LEASE_LOST, which is reported.
            held.settled = True
            session = held.session
        receipts = [job.receipt]
        queue, subscription, client = self._queue, self._subscription, self.client

        def check(failures: list[LeaseLostError]) -> None:
            for failure in failures:
                self._report(failure, job)

        if ok:
            ack = queue_service_pb2.AckRequest(queue=queue, subscription=subscription, receipts=receipts)
            self._send(
                session,
                lambda rid: work_pb2.WorkRequest(request_id=rid, ack=work_pb2.WorkAck(receipts=receipts)),
                lambda reply: check(ack_failures(reply.acked.results)),
                lambda: check(
                    ack_failures(
                        client.call(
                            lambda a: client.queue_stub(a).Ack(ack, timeout=client.timeout, metadata=client.metadata())
                        ).results
                    )
                ),
            )
            return
        nack = work_pb2.WorkNack(receipts=receipts, dead_letter=dead_letter, reason=reason, release=release)
        unary = queue_service_pb2.NackRequest(
            queue=queue,
            subscription=subscription,
            receipts=receipts,
            dead_letter=dead_letter,
            reason=reason,
            release=release,
        )
        if delay is not None:
            nack.delay.CopyFrom(to_duration(delay))
            unary.delay.CopyFrom(to_duration(delay))
        self._send(
            session,
            lambda rid: work_pb2.WorkRequest(request_id=rid, nack=nack),
            lambda reply: check(nack_failures(reply.nacked.results)),
            lambda: check(
                nack_failures(
                    client.call(
                        lambda a: client.queue_stub(a).Nack(unary, timeout=client.timeout, metadata=client.metadata())
                    ).results
                )
            ),
        )

    def _report(self, error: Exception, job: Job | None, *, handler_failed: bool = False) -> None:
        """Logs a failure that does not end the run (see casq._log), then tells ``on_error``."""
        if handler_failed and job is not None:
            log_handler_failure(job, error)
        else:
            log_worker_error(error, job)
        if self._on_error is not None:
            try:
                self._on_error(error, job)
            except Exception:  # noqa: BLE001 - a failing callback must not kill the worker
                pass
