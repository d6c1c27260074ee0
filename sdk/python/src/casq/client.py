"""Connection settings shared by Producer and Worker: brokers, token, TLS, retries."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from casq._backoff import backoff_delay
from casq._tracing import trace_metadata
from casq.errors import CasqError, RedirectError, UnavailableError, error_from_rpc
from casq.v1 import admin_service_pb2_grpc, queue_service_pb2_grpc

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]
TlsOption = bool | grpc.ChannelCredentials | None
ChannelOptions = Sequence[tuple[str, Any]]
"""grpcio channel arguments, e.g. ``[("grpc.keepalive_time_ms", 20000)]``."""
Interceptor = (
    grpc.UnaryUnaryClientInterceptor
    | grpc.UnaryStreamClientInterceptor
    | grpc.StreamUnaryClientInterceptor
    | grpc.StreamStreamClientInterceptor
)


def build_metadata(token: str | None, traceparent: str | None, tracestate: str | None = None) -> Metadata:
    items: list[tuple[str, str]] = []
    if token:
        items.append(("authorization", f"Bearer {token}"))
    if traceparent:
        items.append(("traceparent", traceparent))
        if tracestate:
            items.append(("tracestate", tracestate))
    return tuple(items)


def next_broker(brokers: Sequence[str], index: int, failed: str | None, avoid: Collection[str] = ()) -> str:
    """The broker at ``index`` (cyclically), skipping ``failed``, and ``avoid`` while another one is left."""
    for skip in ({failed, *avoid}, {failed}):
        for step in range(len(brokers)):
            candidate = brokers[(index + step) % len(brokers)]
            if candidate not in skip:
                return candidate
    return brokers[index % len(brokers)]


def is_outage(error: CasqError) -> bool:
    """A failure another attempt, possibly at another broker, may not meet.

    UNAVAILABLE without a redirect, and DEADLINE_EXCEEDED: the attempt's own
    deadline passed, so the broker is hung or too slow (a SIGSTOPped process
    still accepts connections, so this is how a hung broker shows). The
    attempt may have been applied, which makes the retry safe only for
    idempotent calls: acks, nacks, heartbeats, admin changes and enqueues
    with dedup ids (the producers give every message one by default).
    """
    return isinstance(error, UnavailableError) or error.code == grpc.StatusCode.DEADLINE_EXCEEDED


class RetryBudget:
    """Which failures of one unary call to retry, where, and how long to wait first.

    Redirects and outages (UNAVAILABLE, or DEADLINE_EXCEEDED for an attempt
    that ran out of its own ``timeout``) are retried until ``retry_timeout``
    or ``max_attempts`` runs out. An outage moves the call on to the next
    listed broker after a backoff delay, and the broker that failed is
    remembered for the rest of the call: a redirect to it (a dead or hung
    leader whose leader lease has not run out) is not followed; the call
    backs off and asks the redirecting broker again, which takes the shard
    over once that lease ends. Any other redirect is followed at once,
    unless the previous failure was one too (two brokers pointing at each
    other while leadership moves): that one, like every outage, waits a
    backoff delay. A call counted by attempts alone was too short to
    outlive a dead leader's leader lease, since every redirect back to it
    used up an attempt.
    """

    def __init__(self, client: _ClientSettings, deadline: float | None = None) -> None:
        self.client = client
        # A given deadline (time.monotonic()) is shared by the calls of one
        # split Enqueue batch: the whole split retries no longer than one call.
        self.deadline = time.monotonic() + client.retry_timeout if deadline is None else deadline
        self.attempts = 0
        self.backoffs = 0
        self.last_was_redirect = False
        # Brokers that failed (an outage) in this call.
        self.failed: set[str] = set()

    def next_attempt(self, error: CasqError, address: str) -> tuple[float, str | None]:
        """Seconds to wait and where to send the next attempt (None: fail over); raises ``error`` when it is final."""
        self.attempts += 1
        target = _redirect_target(error)
        if not target and not is_outage(error):
            raise error
        if self.client.max_attempts is not None and self.attempts >= self.client.max_attempts:
            raise error
        if not target:
            self.failed.add(address)
        avoided = bool(target) and target in self.failed
        delay = 0.0
        if not target or avoided or self.last_was_redirect or target == address:
            delay = backoff_delay(self.backoffs, self.client.backoff_initial, self.client.backoff_max)
            self.backoffs += 1
        self.last_was_redirect = bool(target)
        if time.monotonic() + delay > self.deadline:
            raise error
        if avoided:
            return delay, address  # ask the redirecting broker again
        return delay, target or None


def attempt_timeout(timeout: float, retry_deadline: float) -> float:
    """Seconds left for one attempt of a call whose retries stop at ``retry_deadline``.

    A call may start its last retry just before the retry deadline and give
    it the whole ``timeout``, so a call lasts at most ``retry_deadline +
    timeout``; attempts made later within the same call (the sub-batches of a
    split Enqueue batch) get what is left of that, so splitting never makes a
    call longer than an unsplit one could have been. Raises DEADLINE_EXCEEDED
    when nothing is left.
    """
    left = min(timeout, retry_deadline + timeout - time.monotonic())
    if left <= 0:
        raise CasqError(grpc.StatusCode.DEADLINE_EXCEEDED, "the call ran out of time (retry_timeout + timeout)")
    return left


def _redirect_target(error: CasqError) -> str:
    """The leader address a redirect points at ("" for other errors)."""
    return error.leader_address if isinstance(error, RedirectError) else ""


class _ClientSettings(Protocol):
    max_attempts: int | None
    backoff_initial: float
    backoff_max: float
    retry_timeout: float


def channel_credentials(tls: TlsOption) -> grpc.ChannelCredentials | None:
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    return tls


class Client:
    """Where the brokers are and how to talk to them (synchronous, grpcio).

    ``brokers`` are ``host:port`` addresses, any of them first. ``token`` is sent
    as ``authorization: Bearer <token>``; ``tls`` is ``True`` (system roots) or a
    ``grpc.ChannelCredentials``. ``options`` are grpcio channel arguments
    and ``interceptors`` grpcio client interceptors (applied with
    ``grpc.intercept_channel``, in order) for every channel the client opens:
    your own metrics, auth, proxy or keepalive settings. ``timeout`` bounds
    each unary attempt (seconds):
    an attempt that runs out of it (a hung broker) counts as an outage, so the
    call moves on to the next broker, distinct from ``retry_timeout``, the
    budget of the whole call.

    A unary call is retried, following leader redirects and failing over to
    the next broker with backoff on outages, until it succeeds, fails with an
    error retrying cannot fix, ``retry_timeout`` seconds have passed (long
    enough for a dead leader's shards to move to another broker), or
    ``max_attempts`` attempts were made (``None``: no count limit).
    """

    def __init__(
        self,
        brokers: Sequence[str],
        token: str | None = None,
        tls: TlsOption = None,
        timeout: float = 30.0,
        *,
        max_attempts: int | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        retry_timeout: float = 30.0,
        options: ChannelOptions = (),
        interceptors: Sequence[Interceptor] = (),
    ) -> None:
        if not brokers:
            raise ValueError("casq.Client needs at least one broker address")
        self.options = list(options)
        self.interceptors = list(interceptors)
        self.brokers = list(brokers)
        self.token = token
        self.tls = tls
        self.timeout = timeout
        self.max_attempts = None if max_attempts is None else max(1, max_attempts)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.retry_timeout = retry_timeout
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._current = self.brokers[0]
        self._next_index = 1

    # -- channels and routing -------------------------------------------------

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                creds = channel_credentials(self.tls)
                channel = (
                    grpc.secure_channel(address, creds, options=self.options)
                    if creds is not None
                    else grpc.insecure_channel(address, options=self.options)
                )
                if self.interceptors:
                    # Closing the intercepted channel closes the one it wraps.
                    channel = grpc.intercept_channel(channel, *self.interceptors)
                self._channels[address] = channel
            return channel

    def queue_stub(self, address: str) -> queue_service_pb2_grpc.QueueServiceStub:
        return queue_service_pb2_grpc.QueueServiceStub(self.channel(address))

    def admin_stub(self, address: str | None = None) -> admin_service_pb2_grpc.AdminServiceStub:
        return admin_service_pb2_grpc.AdminServiceStub(self.channel(address or self.current_broker))

    @property
    def current_broker(self) -> str:
        with self._lock:
            return self._current

    def follow_redirect(self, address: str) -> None:
        with self._lock:
            self._current = address

    def fail_over(self, failed: str | None = None, avoid: Collection[str] = ()) -> str:
        """Move on to the next listed broker (other than ``failed`` and, if one is left, ``avoid``) and return it."""
        with self._lock:
            self._current = next_broker(self.brokers, self._next_index, failed, avoid)
            self._next_index = self.brokers.index(self._current) + 1
            return self._current

    def metadata(self, traceparent: str | None = None, tracestate: str | None = None) -> Metadata:
        """Call metadata: the token, and the explicit trace context if given, else the active span's."""
        traceparent, tracestate = trace_metadata(traceparent, tracestate)
        return build_metadata(self.token, traceparent, tracestate)

    # -- calls ------------------------------------------------------------------

    def call(self, fn: Callable[[str], T], *, start: str | None = None, deadline: float | None = None) -> T:
        """Run ``fn(address)``, following redirects and failing over on outages (see the class doc).

        ``start`` is the broker of the first attempt (default: the current
        one); ``deadline`` (``time.monotonic()``) replaces ``retry_timeout``
        as the end of retrying.
        """
        retry = RetryBudget(self, deadline)
        address = start or self.current_broker
        while True:
            try:
                return fn(address)
            except grpc.RpcError as rpc_error:
                error = error_from_rpc(rpc_error)
            delay, target = retry.next_attempt(error, address)  # raises ``error`` when it is final
            if delay > 0:
                time.sleep(delay)
            # The next address is kept per call, not re-read from the shared
            # current broker: calls in parallel (a split batch's sub-batches)
            # each follow their own redirects.
            if target is None:
                address = self.fail_over(address, retry.failed)
            else:
                if target != address:
                    self.follow_redirect(target)
                address = target

    def close(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
