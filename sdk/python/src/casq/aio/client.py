"""Connection settings shared by Producer, Worker and Admin: brokers, token, TLS, retries.

The asyncio casq/aio/client.py is the source of the threaded casq/client.py, which
sdk/python/scripts/generate-sync.py writes from it with unasync: edit that one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TypeVar

import grpc

from casq._connection import (
    ChannelOptions,
    Metadata,
    TlsOption,
    build_metadata,
    channel_credentials,
    channel_options,
)
from casq._retry import RetryBudget, attempt_timeout, is_outage, next_broker
from casq._tracing import trace_metadata
from casq.errors import error_from_rpc
from casq.v1 import admin_service_pb2_grpc, queue_service_pb2_grpc

from ._concurrency import Attempt, Channel, Interceptor, new_lock, open_channel, sleep

T = TypeVar("T")

# Shared with the other modules of the SDK, which import them from here.
__all__ = [
    "ChannelOptions",
    "Client",
    "Interceptor",
    "Metadata",
    "RetryBudget",
    "TlsOption",
    "attempt_timeout",
    "build_metadata",
    "channel_credentials",
    "is_outage",
    "next_broker",
]


class Client:
    """Where the brokers are and how to talk to them.

    ``casq.Client`` is synchronous (grpcio), ``casq.aio.Client`` the same over
    ``grpc.aio`` channels (use ``async with`` or ``await close()``).

    ``brokers`` are ``host:port`` addresses, any of them first. ``token`` is sent
    as ``authorization: Bearer <token>``; ``tls`` is ``True`` (system roots) or a
    ``grpc.ChannelCredentials``. ``options`` are grpcio channel arguments
    and ``interceptors`` client interceptors for every channel the client
    opens: your own metrics, auth, proxy or keepalive settings (grpcio ones,
    applied with ``grpc.intercept_channel`` in order, for ``casq.Client``;
    ``grpc.aio.UnaryUnaryClientInterceptor``, ``grpc.aio.StreamStreamClientInterceptor``,
    ... for ``casq.aio.Client``). ``timeout`` bounds each unary attempt (seconds):
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
            raise ValueError(f"{type(self).__module__.removesuffix('.client')}.Client needs at least one broker address")
        self.options = channel_options(options)
        self.interceptors = list(interceptors)
        self.brokers = list(brokers)
        self.token = token
        self.tls = tls
        self.timeout = timeout
        self.max_attempts = None if max_attempts is None else max(1, max_attempts)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.retry_timeout = retry_timeout
        self._lock = new_lock()
        self._channels: dict[str, Channel] = {}
        self._current = self.brokers[0]
        self._next_index = 1

    # -- channels and routing -------------------------------------------------

    def channel(self, address: str) -> Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = open_channel(address, channel_credentials(self.tls), self.options, self.interceptors)
                self._channels[address] = channel
            return channel

    def queue_stub(self, address: str) -> queue_service_pb2_grpc.QueueServiceAsyncStub:
        return queue_service_pb2_grpc.QueueServiceStub(self.channel(address))

    def admin_stub(self, address: str | None = None) -> admin_service_pb2_grpc.AdminServiceAsyncStub:
        return admin_service_pb2_grpc.AdminServiceStub(self.channel(address or self.current_broker))

    @property
    def current_broker(self) -> str:
        """The broker calls start at: the last one a redirect named or the client failed over to."""
        with self._lock:
            return self._current

    @current_broker.setter
    def current_broker(self, address: str) -> None:
        self.follow_redirect(address)

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

    async def call(self, fn: Attempt[T], *, start: str | None = None, deadline: float | None = None) -> T:
        """Run ``fn(address)``, following redirects and failing over on outages (see the class doc).

        ``start`` is the broker of the first attempt (default: the current
        one); ``deadline`` (``time.monotonic()``) replaces ``retry_timeout``
        as the end of retrying.
        """
        retry = RetryBudget(self, deadline)
        address = start or self.current_broker
        while True:
            try:
                return await fn(address)
            except grpc.RpcError as rpc_error:
                error = error_from_rpc(rpc_error)
            delay, target = retry.next_attempt(error, address)  # raises ``error`` when it is final
            if delay > 0:
                await sleep(delay)
            # The next address is kept per call, not re-read from the shared
            # current broker: calls in parallel (a split batch's sub-batches)
            # each follow their own redirects.
            if target is None:
                address = self.fail_over(address, retry.failed)
            else:
                if target != address:
                    self.follow_redirect(target)
                address = target

    async def close(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
