"""Worker for the asyncio API: runs an async handler over the bidirectional Work stream."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from grpc import aio

from casq._backoff import backoff_delay
from casq._log import log_handler_failure, log_worker_error
from casq._messages import to_duration
from casq._settle import ack_failures, nack_failures
from casq._tracing import processing_span
from casq.aio.client import Client
from casq.client import is_outage
from casq.errors import (
    CasqError,
    DeadLetter,
    LeaseLostError,
    RedirectError,
    StreamTimeoutError,
    UnavailableError,
    error_from_rpc,
    error_from_status,
)
from casq.job import Job
from casq.v1 import message_pb2, queue_service_pb2, work_pb2
from casq.worker import FATAL_CODES  # the same failures end run() in both workers

T = TypeVar("T")

Handler = Callable[[Job], Awaitable[None]]
"""``async def handler(job: casq.Job) -> None``: return to ack, raise to nack."""

ErrorCallback = Callable[[Exception, "Job | None"], None]
"""Called with failures that do not end ``run()``: handler errors, failed settles, broken streams."""


# Receipts per heartbeat request: a worker holds at most 1000 jobs, and the
# smaller batches stay within limits.max_batch unless a queue lowered it a lot.
_HEARTBEAT_CHUNK = 500
# Opened.max_credits: more outstanding credit ends the stream.
_MAX_CREDITS = 1000
# After the handlers: how long stop() lets acks/nacks in flight land, and how
# long it waits for the broker's OK after the half-close before cancelling.
_SETTLE_GRACE = 5.0
_CLOSE_GRACE = 2.0
# The lane of the primary stream; a secondary stream's lane is its broker address.
_PRIMARY = ""


class _StreamClosed(Exception):
    """The Work stream ended before answering a request (the request is resent unary)."""


@dataclass(eq=False)
class _Held:
    """A job this worker holds a lease for, from delivery until it is settled or given up."""

    job: Job
    lane: str
    # The stream whose credit the job uses: the one that delivered it, or the
    # lane's next stream if that one opened while the job was still held.
    session: _Session | None
    started: bool = False
    in_handler: bool = False
    settled: bool = False
    # Cancelled by stop() after its deadline: never settled, not heartbeated.
    abandoned: bool = False
    task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class _Session:
    """One Work stream: its lane, outbox (None half-closes) and requests awaiting a reply."""

    lane: str
    address: str
    outbox: asyncio.Queue[work_pb2.WorkRequest | None] = field(default_factory=asyncio.Queue)
    pending: dict[int, asyncio.Future[work_pb2.WorkResponse]] = field(default_factory=dict)
    sent_at: dict[int, float] = field(default_factory=dict)  # request id -> time.monotonic() it was sent
    started_at: float = field(default_factory=time.monotonic)
    opened: bool = False
    # Set by the watchdog when the broker left the open or a request unanswered
    # for the client's timeout (a hung broker); the call is then cancelled.
    hung: StreamTimeoutError | None = None
    call: aio.StreamStreamCall[work_pb2.WorkRequest, work_pb2.WorkResponse] | None = None
    closed: bool = False
    half_closed: bool = False
    draining: bool = False
    reader: asyncio.Task[None] | None = None
    routing: work_pb2.WorkRouting | None = None  # the latest the broker sent

    @property
    def usable(self) -> bool:
        return not self.closed and not self.half_closed

    async def requests(self) -> AsyncIterator[work_pb2.WorkRequest]:
        while True:
            item = await self.outbox.get()
            if item is None:
                return
            yield item

    def send(self, request: work_pb2.WorkRequest) -> None:
        self.outbox.put_nowait(request)

    def request(self, request_id: int, request: work_pb2.WorkRequest) -> asyncio.Future[work_pb2.WorkResponse]:
        future: asyncio.Future[work_pb2.WorkResponse] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        self.sent_at[request_id] = time.monotonic()
        self.outbox.put_nowait(request)
        return future

    def reply(self, response: work_pb2.WorkResponse) -> None:
        future = self.pending.pop(response.request_id, None)
        self.sent_at.pop(response.request_id, None)
        if future is None or future.done():
            return
        if response.WhichOneof("event") == "request_failed":
            future.set_exception(error_from_status(response.request_failed.status))
        else:
            future.set_result(response)

    def half_close(self) -> None:
        if self.usable:
            self.half_closed = True
            self.outbox.put_nowait(None)

    def close(self) -> None:
        """The stream is over: whoever awaits a reply resends the request unary."""
        self.closed = True
        self.outbox.put_nowait(None)
        pending = list(self.pending.values())
        self.pending.clear()
        self.sent_at.clear()
        for future in pending:
            if not future.done():
                future.set_exception(_StreamClosed("casq: work stream ended"))
                # Read it here so an abandoned waiter does not log "exception never retrieved".
                future.exception()


class _Run:
    """One ``Worker.run()``: its streams, held jobs, handler tasks and shutdown."""

    def __init__(
        self,
        client: Client,
        worker_id: str,
        queue: str,
        handler: Handler,
        *,
        subscription: str,
        concurrency: int,
        prefetch: int,
        lease_ttl: float | None,
        on_error: ErrorCallback | None,
    ) -> None:
        self.client = client
        self.worker_id = worker_id
        self.queue = queue
        self.subscription = subscription
        self.handler = handler
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.lease_ttl = lease_ttl
        self.on_error = on_error
        self.held: dict[str, _Held] = {}
        self.waiting: deque[_Held] = deque()
        self.running = 0
        self.stopping = False
        self.sessions: dict[str, _Session] = {}  # lane -> open or opening stream
        self.secondaries: set[asyncio.Task[None]] = set()
        self.recheck_failures: dict[str, int] = {}  # address -> secondary streams that failed in a row
        self.tasks: set[asyncio.Task[None]] = set()
        self.heartbeat_task: asyncio.Task[None] | None = None
        self.watchdog_task: asyncio.Task[None] | None = None
        self.heartbeat_interval = 20.0
        self.failures = 0  # consecutive failed streams: the backoff's exponent
        self.redirects = 0  # consecutive redirects without an opened stream
        self.ids = itertools.count(1)
        self.wake = asyncio.Event()  # set by stop(): cuts a reconnect backoff short
        self.shutdown_task: asyncio.Task[None] | None = None
        self.done = asyncio.Event()  # set when run() has returned (or raised)

    # -- the stream -------------------------------------------------------------

    async def loop(self) -> None:
        """Opens streams until stopped; raises a fatal CasqError."""
        self.watchdog_task = asyncio.create_task(self._watchdog())
        while not self.stopping:
            address = self.client.current_broker
            session = self._new_session(_PRIMARY, address)
            if session is None:
                break
            reader = self._start(session)
            try:
                await asyncio.wait({reader})
            except asyncio.CancelledError:
                reader.cancel()  # run() itself was cancelled: end the stream with it
                await asyncio.wait({reader}, timeout=_CLOSE_GRACE)
                raise
            finally:
                self._drop(session)
            if reader.cancelled() or self.stopping:
                break
            failure = reader.exception()
            if failure is None:
                # The broker ended the stream without being asked: try the next one.
                self.report(UnavailableError(grpc.StatusCode.UNAVAILABLE, "casq: work stream ended"), None)
                self.client.fail_over()
                await self._pause()
                continue
            if not isinstance(failure, (grpc.RpcError, StreamTimeoutError)):
                raise failure
            error = failure if isinstance(failure, StreamTimeoutError) else error_from_rpc(failure)
            if error.code in FATAL_CODES:
                raise error from None
            if isinstance(error, RedirectError) and error.leader_address:
                self.client.current_broker = error.leader_address
                self.redirects += 1
                # Follow at once; but brokers that keep redirecting (a stale view of
                # leadership, or to themselves) get the backoff so we do not spin.
                if error.leader_address == address or self.redirects > len(self.client.brokers) + 1:
                    await self._pause()
                continue
            self.report(error, None)
            # A draining broker asked us to go elsewhere at once; anything else backs off.
            if not session.draining:
                await self._pause()
            self.client.fail_over(address)

    def _new_session(self, lane: str, address: str) -> _Session | None:
        """Registers the lane's new stream and queues its open; None once stopping."""
        if self.stopping:
            return None
        session = _Session(lane, address)
        # Jobs still held from the lane's earlier stream keep their leases and count
        # against prefetch; their credit comes back to this stream.
        mine = [held for held in self.held.values() if held.lane == lane]
        for held in mine:
            held.session = session
        open_request = work_pb2.WorkOpen(
            queue=self.queue,
            subscription=self.subscription,
            worker_id=self.worker_id,
            credits=max(0, min(_MAX_CREDITS, self.prefetch - len(mine))),
        )
        if self.lease_ttl is not None:
            open_request.lease_ttl.CopyFrom(to_duration(self.lease_ttl))
        session.send(work_pb2.WorkRequest(open=open_request))
        self.sessions[lane] = session
        return session

    def _start(self, session: _Session) -> asyncio.Task[None]:
        """Opens the stream; it is read in its own task so that ending it (grpc.aio raises
        CancelledError for a cancelled call) is never mistaken for a cancel of run()."""
        call = self.client.queue_stub(session.address).Work(session.requests(), metadata=self.client.metadata())
        session.call = call
        reader = asyncio.create_task(self._read(session, call))
        session.reader = reader
        return reader

    def _drop(self, session: _Session) -> None:
        """The stream ended: unregister it; requests awaiting a reply go unary."""
        if self.sessions.get(session.lane) is session:
            del self.sessions[session.lane]
        session.close()

    def _route(self, session: _Session, routing: work_pb2.WorkRouting) -> None:
        """Opens a secondary stream to every leader of a shard ``session`` does not serve and no stream reaches."""
        session.routing = routing
        if self.stopping or not session.usable:
            return
        served = set(routing.serving_shards)
        reached = {s.address for s in self.sessions.values()}
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
            task = asyncio.create_task(self._secondary(secondary))
            self.secondaries.add(task)
            task.add_done_callback(self.secondaries.discard)

    async def _secondary(self, session: _Session) -> None:
        """A secondary stream has no reconnect loop: when it ends it is dropped, and its jobs settle by unary call."""
        reader = self._start(session)
        try:
            await asyncio.wait({reader})
        except asyncio.CancelledError:
            reader.cancel()
            await asyncio.wait({reader}, timeout=_CLOSE_GRACE)
            raise
        finally:
            self._drop(session)
        if reader.cancelled() or self.stopping:
            return
        failure = reader.exception()
        if isinstance(failure, StreamTimeoutError):
            self.report(failure, None)
        elif failure is not None and not isinstance(failure, grpc.RpcError):
            self.report(failure if isinstance(failure, Exception) else RuntimeError(repr(failure)), None)
        elif failure is not None:
            error = error_from_rpc(failure)
            if not isinstance(error, RedirectError):
                self.report(error, None)
        # Routing events come only when a broker's served shards change, so a
        # stream lost to a passing outage would not be reopened by one: after a
        # backoff, apply the routing the open streams last reported once more
        # (it reopens this stream only if that routing still names the broker).
        failures = self.recheck_failures.get(session.address, 0)
        self.recheck_failures[session.address] = failures + 1
        delay = backoff_delay(failures, self.client.backoff_initial, self.client.backoff_max)
        try:
            await asyncio.wait_for(self.wake.wait(), delay)
        except asyncio.TimeoutError:
            pass
        for other in list(self.sessions.values()):
            if other.routing is not None:
                self._route(other, other.routing)

    async def _read(
        self, session: _Session, call: aio.StreamStreamCall[work_pb2.WorkRequest, work_pb2.WorkResponse]
    ) -> None:
        try:
            async for response in call:
                self._on_response(session, response)
        except (asyncio.CancelledError, grpc.RpcError):
            if session.hung is not None:
                raise session.hung from None  # the watchdog cancelled the call: an outage, not a cancel of run()
            raise
        finally:
            call.cancel()  # a no-op once the stream has ended

    async def _watchdog(self) -> None:
        """Ends every stream whose broker left its open or a request unanswered for the client's timeout.

        See casq.Worker._watchdog: a hung broker keeps the connection up and
        never answers; cancelling the call fails what awaits an answer over to
        unary calls (which move on from the hung broker) and reconnects the
        primary stream at the next broker.
        """
        timeout = self.client.timeout
        while True:
            await asyncio.sleep(max(0.05, min(1.0, timeout / 4)))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if session.hung is not None or session.call is None or session.closed:
                    continue
                waited = [] if session.opened else [now - session.started_at]
                waited += [now - sent for sent in session.sent_at.values()]
                if waited and max(waited) > timeout:
                    what = "a request" if session.opened else "the stream's open"
                    session.hung = StreamTimeoutError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"casq: broker {session.address} left {what} unanswered for {timeout:g}s "
                        "(hung?): work stream ended, going elsewhere",
                    )
                    session.call.cancel()

    async def _pause(self) -> None:
        delay = backoff_delay(self.failures, self.client.backoff_initial, self.client.backoff_max)
        self.failures += 1
        try:
            await asyncio.wait_for(self.wake.wait(), delay)
        except asyncio.TimeoutError:
            pass

    def _on_response(self, session: _Session, response: work_pb2.WorkResponse) -> None:
        event = response.WhichOneof("event")
        if event == "opened":
            session.opened = True
            if session.lane == _PRIMARY:
                self.failures = self.redirects = 0
            self.recheck_failures.pop(session.address, None)
            interval = response.opened.heartbeat_interval.ToTimedelta().total_seconds()
            self.heartbeat_interval = max(0.05, interval) if interval > 0 else 20.0
            if self.heartbeat_task is None:
                self.heartbeat_task = asyncio.create_task(self._heartbeats())
            self._route(session, response.opened.routing)
        elif event == "job":
            held = _Held(Job(response.job), session.lane, session)
            self.held[held.job.receipt] = held
            if self.stopping:
                self._release(held)
            else:
                self.waiting.append(held)
                self._pump()
        elif event == "leases_lost":
            for receipt in response.leases_lost.receipts:
                self._lost(receipt)
        elif event in ("heartbeated", "acked", "nacked", "request_failed"):
            session.reply(response)
        elif event == "routing":
            self._route(session, response.routing)
        elif event == "draining":
            session.draining = True

    # -- requests: on the stream, else unary -------------------------------------

    async def _request(
        self,
        session: _Session | None,
        build: Callable[[int], work_pb2.WorkRequest],
        unary: Callable[[str], Awaitable[T]],
        from_reply: Callable[[work_pb2.WorkResponse], T],
    ) -> T:
        """Sends on ``session``; when it is gone, redirected or ends first, calls ``unary`` instead."""
        leader: str | None = None
        if session is not None and session.usable:
            request_id = next(self.ids)
            try:
                return from_reply(await session.request(request_id, build(request_id)))
            except RedirectError as redirect:
                leader = redirect.leader_address or None
            except (_StreamClosed, UnavailableError):
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

    def _pump(self) -> None:
        while not self.stopping and self.running < self.concurrency and self.waiting:
            held = self.waiting.popleft()
            held.started = True
            held.in_handler = True
            self.running += 1
            held.task = self._track(self._execute(held))

    async def _execute(self, held: _Held) -> None:
        job = held.job
        ack = False
        dead_letter = False
        reason = ""
        try:
            with processing_span(job, self.queue):
                await self.handler(job)
            ack = True
        except DeadLetter as dead:
            log_handler_failure(job, dead)
            dead_letter, reason = True, dead.reason or "dead-lettered by handler"
        except asyncio.CancelledError:
            # Cancelled by stop() after its deadline, or with run(): never settled, the lease expires.
            held.abandoned = True
            raise
        except Exception as error:  # noqa: BLE001 - any handler failure means nack
            if not held.abandoned:
                self.report(error, job, handler_failed=True)
            reason = f"{type(error).__name__}: {error}"
        finally:
            held.in_handler = False
            self.running -= 1
            if held.abandoned:
                self._forget(held, credit=False)
            else:
                self._pump()
        if held.abandoned:  # the handler swallowed stop()'s cancel: too late to settle
            return
        # A lost lease does not skip the settle: the broker still accepts it if nobody
        # claimed the message since, which spares a duplicate delivery.
        if ack:
            await self._settle(held, ack=True)
        else:
            await self._settle(held, ack=False, dead_letter=dead_letter, reason=reason)

    def _release(self, held: _Held) -> None:
        """Gives a job that never started back at once (nack, no delay, no attempt used up by waiting)."""
        # A release: claimable again at once, and the delivery does not count as an attempt.
        self._track(self._settle(held, ack=False, reason="worker stopping", release=True))

    async def _settle(
        self,
        held: _Held,
        *,
        ack: bool,
        dead_letter: bool = False,
        reason: str = "",
        delay: float | None = None,
        release: bool = False,
    ) -> None:
        """Acks or nacks a held job exactly once: on the stream, else by unary call."""
        if held.settled:
            return
        held.settled = True
        receipts = [held.job.receipt]
        client = self.client
        try:
            if ack:
                acked = queue_service_pb2.AckRequest(
                    queue=self.queue, subscription=self.subscription, receipts=receipts
                )

                async def unary_ack(address: str) -> list[LeaseLostError]:
                    response = await client.queue_stub(address).Ack(
                        acked, timeout=client.timeout, metadata=client.metadata()
                    )
                    return ack_failures(response.results)

                failures = await self._request(
                    held.session,
                    lambda rid: work_pb2.WorkRequest(request_id=rid, ack=work_pb2.WorkAck(receipts=receipts)),
                    unary_ack,
                    lambda reply: ack_failures(reply.acked.results),
                )
                for failure in failures:
                    self.report(failure, held.job)
                return
            nack = work_pb2.WorkNack(receipts=receipts, dead_letter=dead_letter, reason=reason, release=release)
            if delay is not None:
                nack.delay.CopyFrom(to_duration(delay))
            nacked = queue_service_pb2.NackRequest(
                queue=self.queue,
                subscription=self.subscription,
                receipts=receipts,
                dead_letter=dead_letter,
                reason=reason,
                release=release,
            )
            if delay is not None:
                nacked.delay.CopyFrom(nack.delay)

            async def unary_nack(address: str) -> list[LeaseLostError]:
                response = await client.queue_stub(address).Nack(
                    nacked, timeout=client.timeout, metadata=client.metadata()
                )
                return nack_failures(response.results)

            failures = await self._request(
                held.session,
                lambda rid: work_pb2.WorkRequest(request_id=rid, nack=nack),
                unary_nack,
                lambda reply: nack_failures(reply.nacked.results),
            )
            for failure in failures:
                self.report(failure, held.job)
        except CasqError as error:
            # Not settled: the lease expires and casq redelivers the job (at-least-once).
            self.report(error, held.job)
        finally:
            self._forget(held, credit=True)

    def _forget(self, held: _Held, *, credit: bool) -> None:
        """Drops a job from the held set; gives its credit back to the stream it uses, so that one sends another."""
        if self.held.pop(held.job.receipt, None) is None:
            return
        session = held.session
        if credit and not self.stopping and session is not None and session.usable:
            session.send(work_pb2.WorkRequest(credit=work_pb2.WorkCredit(credits=1)))

    def _lost(self, receipt: str) -> None:
        held = self.held.get(receipt)
        if held is None or held.job.lost.is_set():
            return
        held.job.lost.set()
        if not held.started:
            # Never started: drop it without settling and take another job instead.
            try:
                self.waiting.remove(held)
            except ValueError:
                pass
            self._forget(held, credit=True)

    # -- heartbeats -------------------------------------------------------------

    async def _heartbeats(self) -> None:
        """Heartbeats every held job on the stream it uses (unary once that one is gone)."""
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            groups: dict[_Session | None, list[str]] = {}
            for receipt, held in self.held.items():
                if not held.settled and not held.abandoned and not held.job.lost.is_set():
                    groups.setdefault(held.session, []).append(receipt)
            for session, receipts in groups.items():
                for start in range(0, len(receipts), _HEARTBEAT_CHUNK):
                    try:
                        results = await self._heartbeat(session, receipts[start : start + _HEARTBEAT_CHUNK])
                    except CasqError as error:
                        self.report(error, None)
                        continue
                    for result in results:
                        if result.outcome == message_pb2.HEARTBEAT_OUTCOME_LOST:
                            self._lost(result.receipt)

    async def _heartbeat(self, session: _Session | None, receipts: list[str]) -> list[message_pb2.HeartbeatResult]:
        client = self.client
        request = queue_service_pb2.HeartbeatRequest(
            queue=self.queue, subscription=self.subscription, worker_id=self.worker_id, receipts=receipts
        )

        async def unary(address: str) -> list[message_pb2.HeartbeatResult]:
            response = await client.queue_stub(address).Heartbeat(
                request, timeout=client.timeout, metadata=client.metadata()
            )
            return list(response.results)

        return await self._request(
            session,
            lambda rid: work_pb2.WorkRequest(request_id=rid, heartbeat=work_pb2.WorkHeartbeat(receipts=receipts)),
            unary,
            lambda reply: list(reply.heartbeated.results),
        )

    # -- shutdown ---------------------------------------------------------------

    def shutdown(self, timeout: float | None) -> asyncio.Task[None]:
        """Starts the shutdown once (the first caller's timeout counts); every caller awaits the same task."""
        self.stopping = True
        self.wake.set()
        if self.shutdown_task is None:
            self.shutdown_task = asyncio.create_task(self._shutdown(timeout))
        return self.shutdown_task

    async def _shutdown(self, timeout: float | None) -> None:
        # Half-close first: credit cannot be taken back, so an open stream would keep
        # sending jobs only for us to hand them back. The broker still answers what
        # was sent before; later acks and nacks go as unary calls.
        sessions = list(self.sessions.values())
        for session in sessions:
            session.half_close()
        # Jobs received but not started go back at once.
        while self.waiting:
            self._release(self.waiting.popleft())
        running = {h.task for h in self.held.values() if h.in_handler and h.task is not None}
        if running and (timeout is None or timeout > 0):
            await asyncio.wait(running, timeout=timeout)
        for held in list(self.held.values()):
            if held.in_handler and held.task is not None:
                held.abandoned = True
                held.task.cancel()
        # Let cancelled handlers unwind and acks/nacks in flight land (bounded).
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=_SETTLE_GRACE)
        # The broker ends a half-closed stream with OK once it has answered it; do not wait forever.
        readers = {s.reader for s in sessions if s.reader is not None and not s.reader.done()}
        if readers:
            await asyncio.wait(readers, timeout=_CLOSE_GRACE)
            for reader in readers:
                reader.cancel()

    async def close(self) -> None:
        """After the loop: nothing of this run may outlive run()."""
        if self.heartbeat_task is not None:
            self.heartbeat_task.cancel()
        leftovers = set(self.tasks) | set(self.secondaries)
        for task in (self.heartbeat_task, self.watchdog_task):
            if task is not None:
                leftovers.add(task)
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=_CLOSE_GRACE)

    def report(self, error: Exception, job: Job | None, *, handler_failed: bool = False) -> None:
        """Logs a failure that does not end the run (see casq._log), then tells ``on_error``."""
        if handler_failed and job is not None:
            log_handler_failure(job, error)
        else:
            log_worker_error(error, job)
        if self.on_error is not None:
            try:
                self.on_error(error, job)
            except Exception:  # noqa: BLE001 - a failing callback must not kill the worker
                pass


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
        lease_ttl: float | None = None,
        on_error: ErrorCallback | None = None,
    ) -> None:
        """Work on ``queue`` until :meth:`stop`, running up to ``concurrency`` handlers at once.

        ``prefetch`` (default ``concurrency``, at most 1000) is how many jobs
        each stream holds at once, running or waiting: a worker whose queue's
        shards are led by *n* brokers holds up to ``n * prefetch`` jobs, while
        ``concurrency`` bounds the running handlers across all streams. Each job runs in an
        OpenTelemetry ``process <queue>`` span. Returning from the handler acks
        the job; raising nacks it (retry with the queue's backoff);
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
        credits = prefetch if prefetch is not None else concurrency
        if not 1 <= credits <= _MAX_CREDITS:
            raise ValueError(f"prefetch must be between 1 and {_MAX_CREDITS}")
        if self._run is not None:
            raise RuntimeError("this casq.aio.Worker is already running")
        run = _Run(
            self.client,
            self.worker_id,
            queue,
            handler,
            subscription=subscription,
            concurrency=concurrency,
            prefetch=credits,
            lease_ttl=lease_ttl,
            on_error=on_error,
        )
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
