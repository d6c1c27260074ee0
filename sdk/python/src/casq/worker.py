"""Worker: runs a handler over the bidirectional Work stream (synchronous).

The thread driver of the Work protocol core (casq/_work_core.py): a thread
reads each stream, handlers run in a thread pool, and a heartbeat thread and
a watchdog thread serve the run; the core, called under one lock, decides
what each event means and what to send. Acks, nacks and hand-backs never
hold a handler thread: they go in the stream's outbox, and their answers
(and the unary calls that replace a stream that could not carry them) are
handled on settle threads of their own.
"""

from __future__ import annotations

import queue as queue_mod
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import grpc

from casq._log import log_handler_failure, report_failure
from casq._retry import is_outage
from casq._settle import ack_failures, nack_failures
from casq._tracing import processing_span
from casq._work_core import (
    FATAL_CODES,
    PRIMARY,
    AckBatch,
    Held,
    Heartbeat,
    Reaction,
    Settle,
    Stream,
    StreamClosed,
    Waiter,
    WorkCore,
    outgoing,
)
from casq.client import Client
from casq.errors import (
    CasqError,
    DeadLetter,
    RedirectError,
    UnavailableError,
    error_from_rpc,
)
from casq.job import Job
from casq.v1 import message_pb2, work_pb2

T = TypeVar("T")

Handler = Callable[[Job], None]
ErrorCallback = Callable[[Exception, "Job | None"], None]

__all__ = ["FATAL_CODES", "ErrorCallback", "Handler", "Worker"]

# How long run() waits for secondary streams to end after their half-close.
_CLOSE_GRACE = 5.0
# How long stop() waits, once the handlers are over, for their acks and nacks in flight to be answered.
_SETTLE_GRACE = 5.0
# The fewest settle threads (more with a higher concurrency): they handle settle answers and make the
# unary calls of settles no stream carries (the hand-backs at stop among them), so a few slow calls
# do not hold up the rest.
_SETTLE_THREADS = 8


def _outbox() -> queue_mod.Queue[work_pb2.WorkRequest | AckBatch | None]:
    return queue_mod.Queue()


def _requests(stream: Stream) -> Iterator[work_pb2.WorkRequest]:
    outbox = stream.outbox
    assert isinstance(outbox, queue_mod.Queue)
    while True:
        item = outbox.get()
        if item is None:
            return
        yield outgoing(item)


class _Run:
    """One ``Worker.run()``: the core's I/O, handler threads and shutdown."""

    def __init__(
        self, client: Client, core: WorkCore, handler: Handler, on_error: ErrorCallback | None, concurrency: int
    ) -> None:
        self.client = client
        self.core = core
        self.handler = handler
        self.on_error = on_error
        self.lock = threading.Condition()  # guards the core
        self.stopping = threading.Event()  # set by stop(): cuts backoffs short
        self.over = threading.Event()  # ends the heartbeat and watchdog threads
        self.shut = threading.Event()  # stop() has waited out the handlers
        self.done = threading.Event()  # run() has returned
        self.secondaries: set[threading.Thread] = set()
        self.executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="casq-worker")
        # Not the handlers' pool: a settle waiting for its answer or a unary call must not take a handler's
        # thread (fewer handlers would run than asked), nor wait behind running handlers (a hand-back at stop).
        self.settles = ThreadPoolExecutor(
            max_workers=max(_SETTLE_THREADS, concurrency), thread_name_prefix="casq-settle"
        )
        # The first KeyboardInterrupt or SystemExit a handler raised: the run stops and run() raises it.
        self.interrupted: BaseException | None = None

    # -- the streams ------------------------------------------------------------

    def loop(self) -> None:
        """Opens primary streams until stopped; raises a fatal CasqError."""
        threading.Thread(target=self._watchdog, name="casq-watchdog", daemon=True).start()
        while not self.stopping.is_set():
            with self.lock:
                stream = self.core.open_stream(PRIMARY, self.client.current_broker, _outbox())
            if stream is None:
                break
            error = self._read(stream)
            if self.stopping.is_set():
                break
            with self.lock:
                step = self.core.primary_ended(stream, error)  # raises a fatal error
                delay = self.core.pause_delay() if step.pause else 0.0
            if step.report is not None:
                self.report(step.report, None)
            step.move(self.client, stream)
            if delay > 0:
                self.stopping.wait(delay)

    def _read(self, stream: Stream) -> CasqError | None:
        """Reads one stream until it ends, then closes it in the core; returns how it failed (None: OK)."""
        call = self.client.queue_stub(stream.address).Work(_requests(stream), metadata=self.client.metadata())
        with self.lock:
            stream.cancel = call.cancel
        try:
            for response in call:
                with self.lock:
                    reaction = self.core.on_response(stream, response, _outbox)
                self._react(reaction)
        except grpc.RpcError as rpc_error:
            return stream.hung or error_from_rpc(rpc_error)
        finally:
            call.cancel()
            with self.lock:
                self.core.close_stream(stream)
        return None

    def _react(self, reaction: Reaction) -> None:
        for stream in reaction.streams:
            thread = threading.Thread(
                target=self._secondary, args=(stream,), name=f"casq-work-{stream.address}", daemon=True
            )
            with self.lock:
                self.secondaries.add(thread)
            thread.start()
        if reaction.start_heartbeats:
            threading.Thread(target=self._heartbeats, name="casq-heartbeats", daemon=True).start()
        for held in reaction.release:
            self._release(held)
        for held in reaction.start:
            self._submit(held)

    def _submit(self, held: Held) -> None:
        """Runs a started job's handler on the handler pool."""
        try:
            self.executor.submit(self._execute, held)
        except RuntimeError:
            # The run is over (a broker sent a job after the half-close): its lease expires.
            with self.lock:
                held.abandoned = True
                self.core.forget(held, credit=False)

    def _secondary(self, stream: Stream) -> None:
        """A secondary stream has no reconnect loop: when it ends it is dropped, and its jobs settle by unary call."""
        try:
            error = self._read(stream)
        finally:
            with self.lock:
                self.secondaries.discard(threading.current_thread())
        if self.stopping.is_set():
            return
        with self.lock:
            report, delay = self.core.secondary_ended(stream, error)
        if report is not None:
            self.report(report, None)
        if self.stopping.wait(delay):
            return
        with self.lock:
            streams = self.core.reroute(_outbox)
        self._react(Reaction(streams=streams))

    def _end_secondaries(self) -> None:
        """After the primary loop: half-close the secondary streams and wait (bounded) for them to end."""
        with self.lock:
            for stream in self.core.streams.values():
                stream.half_close()
            threads = list(self.secondaries)
        deadline = time.monotonic() + _CLOSE_GRACE
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            # A broker that does not end a half-closed stream in time: cancel it.
            late = [s.cancel for s in self.core.streams.values() if s.lane != PRIMARY and s.cancel is not None]
        for cancel in late:
            cancel()

    def _watchdog(self) -> None:
        """Cancels every stream the core finds hung (see WorkCore.hung_streams)."""
        while not self.over.wait(self.core.watchdog_interval):
            with self.lock:
                hung = self.core.hung_streams()
            for stream in hung:
                if stream.cancel is not None:
                    stream.cancel()

    # -- requests: on the stream, else unary -------------------------------------

    def _request(
        self,
        stream: Stream | None,
        build: Callable[[int], work_pb2.WorkRequest],
        unary: Callable[[str], T],
        from_reply: Callable[[work_pb2.WorkResponse], T],
    ) -> T:
        """Sends on ``stream`` and waits for the answer; when it is gone, redirected or ends first, calls ``unary``."""
        sent: Waiter | None = None
        if stream is not None:
            with self.lock:
                sent = self.core.send(stream, build, Future())
        return self._answer(sent, unary, from_reply)

    def _answer(
        self,
        sent: Waiter | None,
        unary: Callable[[str], T],
        from_reply: Callable[[work_pb2.WorkResponse], T],
    ) -> T:
        """Waits for the stream's answer to a request (``sent``: its waiter); when it was not sent on a
        stream (None), or was redirected or the stream ended first, calls ``unary``."""
        leader: str | None = None
        if sent is not None:
            assert isinstance(sent, Future)
            # Answered, or failed by the stream's end (the watchdog ends a hung one).
            try:
                return from_reply(sent.result())
            except RedirectError as redirect:
                leader = redirect.leader_address or None
            except (StreamClosed, UnavailableError):
                pass  # StreamTimeoutError included
        if leader:
            try:
                return unary(leader)
            except grpc.RpcError as rpc_error:
                error = error_from_rpc(rpc_error)
                if not is_outage(error) and not isinstance(error, RedirectError):
                    raise error from None
        return self.client.call(unary)

    # -- jobs -------------------------------------------------------------------

    def _execute(self, held: Held) -> None:
        job = held.job
        if self.stopping.is_set():
            # Started but never run (stop() came first): hand it back at once.
            with self.lock:
                self.core.handler_done(held)
                self.lock.notify_all()
            self._release(held)
            return
        ack = False
        dead_letter = False
        reason = ""
        interrupt: BaseException | None = None
        try:
            # The handler runs as the current span; a failure escaping it marks the span failed.
            with processing_span(job, self.core.queue):
                self.handler(job)
            ack = True
        except DeadLetter as dead:
            log_handler_failure(job, dead)
            dead_letter, reason = True, dead.reason or "dead-lettered by handler"
        except BaseException as error:  # noqa: BLE001 - any handler failure means nack, SystemExit and the like too
            # Not only Exceptions: the pool would swallow the others, leaving the job held (and heartbeated) for good.
            if not held.abandoned:
                self.report(error, job, handler_failed=True)
            reason = f"{type(error).__name__}: {error}"
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                # As if raised in run(): no job starts after it, and run() raises it once the job is nacked.
                interrupt = error
                self._interrupt(error)
        finally:
            with self.lock:
                start = self.core.handler_done(held)
                self.lock.notify_all()
            self._react(Reaction(start=start))
        # Abandoned (still running at stop()'s deadline): too late to settle, the core refuses.
        # This does not wait for the answer: the thread is the next handler's at once.
        self._settle(held, ack=ack, dead_letter=dead_letter, reason=reason)
        if interrupt is not None:
            # The rest of the stop (running handlers given up, as on a Ctrl-C in run()) on a thread of
            # its own: it waits for the settles in flight, which must not keep this pool thread.
            threading.Thread(target=self.shutdown, args=(0.0,), name="casq-interrupt", daemon=True).start()

    def _interrupt(self, error: BaseException) -> None:
        """A handler raised KeyboardInterrupt or SystemExit: stop taking jobs; run() raises the first one."""
        with self.lock:
            if self.interrupted is None:
                self.interrupted = error
        self._stop_taking()

    def _release(self, held: Held) -> None:
        """Gives a job that never ran back at once: claimable again, and the delivery counts no attempt."""
        self._settle(held, ack=False, reason="worker stopping", release=True)

    def _settle(
        self, held: Held, *, ack: bool, dead_letter: bool = False, reason: str = "", release: bool = False
    ) -> None:
        """Acks or nacks a held job exactly once: on the stream, else by unary call; returns at once.

        The request goes in the stream's outbox (the stream's writer sends it)
        and its answer is handled on a settle thread when it comes (see
        :meth:`_settled`); with no stream to carry it, the unary call is made
        there too. So the caller (a handler's pool thread, stop()) never waits
        for a round trip.
        """
        sent: Waiter | None = None
        with self.lock:
            settle = self.core.settle(held, ack=ack, dead_letter=dead_letter, reason=reason, release=release)
            if settle is None:
                return
            if held.stream is not None:
                sent = self.core.send(held.stream, settle.stream_request, Future())
        if sent is None:
            self._on_settle_thread(settle, None)
            return
        assert isinstance(sent, Future)
        # Runs on the thread that answers it (a stream's reader, under the lock): only hands it over.
        sent.add_done_callback(lambda answered: self._on_settle_thread(settle, answered))

    def _on_settle_thread(self, settle: Settle, sent: Future[work_pb2.WorkResponse] | None) -> None:
        """Hands a settle's answer (or its unary call) to a settle thread."""
        try:
            self.settles.submit(self._settled, settle, sent)
        except RuntimeError:
            # The run is over (an answer or failure came after close()): a thread of its own, not lost.
            threading.Thread(target=self._settled, args=(settle, sent), name="casq-settle", daemon=True).start()

    def _settled(self, settle: Settle, sent: Future[work_pb2.WorkResponse] | None) -> None:
        """On a settle thread: reports what a settle did not do, resending it unary when no stream carried it."""
        held = settle.held
        client = self.client

        def unary(address: str) -> list[CasqError]:
            stub = client.queue_stub(address)
            if settle.ack is not None:
                acked = stub.Ack(settle.ack, timeout=client.timeout, metadata=client.metadata())
                return ack_failures(settle.ack.receipts, acked.results)
            assert settle.nack is not None
            nacked = stub.Nack(settle.nack, timeout=client.timeout, metadata=client.metadata())
            return nack_failures(settle.nack.receipts, nacked.results)

        try:
            for failure in self._answer(sent, unary, settle.from_reply):
                self.report(failure, held.job)
        except CasqError as error:
            # Not settled: the lease expires and casq redelivers the job (at-least-once).
            self.report(error, held.job)
        finally:
            with self.lock:
                self.core.forget(held, credit=True)
                self.lock.notify_all()  # shutdown() waits for the settles in flight

    # -- heartbeats -------------------------------------------------------------

    def _heartbeats(self) -> None:
        """Heartbeats every held job on the stream it uses (unary once that one is gone)."""
        while not self.over.wait(self.core.heartbeat_interval):
            with self.lock:
                due = self.core.heartbeats()
            for stream, heartbeat in due:
                try:
                    results = self._heartbeat(stream, heartbeat)
                except CasqError as error:
                    self.report(error, None)
                    continue
                with self.lock:
                    self.core.heartbeated(results)

    def _heartbeat(self, stream: Stream | None, heartbeat: Heartbeat) -> list[message_pb2.HeartbeatResult]:
        client = self.client

        def unary(address: str) -> list[message_pb2.HeartbeatResult]:
            stub = client.queue_stub(address)
            return list(stub.Heartbeat(heartbeat.unary, timeout=client.timeout, metadata=client.metadata()).results)

        return self._request(stream, heartbeat.stream_request, unary, Heartbeat.from_reply)

    # -- shutdown ---------------------------------------------------------------

    def shutdown(self, timeout: float | None) -> None:
        """Stops taking jobs, waits up to ``timeout`` for running handlers, then gives up the rest."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._stop_taking()
        with self.lock:
            while self.core.running > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self.lock.wait(remaining)
            self.core.abandon()
            # Let the acks and nacks in flight land (bounded, as the asyncio driver does): run() returns
            # only then, so a process that closes its client right after loses none of them.
            grace = time.monotonic() + _SETTLE_GRACE
            while any(not held.abandoned for held in self.core.held.values()):
                remaining = grace - time.monotonic()
                if remaining <= 0:
                    break
                self.lock.wait(min(remaining, 0.1))
        self.shut.set()

    def _stop_taking(self) -> None:
        """Half-closes every stream (the primary loop then ends) and hands back the jobs not started."""
        with self.lock:
            waiting = self.core.stop()
        self.stopping.set()
        for held in waiting:  # received but not started: back at once, not after the running handlers
            self._release(held)

    def close(self) -> None:
        """After the loop: end the secondary streams and the run's threads."""
        self.stopping.set()
        self._end_secondaries()
        self.over.set()
        self.executor.shutdown(wait=False, cancel_futures=False)
        self.settles.shutdown(wait=False, cancel_futures=False)
        self.done.set()

    def report(self, error: BaseException, job: Job | None, *, handler_failed: bool = False) -> None:
        report_failure(error, job, self.on_error, handler_failed=handler_failed)


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
        self._run: _Run | None = None

    def run(
        self,
        queue: str,
        handler: Handler,
        *,
        subscription: str = "default",
        concurrency: int = 1,
        prefetch: int | None = None,
        max_prefetch: int | None = None,
        lease_ttl: float | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        """Run until :meth:`stop`; raises only for failures retrying cannot fix (and a handler's exit: below).

        Returning from the handler acks the job; raising anything nacks it
        (:class:`casq.DeadLetter` dead-letters it), a ``BaseException`` too.
        A handler's ``KeyboardInterrupt`` or ``SystemExit`` also stops the
        run as if raised in ``run()`` (jobs not started are handed back, other
        running handlers are given up), and ``run()`` raises it once the job
        is nacked. Up to ``concurrency`` handlers run at once, across all streams.
        Each stream holds up to its prefetch of jobs: running, waiting, and
        credit the broker has not used yet. By default the prefetch adapts, from
        ``concurrency`` up to ``max_prefetch`` (default 100 × ``concurrency``, at
        most 10 000; past 20 × ``concurrency`` only for a slow store): it grows
        while handlers wait for jobs the broker would have sent with more credit and shrinks back when jobs only wait.
        ``prefetch`` fixes it instead (``concurrency``..10 000). A worker whose
        queue's shards are led by *n* brokers holds up to ``n`` times that.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        core = WorkCore(
            self.client,
            queue=queue,
            subscription=subscription,
            worker_id=self.worker_id,
            concurrency=concurrency,
            prefetch=prefetch,
            max_prefetch=max_prefetch,
            lease_ttl=lease_ttl,
        )
        run = _Run(self.client, core, handler, on_error, concurrency)
        self._run = run
        try:
            try:
                run.loop()
            except BaseException:
                # Also after a fatal error: no stream may be opened again and no waiting job started.
                run.shutdown(0.0)
                raise
            # Stopped: stop() drives the shutdown (or a handler's KeyboardInterrupt or SystemExit did);
            # run() returns once the handlers are over (or given up).
            run.shut.wait()
        finally:
            run.close()
            if self._run is run:
                self._run = None
        if run.interrupted is not None:
            raise run.interrupted

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop taking jobs, wait up to ``timeout`` for running handlers, then end every stream.

        Handlers still running afterwards are not acked: their leases expire and
        casq redelivers them. Returns once ``run()`` has returned (or ``timeout`` passed).
        """
        run = self._run
        if run is None:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        run.shutdown(timeout)
        run.done.wait(None if deadline is None else max(0.5, deadline - time.monotonic()))
