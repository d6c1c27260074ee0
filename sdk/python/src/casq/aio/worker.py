"""Worker for the asyncio API: runs an async handler over the bidirectional Work stream.

The asyncio driver of the Work protocol core (casq/_work_core.py): tasks for
the stream readers, handlers, settles, heartbeats and the watchdog; the core
decides what each event means and what to send.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
from grpc import aio

from casq._log import log_handler_failure, report_failure
from casq._retry import is_outage
from casq._settle import ack_failures, nack_failures
from casq._tracing import processing_span
from casq._work_core import (
    PRIMARY,
    AckBatch,
    Held,
    Heartbeat,
    Reaction,
    Stream,
    StreamClosed,
    WorkCore,
    outgoing,
)
from casq.aio.client import Client
from casq.errors import (
    CasqError,
    DeadLetter,
    RedirectError,
    StreamTimeoutError,
    UnavailableError,
    error_from_rpc,
)
from casq.job import Job
from casq.v1 import message_pb2, work_pb2

T = TypeVar("T")

Handler = Callable[[Job], Awaitable[None]]
"""``async def handler(job: casq.Job) -> None``: return to ack, raise to nack."""

ErrorCallback = Callable[[Exception, "Job | None"], None]
"""Called with failures that do not end ``run()``: handler errors, failed settles, broken streams."""

# After the handlers: how long stop() lets acks/nacks in flight land, and how
# long it waits for the broker's OK after the half-close before cancelling.
_SETTLE_GRACE = 5.0
_CLOSE_GRACE = 2.0

WorkCall = aio.StreamStreamCall[work_pb2.WorkRequest, work_pb2.WorkResponse]


def _outbox() -> asyncio.Queue[work_pb2.WorkRequest | AckBatch | None]:
    return asyncio.Queue()


async def _requests(stream: Stream) -> AsyncIterator[work_pb2.WorkRequest]:
    outbox = stream.outbox
    assert isinstance(outbox, asyncio.Queue)
    while True:
        item = await outbox.get()
        if item is None:
            return
        yield outgoing(item)


class _Run:
    """One ``Worker.run()``: the core's I/O, handler tasks and shutdown."""

    def __init__(self, client: Client, core: WorkCore, handler: Handler, on_error: ErrorCallback | None) -> None:
        self.client = client
        self.core = core
        self.handler = handler
        self.on_error = on_error
        self.readers: dict[Stream, asyncio.Task[None]] = {}
        self.handlers: dict[Held, asyncio.Task[None]] = {}
        self.secondaries: set[asyncio.Task[None]] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # handlers, settles and releases
        self.heartbeat_task: asyncio.Task[None] | None = None
        self.watchdog_task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()  # set by stop(): cuts a backoff short
        self.shutdown_task: asyncio.Task[None] | None = None
        self.done = asyncio.Event()  # set when run() has returned (or raised)

    # -- the streams ------------------------------------------------------------

    async def loop(self) -> None:
        """Opens primary streams until stopped; raises a fatal CasqError."""
        self.watchdog_task = asyncio.create_task(self._watchdog())
        while not self.core.stopping:
            stream = self._open(PRIMARY, self.client.current_broker)
            if stream is None:
                break
            reader = self.readers[stream]
            try:
                await asyncio.wait({reader})
            except asyncio.CancelledError:
                reader.cancel()  # run() itself was cancelled: end the stream with it
                await asyncio.wait({reader}, timeout=_CLOSE_GRACE)
                raise
            finally:
                self._drop(stream)
            if reader.cancelled() or self.core.stopping:
                break
            failure = reader.exception()
            if failure is not None and not isinstance(failure, (grpc.RpcError, StreamTimeoutError)):
                raise failure
            error = None if failure is None else _casq_error(failure)
            step = self.core.primary_ended(stream, error)  # raises a fatal error
            if step.report is not None:
                self.report(step.report, None)
            step.move(self.client, stream)
            if step.pause:
                await self._pause(self.core.pause_delay())

    def _open(self, lane: str, address: str) -> Stream | None:
        stream = self.core.open_stream(lane, address, _outbox())
        if stream is not None:
            self._start(stream)
        return stream

    def _start(self, stream: Stream) -> None:
        """Opens the stream's call; it is read in its own task so that ending it (grpc.aio raises
        CancelledError for a cancelled call) is never mistaken for a cancel of run()."""
        call = self.client.queue_stub(stream.address).Work(_requests(stream), metadata=self.client.metadata())
        stream.cancel = call.cancel
        self.readers[stream] = asyncio.create_task(self._read(stream, call))
        if stream.lane != PRIMARY:
            task = asyncio.create_task(self._secondary(stream))
            self.secondaries.add(task)
            task.add_done_callback(self.secondaries.discard)

    def _drop(self, stream: Stream) -> None:
        """The stream ended: unregister it; requests awaiting a reply go unary."""
        self.core.close_stream(stream)
        self.readers.pop(stream, None)

    async def _secondary(self, stream: Stream) -> None:
        """A secondary stream has no reconnect loop: when it ends it is dropped, and its jobs settle by unary call."""
        reader = self.readers[stream]
        try:
            await asyncio.wait({reader})
        except asyncio.CancelledError:
            reader.cancel()
            await asyncio.wait({reader}, timeout=_CLOSE_GRACE)
            raise
        finally:
            self._drop(stream)
        if reader.cancelled() or self.core.stopping:
            return
        failure = reader.exception()
        error: CasqError | None = None
        if failure is not None and not isinstance(failure, (grpc.RpcError, StreamTimeoutError)):
            self.report(failure if isinstance(failure, Exception) else RuntimeError(repr(failure)), None)
        elif failure is not None:
            error = _casq_error(failure)
        report, delay = self.core.secondary_ended(stream, error)
        if report is not None:
            self.report(report, None)
        await self._pause(delay)
        self._react(Reaction(streams=self.core.reroute(_outbox)))

    async def _read(self, stream: Stream, call: WorkCall) -> None:
        try:
            async for response in call:
                self._react(self.core.on_response(stream, response, _outbox))
        except (asyncio.CancelledError, grpc.RpcError):
            if stream.hung is not None:
                raise stream.hung from None  # the watchdog cancelled the call: an outage, not a cancel of run()
            raise
        finally:
            call.cancel()  # a no-op once the stream has ended

    def _react(self, reaction: Reaction) -> None:
        for stream in reaction.streams:
            self._start(stream)
        if reaction.start_heartbeats:
            self.heartbeat_task = asyncio.create_task(self._heartbeats())
        for held in reaction.release:
            self._release(held)
        for held in reaction.start:
            self.handlers[held] = self._track(self._execute(held))

    async def _watchdog(self) -> None:
        """Cancels every stream the core finds hung (see WorkCore.hung_streams)."""
        while True:
            await asyncio.sleep(self.core.watchdog_interval)
            for stream in self.core.hung_streams():
                if stream.cancel is not None:
                    stream.cancel()

    async def _pause(self, delay: float) -> None:
        try:
            await asyncio.wait_for(self.wake.wait(), delay)
        except asyncio.TimeoutError:
            pass

    # -- requests: on the stream, else unary -------------------------------------

    async def _request(
        self,
        stream: Stream | None,
        build: Callable[[int], work_pb2.WorkRequest],
        unary: Callable[[str], Awaitable[T]],
        from_reply: Callable[[work_pb2.WorkResponse], T],
    ) -> T:
        """Sends on ``stream``; when it is gone, redirected or ends first, calls ``unary`` instead."""
        leader: str | None = None
        if stream is not None:
            sent = self.core.send(stream, build, asyncio.get_running_loop().create_future())
            if sent is not None:
                assert isinstance(sent, asyncio.Future)
                try:
                    return from_reply(await sent)
                except RedirectError as redirect:
                    leader = redirect.leader_address or None
                except (StreamClosed, UnavailableError):
                    pass  # StreamTimeoutError included
        if leader:
            try:
                return await unary(leader)
            except grpc.RpcError as rpc_error:
                error = error_from_rpc(rpc_error)
                if not is_outage(error) and not isinstance(error, RedirectError):
                    raise error from None
        return await self.client.call(unary)

    # -- jobs -------------------------------------------------------------------

    def _track(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _execute(self, held: Held) -> None:
        job = held.job
        ack = False
        dead_letter = False
        reason = ""
        try:
            with processing_span(job, self.core.queue):
                await self.handler(job)
            ack = True
        except DeadLetter as dead:
            log_handler_failure(job, dead)
            dead_letter, reason = True, dead.reason or "dead-lettered by handler"
        except asyncio.CancelledError as cancelled:
            if held.abandoned or _cancel_requested():
                # Cancelled by stop() after its deadline, or with run(): never settled, the lease expires.
                held.abandoned = True
                raise
            # The handler's own (it awaited a task or future someone else cancelled): a failure like any other.
            self.report(cancelled, job, handler_failed=True)
            reason = f"{type(cancelled).__name__}: {cancelled}"
        except Exception as error:  # noqa: BLE001 - any handler failure means nack
            if not held.abandoned:
                self.report(error, job, handler_failed=True)
            reason = f"{type(error).__name__}: {error}"
        finally:
            self.handlers.pop(held, None)
            self._react(Reaction(start=self.core.handler_done(held)))
        # Abandoned (the handler swallowed stop()'s cancel): too late to settle, the core refuses.
        await self._settle(held, ack=ack, dead_letter=dead_letter, reason=reason)

    def _release(self, held: Held) -> None:
        """Gives a job that never started back at once: claimable again, and the delivery counts no attempt."""
        self._track(self._settle(held, ack=False, reason="worker stopping", release=True))

    async def _settle(
        self, held: Held, *, ack: bool, dead_letter: bool = False, reason: str = "", release: bool = False
    ) -> None:
        """Acks or nacks a held job exactly once: on the stream, else by unary call."""
        settle = self.core.settle(held, ack=ack, dead_letter=dead_letter, reason=reason, release=release)
        if settle is None:
            return
        client = self.client

        async def unary(address: str) -> list[CasqError]:
            stub = client.queue_stub(address)
            if settle.ack is not None:
                acked = await stub.Ack(settle.ack, timeout=client.timeout, metadata=client.metadata())
                return ack_failures(settle.ack.receipts, acked.results)
            assert settle.nack is not None
            nacked = await stub.Nack(settle.nack, timeout=client.timeout, metadata=client.metadata())
            return nack_failures(settle.nack.receipts, nacked.results)

        try:
            for failure in await self._request(held.stream, settle.stream_request, unary, settle.from_reply):
                self.report(failure, held.job)
        except CasqError as error:
            # Not settled: the lease expires and casq redelivers the job (at-least-once).
            self.report(error, held.job)
        finally:
            self.core.forget(held, credit=True)

    # -- heartbeats -------------------------------------------------------------

    async def _heartbeats(self) -> None:
        """Heartbeats every held job on the stream it uses (unary once that one is gone)."""
        while True:
            await asyncio.sleep(self.core.heartbeat_interval)
            for stream, heartbeat in self.core.heartbeats():
                try:
                    results = await self._heartbeat(stream, heartbeat)
                except CasqError as error:
                    self.report(error, None)
                    continue
                self.core.heartbeated(results)

    async def _heartbeat(self, stream: Stream | None, heartbeat: Heartbeat) -> list[message_pb2.HeartbeatResult]:
        client = self.client

        async def unary(address: str) -> list[message_pb2.HeartbeatResult]:
            response = await client.queue_stub(address).Heartbeat(
                heartbeat.unary, timeout=client.timeout, metadata=client.metadata()
            )
            return list(response.results)

        return await self._request(stream, heartbeat.stream_request, unary, Heartbeat.from_reply)

    # -- shutdown ---------------------------------------------------------------

    def shutdown(self, timeout: float | None) -> asyncio.Task[None]:
        """Starts the shutdown once (the first caller's timeout counts); every caller awaits the same task."""
        if self.shutdown_task is None:
            streams = list(self.core.streams.values())
            for held in self.core.stop():  # jobs received but not started go back at once
                self._release(held)
            self.wake.set()
            self.shutdown_task = asyncio.create_task(self._shutdown(streams, timeout))
        return self.shutdown_task

    async def _shutdown(self, streams: list[Stream], timeout: float | None) -> None:
        running = {task for held, task in self.handlers.items() if held.in_handler}
        if running and (timeout is None or timeout > 0):
            await asyncio.wait(running, timeout=timeout)
        for held in self.core.abandon():
            task = self.handlers.get(held)
            if task is not None:
                task.cancel()
        # Let cancelled handlers unwind and acks/nacks in flight land (bounded).
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=_SETTLE_GRACE)
        # The broker ends a half-closed stream with OK once it has answered it; do not wait forever.
        readers = {r for s in streams if (r := self.readers.get(s)) is not None and not r.done()}
        if readers:
            await asyncio.wait(readers, timeout=_CLOSE_GRACE)
            for reader in readers:
                reader.cancel()

    async def close(self) -> None:
        """After the loop: nothing of this run may outlive run()."""
        # Handlers still running (run() cancelled before the shutdown got to them) are given up before they
        # are cancelled, as the shutdown does: their CancelledError is then not taken for their own failure.
        self.core.abandon()
        leftovers = set(self.tasks) | set(self.secondaries)
        for task in (self.heartbeat_task, self.watchdog_task):
            if task is not None:
                leftovers.add(task)
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=_CLOSE_GRACE)

    def report(self, error: BaseException, job: Job | None, *, handler_failed: bool = False) -> None:
        report_failure(error, job, self.on_error, handler_failed=handler_failed)


def _cancel_requested() -> bool:
    """Whether the current task (a handler's) was asked to cancel: by the run, or by anyone (the loop closing, say).

    When it was not, a CancelledError out of the handler is the handler's own:
    it awaited something that someone else cancelled. Python 3.10 does not
    count a task's cancel requests: there only the jobs that stop() or run()
    gave up count as cancelled.
    """
    if sys.version_info < (3, 11):
        return False
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _casq_error(failure: BaseException) -> CasqError:
    """A broken stream's failure as a CasqError (the watchdog's StreamTimeoutError as it is)."""
    if isinstance(failure, CasqError):
        return failure
    assert isinstance(failure, grpc.RpcError)
    return error_from_rpc(failure)


class Worker:
    """Consumes a queue with an async handler: ack on return, nack on exception.

    The asyncio counterpart of :class:`casq.Worker`, on a :class:`casq.aio.Client`::

        worker = casq.aio.Worker(client)
        await worker.run("emails", handle, concurrency=8)  # until worker.stop() or cancel

    One ``run()`` at a time per worker. A run keeps one Work stream per broker
    that leads shards of the queue: the primary stream (to the client's
    current broker; reconnects with backoff and follows redirects) and a
    secondary stream to every other leader the brokers' routing names.
    """

    def __init__(self, client: Client, worker_id: str | None = None) -> None:
        self.client = client
        self.worker_id = worker_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self._run: _Run | None = None

    async def run(
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
        """Work on ``queue`` until :meth:`stop`, running up to ``concurrency`` handlers at once.

        Each stream holds up to its prefetch of jobs: running, waiting, and
        credit the broker has not used yet. By default the prefetch adapts, from
        ``concurrency`` up to ``max_prefetch`` (default 100 × ``concurrency``, at
        most 10 000; past 20 × ``concurrency`` only for a slow store): it grows
        while handlers wait for jobs the broker would have sent with more credit (fast handlers, slow store) and shrinks back
        when jobs only wait; waiting jobs are heartbeated like running ones.
        ``prefetch`` fixes it instead (``concurrency``..10 000). A worker whose
        queue's shards are led by *n* brokers holds up to ``n`` times that, while
        ``concurrency`` bounds the running handlers across all streams. Each job runs in an
        OpenTelemetry ``process <queue>`` span. Returning from the handler acks
        the job; raising nacks it (retry with the queue's backoff; a
        CancelledError the handler raises on its own too: only the cancel of
        :meth:`stop` or of ``run()`` leaves a job unsettled);
        :class:`casq.DeadLetter` dead-letters it. ``job.lost`` is set when the
        broker reports the lease lost. Outages and redirects are retried; raises
        a :class:`casq.CasqError` only for failures retrying cannot fix
        (``NOT_FOUND``, ``INVALID_ARGUMENT``, ``PERMISSION_DENIED``,
        ``UNAUTHENTICATED``, ``FAILED_PRECONDITION``). Cancelling the task that
        runs it stops at once: unstarted jobs are handed back, running handlers
        are cancelled (not acked: their leases expire).
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self._run is not None:
            raise RuntimeError("this casq.aio.Worker is already running")
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
        run = _Run(self.client, core, handler, on_error)
        self._run = run
        try:
            try:
                await run.loop()
            except CasqError:
                await asyncio.shield(run.shutdown(0.0))
                raise
            except asyncio.CancelledError:
                # Cancelled: hand back unstarted jobs, cancel running handlers, end the stream.
                shutdown = run.shutdown(0.0)
                await asyncio.wait({shutdown}, timeout=_SETTLE_GRACE + _CLOSE_GRACE)
                raise
            # Stopped: stop() drives the shutdown; run() returns once it is over.
            if run.shutdown_task is not None:
                await asyncio.shield(run.shutdown_task)
        finally:
            await run.close()
            self._run = None
            run.done.set()

    async def stop(self, timeout: float | None = 30.0) -> None:
        """Stop taking jobs, finish or hand back what is held, end every stream; returns once ``run()`` returned.

        Jobs received but not started are handed back at once (nack with no
        delay). Running handlers get ``timeout`` seconds to finish and are then
        acked or nacked (``None``: no deadline); handlers still running after it
        are cancelled and not acked (their leases expire and casq redelivers the
        jobs). Do not await it from inside a handler (it waits for that handler):
        start it as a task.
        """
        run = self._run
        if run is None:
            return
        await run.shutdown(None if timeout is None else max(0.0, timeout))
        await run.done.wait()
