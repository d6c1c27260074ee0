"""The client side of the Work stream protocol, without I/O: one core for both workers.

What a worker run decides lives here, once: the streams it keeps (one per
broker leading shards of the queue) and where routing says to open more, the
jobs it holds and which of them may start, the credit each stream is owed, the
requests sent and not answered yet, leases lost, what an ack or nack becomes
on the stream and as a unary call, which jobs to heartbeat on which stream, a
hung stream (the watchdog), what to do when a stream ends, and the drain on
stop. The drivers own the I/O and the concurrency: casq/worker.py (threads)
and casq/aio/worker.py (asyncio) open the gRPC calls, run handlers, sleep,
and resend unary what a stream could not carry.

The core is not thread-safe: the thread driver calls it under its lock. It
never blocks, sleeps or reads the clock but through the ``clock`` it is given;
the only effects are ``put_nowait`` on a stream's outbox and resolving the
waiters (futures) of answered requests.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from casq._backoff import backoff_delay
from casq._credit_window import CreditWindow, credit_window_bounds
from casq._messages import to_duration
from casq._settle import ack_failures, nack_failures
from casq.errors import CasqError, RedirectError, StreamTimeoutError, UnavailableError, error_from_status
from casq.job import Job
from casq.v1 import message_pb2, queue_service_pb2, work_pb2

# The lane of the primary stream; a secondary stream's lane is its broker address.
PRIMARY = ""
# Opened.max_credits: more outstanding credit ends the stream.
MAX_CREDITS = 1000
# Receipts per heartbeat request: a worker holds at most 1000 jobs per stream, and
# the smaller batches stay within limits.max_batch unless a queue lowered it a lot.
HEARTBEAT_CHUNK = 500
# Until a broker's Opened says otherwise.
DEFAULT_HEARTBEAT_INTERVAL = 20.0

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

Clock = Callable[[], float]


# Receipts per batched ack (as the TypeScript SDK's; within the broker's default max_batch of 1000).
ACK_BATCH = 500


class AckBatch:
    """Acks of one stream gathered into one request until the stream's writer takes it.

    Handlers that finish while the writer is busy add their receipts to the
    batch in the outbox instead of queueing a request each: one request and
    one answer for them all. The writer calls :meth:`take` when it sends the
    batch; after that nothing joins it (a lock, as the thread driver's
    handlers and writer run on different threads).
    """

    def __init__(self, request_id: int, receipt: str) -> None:
        self.request_id = request_id
        self._receipts = [receipt]
        self._lock = threading.Lock()
        self._taken = False

    def add(self, receipt: str) -> bool:
        """Adds an ack of ``receipt``; False when the batch was sent already or is full."""
        with self._lock:
            if self._taken or len(self._receipts) >= ACK_BATCH:
                return False
            self._receipts.append(receipt)
            return True

    def take(self) -> work_pb2.WorkRequest:
        """The request to send now; the batch is closed."""
        with self._lock:
            self._taken = True
            return work_pb2.WorkRequest(request_id=self.request_id, ack=work_pb2.WorkAck(receipts=self._receipts))


def outgoing(item: work_pb2.WorkRequest | AckBatch) -> work_pb2.WorkRequest:
    """What a stream's writer sends for an item of its outbox."""
    return item.take() if isinstance(item, AckBatch) else item


class Outbox(Protocol):
    """Where a stream's requests go (``queue.Queue`` or ``asyncio.Queue``); None half-closes."""

    def put_nowait(self, item: work_pb2.WorkRequest | AckBatch | None, /) -> None: ...


class Waiter(Protocol):
    """The future a driver awaits for a request's answer (``concurrent.futures`` or ``asyncio``)."""

    def done(self) -> bool: ...

    def set_result(self, result: work_pb2.WorkResponse, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class StreamClosed(Exception):
    """The Work stream ended before answering a request (the driver resends it unary)."""


@dataclass(eq=False)
class Pending:
    """A request sent on a stream and not answered yet."""

    waiter: Waiter
    sent_at: float


@dataclass(eq=False)
class Stream:
    """One Work stream: its lane, outbox and unanswered requests.

    ``usable`` from creation until the stream ends or is half-closed: requests
    sent meanwhile go on the stream (an opening stream sends them after its
    open), later ones as unary calls.
    """

    lane: str
    address: str
    outbox: Outbox
    started_at: float
    credit: CreditWindow  # jobs held plus credit outstanding, adapting (see _credit_window.py)
    pending: dict[int, Pending] = field(default_factory=dict)
    opened: bool = False
    # Set by the watchdog when the broker left the open or a request unanswered
    # for the client's timeout (a hung broker): the driver then cancels the call.
    hung: StreamTimeoutError | None = None
    cancel: Callable[[], object] | None = None  # set by the driver once the call is open
    closed: bool = False
    half_closed: bool = False
    draining: bool = False
    routing: work_pb2.WorkRouting | None = None  # the latest the broker sent
    open_ack: AckBatch | None = None  # the newest ack batch put in the outbox (acks join it until it is sent)

    @property
    def usable(self) -> bool:
        return not self.closed and not self.half_closed

    def half_close(self) -> None:
        """No more requests: the broker answers what is outstanding, then ends with OK."""
        if self.usable:
            self.half_closed = True
            self.outbox.put_nowait(None)


@dataclass(eq=False)
class Held:
    """A job the run holds a lease for, from delivery until it is settled or given up."""

    job: Job
    lane: str
    # The stream whose credit the job uses: the one that delivered it, or the
    # lane's next stream if that one opened while the job was still held.
    stream: Stream | None
    started: bool = False
    in_handler: bool = False
    settled: bool = False
    # Its credit went back (when its handler finished, before the ack is answered).
    credited: bool = False
    # Given up by stop() after its deadline: never settled, not heartbeated.
    abandoned: bool = False


@dataclass(frozen=True)
class Settle:
    """One ack or nack of a held job: as a stream request and as the unary request."""

    held: Held
    stream_request: Callable[[int], work_pb2.WorkRequest]
    ack: queue_service_pb2.AckRequest | None
    nack: queue_service_pb2.NackRequest | None

    def from_reply(self, reply: work_pb2.WorkResponse) -> list[CasqError]:
        """Whether the stream's answer says this job was not settled (an ack's answer may be a batch's).

        Only this job's receipt is looked at: an answer with no result for it is a failure (UNKNOWN), not a success.
        """
        receipts = [self.held.job.receipt]
        if self.ack is not None:
            return ack_failures(receipts, reply.acked.results)
        return nack_failures(receipts, reply.nacked.results)


@dataclass(frozen=True)
class AckOf:
    """The stream request of one ack: ``receipt`` alone, or in a batch with others (see :meth:`WorkCore.send`)."""

    receipt: str

    def __call__(self, request_id: int) -> work_pb2.WorkRequest:
        return work_pb2.WorkRequest(request_id=request_id, ack=work_pb2.WorkAck(receipts=[self.receipt]))


@dataclass(frozen=True)
class Heartbeat:
    """One heartbeat of held jobs: as a stream request and as the unary request."""

    stream_request: Callable[[int], work_pb2.WorkRequest]
    unary: queue_service_pb2.HeartbeatRequest

    @staticmethod
    def from_reply(reply: work_pb2.WorkResponse) -> list[message_pb2.HeartbeatResult]:
        return list(reply.heartbeated.results)


@dataclass
class Reaction:
    """What the driver does after an event: start calls for new streams, start jobs, hand jobs back."""

    streams: list[Stream] = field(default_factory=list)
    start: list[Held] = field(default_factory=list)
    release: list[Held] = field(default_factory=list)
    start_heartbeats: bool = False


class RunSettings(Protocol):
    """What the core reads of a Client (either flavour)."""

    brokers: list[str]
    timeout: float
    backoff_initial: float
    backoff_max: float


class RunClient(RunSettings, Protocol):
    """What a Reconnect moves: a Client (either flavour)."""

    def follow_redirect(self, address: str) -> None: ...

    def fail_over(self, failed: str | None = None, avoid: Collection[str] = ()) -> str: ...


@dataclass(frozen=True)
class Reconnect:
    """What the primary stream's driver does after the stream ended: report, move, pause."""

    report: CasqError | None
    follow: str | None  # a redirect's leader: the client's current broker from now on
    fail_over: bool  # move the client past the stream's broker
    pause: bool  # wait a backoff delay (pause_delay()) first

    def move(self, client: RunClient, stream: Stream) -> None:
        """Points the client at where the next primary stream goes."""
        if self.follow is not None:
            client.follow_redirect(self.follow)
        if self.fail_over:
            client.fail_over(stream.address)


class WorkCore:
    """The protocol state of one worker run (see the module doc)."""

    def __init__(
        self,
        client: RunSettings,
        *,
        queue: str,
        subscription: str,
        worker_id: str,
        concurrency: int,
        prefetch: int | None,
        lease_ttl: float | None,
        max_prefetch: int | None = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        """``client`` gives the timeout (the watchdog's), the broker count and the backoff.

        ``prefetch`` fixes each stream's credit window; None lets it adapt from
        ``concurrency`` up to ``max_prefetch`` (see ``credit_window_bounds``).
        """
        self.queue = queue
        self.subscription = subscription
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.window = credit_window_bounds(concurrency, prefetch, max_prefetch)
        self.lease_ttl = lease_ttl
        self.timeout = client.timeout
        self.brokers = len(client.brokers)
        self.backoff_initial = client.backoff_initial
        self.backoff_max = client.backoff_max
        self.clock = clock
        self.rng = rng
        self.streams: dict[str, Stream] = {}  # lane -> open or opening stream
        self.held: dict[str, Held] = {}
        self.waiting: deque[Held] = deque()
        self.running = 0
        self.stopping = False
        self.heartbeat_interval = DEFAULT_HEARTBEAT_INTERVAL
        self.heartbeats_started = False
        self.failures = 0  # consecutive failed primary streams: the backoff's exponent
        self.redirects = 0  # consecutive redirects without an opened primary stream
        self.recheck_failures: dict[str, int] = {}  # address -> secondary streams that failed in a row
        self._ids = itertools.count(1)

    # -- streams ----------------------------------------------------------------

    def open_stream(self, lane: str, address: str, outbox: Outbox) -> Stream | None:
        """Registers the lane's new stream and queues its open; None once stopping (or a duplicate secondary)."""
        if self.stopping:
            return None
        if lane != PRIMARY and (lane in self.streams or address in {s.address for s in self.streams.values()}):
            return None
        stream = Stream(lane, address, outbox, self.clock(), CreditWindow(self.window, MAX_CREDITS, self.clock))
        # Jobs still held from the lane's earlier stream keep their leases; those
        # whose credit has not come back yet count as held in its window, and
        # their credit comes back to this stream.
        mine = [held for held in self.held.values() if held.lane == lane]
        for held in mine:
            held.stream = stream
        stream.credit.adopt(sum(1 for held in mine if not held.credited))
        open_request = work_pb2.WorkOpen(
            queue=self.queue,
            subscription=self.subscription,
            worker_id=self.worker_id,
            credits=stream.credit.take_grant(),
            batched_jobs=True,
        )
        if self.lease_ttl is not None:
            open_request.lease_ttl.CopyFrom(to_duration(self.lease_ttl))
        outbox.put_nowait(work_pb2.WorkRequest(open=open_request))
        self.streams[lane] = stream
        return stream

    def close_stream(self, stream: Stream) -> None:
        """The stream is over: unregister it; whoever awaits an answer resends the request unary."""
        if self.streams.get(stream.lane) is stream:
            del self.streams[stream.lane]
        stream.closed = True
        stream.outbox.put_nowait(None)
        pending = list(stream.pending.values())
        stream.pending.clear()
        for request in pending:
            if not request.waiter.done():
                request.waiter.set_exception(StreamClosed("casq: work stream ended"))

    def on_response(self, stream: Stream, response: work_pb2.WorkResponse, new_outbox: Callable[[], Outbox]) -> Reaction:
        """Applies one event of ``stream``; ``new_outbox`` makes the outbox of a secondary stream routing asks for."""
        reaction = Reaction()
        event = response.WhichOneof("event")
        if event == "opened":
            stream.opened = True
            if response.opened.max_credits > 0:
                stream.credit.max_outstanding = response.opened.max_credits
                self._grant(stream)
            if stream.lane == PRIMARY:
                self.failures = self.redirects = 0
            self.recheck_failures.pop(stream.address, None)
            interval = response.opened.heartbeat_interval.ToTimedelta().total_seconds()
            self.heartbeat_interval = max(0.05, interval) if interval > 0 else DEFAULT_HEARTBEAT_INTERVAL
            if not self.heartbeats_started:
                self.heartbeats_started = reaction.start_heartbeats = True
            reaction.streams = self.route(stream, response.opened.routing, new_outbox)
        elif event in ("job", "jobs"):
            for claimed in [response.job] if event == "job" else response.jobs.jobs:
                stream.credit.arrived()
                held = Held(Job(claimed), stream.lane, stream)
                self.held[held.job.receipt] = held
                if self.stopping:
                    reaction.release.append(held)
                else:
                    self.waiting.append(held)
            if not self.stopping:
                reaction.start = self.runnable()
                # A window that grew, or waited for the broker's max_credits, grants now.
                self._grant(stream)
        elif event == "leases_lost":
            self.lost(response.leases_lost.receipts)
        elif event in ("heartbeated", "acked", "nacked", "request_failed"):
            request = stream.pending.pop(response.request_id, None)
            if request is not None and not request.waiter.done():
                if event == "request_failed":
                    request.waiter.set_exception(error_from_status(response.request_failed.status))
                else:
                    request.waiter.set_result(response)
        elif event == "routing":
            reaction.streams = self.route(stream, response.routing, new_outbox)
        elif event == "draining":
            stream.draining = True
        return reaction

    def route(self, stream: Stream, routing: work_pb2.WorkRouting, new_outbox: Callable[[], Outbox]) -> list[Stream]:
        """Opens a secondary stream to every leader of a shard ``stream`` does not serve and no stream reaches."""
        stream.routing = routing
        if self.stopping or not stream.usable:
            return []
        served = set(routing.serving_shards)
        opened: list[Stream] = []
        for route in routing.shards:
            # A shard nobody leads is taken over by a broker we already reach,
            # which then announces it in a routing event of its own.
            if route.shard in served or not route.HasField("leader") or not route.leader.address:
                continue
            secondary = self.open_stream(route.leader.address, route.leader.address, new_outbox())
            if secondary is not None:
                opened.append(secondary)
        return opened

    def reroute(self, new_outbox: Callable[[], Outbox]) -> list[Stream]:
        """Applies the routing the open streams last reported once more (after a secondary stream ended).

        Routing events come only when a broker's served shards change, so a
        stream lost to a passing outage would not be reopened by one; this
        reopens it only if that routing still names the broker.
        """
        opened: list[Stream] = []
        for stream in list(self.streams.values()):
            if stream.routing is not None:
                opened += self.route(stream, stream.routing, new_outbox)
        return opened

    def send(self, stream: Stream, build: Callable[[int], work_pb2.WorkRequest], waiter: Waiter) -> Waiter | None:
        """Sends a request on ``stream`` if it is usable; returns the waiter that gets its answer (None: send it unary).

        That is ``waiter``, but for an ack (``build`` an :class:`AckOf`) that
        joins the stream's batch not sent yet: then the batch's waiter, whose
        answer holds the results of every receipt in it.
        """
        if not stream.usable:
            return None
        if isinstance(build, AckOf):
            batch = stream.open_ack
            if batch is not None and batch.add(build.receipt):
                return stream.pending[batch.request_id].waiter
            request_id = next(self._ids)
            stream.pending[request_id] = Pending(waiter, self.clock())
            stream.open_ack = AckBatch(request_id, build.receipt)
            stream.outbox.put_nowait(stream.open_ack)
            return waiter
        request_id = next(self._ids)
        stream.pending[request_id] = Pending(waiter, self.clock())
        stream.outbox.put_nowait(build(request_id))
        return waiter

    @property
    def watchdog_interval(self) -> float:
        return max(0.05, min(1.0, self.timeout / 4))

    def hung_streams(self) -> list[Stream]:
        """The streams whose broker left the open or a request unanswered for the timeout: the driver cancels them.

        A hung broker (e.g. a stopped process) keeps the connection up and never
        answers, so nothing else would end the stream: its jobs could not be
        settled or heartbeated, and no other broker would be tried. Cancelling
        it resends what was unanswered as unary calls (which move on from the
        hung broker) and reconnects (the primary stream) at the next broker.
        """
        now = self.clock()
        hung: list[Stream] = []
        for stream in self.streams.values():
            if stream.hung is not None or stream.cancel is None or stream.closed:
                continue
            waited = [] if stream.opened else [now - stream.started_at]
            waited += [now - request.sent_at for request in stream.pending.values()]
            if waited and max(waited) > self.timeout:
                what = "a request" if stream.opened else "the stream's open"
                stream.hung = StreamTimeoutError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"casq: broker {stream.address} left {what} unanswered for {self.timeout:g}s "
                    "(hung?): work stream ended, going elsewhere",
                )
                hung.append(stream)
        return hung

    # -- when a stream ends -------------------------------------------------------

    def primary_ended(self, stream: Stream, error: CasqError | None) -> Reconnect:
        """What follows the end of the primary stream (``error`` None: it ended OK unasked); raises fatal errors."""
        if error is None:
            return Reconnect(UnavailableError(grpc.StatusCode.UNAVAILABLE, "casq: work stream ended"), None, True, True)
        if error.code in FATAL_CODES:
            raise error
        if isinstance(error, RedirectError) and error.leader_address:
            self.redirects += 1
            # Follow at once; but brokers that keep redirecting (a stale view of
            # leadership, or to themselves) get the backoff so we do not spin.
            pause = error.leader_address == stream.address or self.redirects > self.brokers + 1
            return Reconnect(None, error.leader_address, False, pause)
        # A draining broker asked us to go elsewhere at once; anything else backs off.
        return Reconnect(error, None, True, not stream.draining)

    def pause_delay(self) -> float:
        """The next reconnect backoff of the primary stream."""
        delay = backoff_delay(self.failures, self.backoff_initial, self.backoff_max, self.rng)
        self.failures += 1
        return delay

    def secondary_ended(self, stream: Stream, error: CasqError | None) -> tuple[CasqError | None, float]:
        """A secondary stream has no reconnect loop: what to report, and how long to wait before reroute()."""
        failures = self.recheck_failures.get(stream.address, 0)
        self.recheck_failures[stream.address] = failures + 1
        report = error if error is not None and not isinstance(error, RedirectError) else None
        return report, backoff_delay(failures, self.backoff_initial, self.backoff_max, self.rng)

    # -- jobs -------------------------------------------------------------------

    def runnable(self) -> list[Held]:
        """The waiting jobs that may start now (within ``concurrency``), marked running."""
        start: list[Held] = []
        while not self.stopping and self.running < self.concurrency and self.waiting:
            held = self.waiting.popleft()
            held.started = held.in_handler = True
            self.running += 1
            start.append(held)
            for stream in self.streams.values():
                stream.credit.note_started(len(self.waiting))
        if not self.stopping and self.running < self.concurrency:
            # The handlers are starved: every stream's window hears of it.
            for stream in self.streams.values():
                stream.credit.note_starved()
        return start

    def handler_done(self, held: Held) -> list[Held]:
        """A handler returned or raised: its slot is free; the jobs that may start now."""
        held.in_handler = False
        self.running -= 1
        if held.abandoned:
            self.forget(held, credit=False)
            return []
        # The credit goes back now: the ack or nack rides with the next claims
        # instead of holding a prefetch slot until it is answered.
        self._return_credit(held)
        return self.runnable()

    def settle(
        self,
        held: Held,
        *,
        ack: bool,
        dead_letter: bool = False,
        reason: str = "",
        delay: float | None = None,
        release: bool = False,
    ) -> Settle | None:
        """The ack or nack of a held job, once (None: settled already, or given up).

        A lost lease does not skip the settle: the broker still applies it if
        nobody claimed the message since, which spares a redelivery; otherwise
        it answers LEASE_LOST, which the driver reports.
        """
        if held.settled or held.abandoned:
            return None
        held.settled = True
        receipts = [held.job.receipt]
        if ack:
            return Settle(
                held,
                AckOf(held.job.receipt),
                queue_service_pb2.AckRequest(queue=self.queue, subscription=self.subscription, receipts=receipts),
                None,
            )
        nack = work_pb2.WorkNack(receipts=receipts, dead_letter=dead_letter, reason=reason, release=release)
        unary = queue_service_pb2.NackRequest(
            queue=self.queue,
            subscription=self.subscription,
            receipts=receipts,
            dead_letter=dead_letter,
            reason=reason,
            release=release,
        )
        if delay is not None:
            nack.delay.CopyFrom(to_duration(delay))
            unary.delay.CopyFrom(nack.delay)
        return Settle(held, lambda rid: work_pb2.WorkRequest(request_id=rid, nack=nack), None, unary)

    def forget(self, held: Held, *, credit: bool) -> None:
        """Drops a job from the held set; with ``credit``, gives its credit back to the stream it uses."""
        if self.held.pop(held.job.receipt, None) is None:
            return
        if credit:
            self._return_credit(held)

    def _return_credit(self, held: Held) -> None:
        """Gives a job's credit back to the stream it uses, once (not while stopping)."""
        if held.credited:
            return
        held.credited = True
        stream = held.stream
        if stream is not None:
            stream.credit.returned()
            self._grant(stream)

    def _grant(self, stream: Stream) -> None:
        """Sends ``stream`` the credit its window allows now, if any (not while stopping)."""
        if self.stopping or not stream.usable:
            return
        credits = stream.credit.take_grant()
        if credits > 0:
            stream.outbox.put_nowait(work_pb2.WorkRequest(credit=work_pb2.WorkCredit(credits=credits)))

    def lost(self, receipts: Iterable[str]) -> None:
        """The broker no longer leases these to us: ``job.lost`` is set; one not started yet is dropped unsettled."""
        for receipt in receipts:
            held = self.held.get(receipt)
            if held is None or held.job._lost_set():
                continue
            held.job.lost.set()
            if not held.started:
                try:
                    self.waiting.remove(held)
                except ValueError:
                    pass
                self.forget(held, credit=True)

    # -- heartbeats -------------------------------------------------------------

    def heartbeats(self) -> list[tuple[Stream | None, Heartbeat]]:
        """The heartbeats due: every held job's receipt, on the stream it uses, in chunks."""
        groups: dict[Stream | None, list[str]] = {}
        for receipt, held in self.held.items():
            if not held.settled and not held.abandoned and not held.job._lost_set():
                groups.setdefault(held.stream, []).append(receipt)
        return [
            (stream, self._heartbeat(receipts[start : start + HEARTBEAT_CHUNK]))
            for stream, receipts in groups.items()
            for start in range(0, len(receipts), HEARTBEAT_CHUNK)
        ]

    def _heartbeat(self, receipts: list[str]) -> Heartbeat:
        return Heartbeat(
            lambda rid: work_pb2.WorkRequest(request_id=rid, heartbeat=work_pb2.WorkHeartbeat(receipts=receipts)),
            queue_service_pb2.HeartbeatRequest(
                queue=self.queue, subscription=self.subscription, worker_id=self.worker_id, receipts=receipts
            ),
        )

    def heartbeated(self, results: Iterable[message_pb2.HeartbeatResult]) -> None:
        self.lost(r.receipt for r in results if r.outcome == message_pb2.HEARTBEAT_OUTCOME_LOST)

    # -- shutdown ---------------------------------------------------------------

    def stop(self) -> list[Held]:
        """Stops taking jobs: half-closes every stream; returns the jobs received but not started (to hand back).

        Half-close first: credit cannot be taken back, so an open stream would
        keep sending jobs only for us to hand them back. The broker still
        answers what was sent before; later acks and nacks go as unary calls.
        """
        self.stopping = True
        for stream in self.streams.values():
            stream.half_close()
        waiting = list(self.waiting)
        self.waiting.clear()
        return waiting

    def abandon(self) -> list[Held]:
        """Gives up the handlers still running (after stop's deadline): they are never settled; leases expire."""
        given_up = [held for held in self.held.values() if held.in_handler and not held.abandoned]
        for held in given_up:
            held.abandoned = True
        return given_up
