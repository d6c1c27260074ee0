"""Connection settings for the asyncio API: brokers, token, TLS, retries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TypeVar

import grpc
from grpc import aio

from casq._tracing import trace_metadata
from casq.client import ChannelOptions, Metadata, RetryBudget, TlsOption, build_metadata, channel_credentials, next_broker
from casq.errors import error_from_rpc
from casq.v1 import admin_service_pb2_grpc, queue_service_pb2_grpc

T = TypeVar("T")


class Client:
    """Like :class:`casq.Client` (same arguments and retries), over ``grpc.aio`` channels.

    ``interceptors`` are ``grpc.aio`` client interceptors
    (``grpc.aio.UnaryUnaryClientInterceptor``,
    ``grpc.aio.StreamStreamClientInterceptor``, ...), passed to every channel.
    Use ``async with`` or ``await close()``.
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
        interceptors: Sequence[aio.ClientInterceptor] = (),
    ) -> None:
        if not brokers:
            raise ValueError("casq.aio.Client needs at least one broker address")
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
        self._channels: dict[str, aio.Channel] = {}
        self.current_broker = self.brokers[0]
        self._next_index = 1

    def channel(self, address: str) -> aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            creds = channel_credentials(self.tls)
            channel = (
                aio.secure_channel(address, creds, options=self.options, interceptors=self.interceptors)
                if creds is not None
                else aio.insecure_channel(address, options=self.options, interceptors=self.interceptors)
            )
            self._channels[address] = channel
        return channel

    def queue_stub(self, address: str) -> queue_service_pb2_grpc.QueueServiceAsyncStub:
        return queue_service_pb2_grpc.QueueServiceStub(self.channel(address))

    def admin_stub(self, address: str | None = None) -> admin_service_pb2_grpc.AdminServiceAsyncStub:
        return admin_service_pb2_grpc.AdminServiceStub(self.channel(address or self.current_broker))

    def metadata(self, traceparent: str | None = None, tracestate: str | None = None) -> Metadata:
        """Call metadata: the token, and the explicit trace context if given, else the active span's."""
        traceparent, tracestate = trace_metadata(traceparent, tracestate)
        return build_metadata(self.token, traceparent, tracestate)

    def fail_over(self, failed: str | None = None, avoid: Collection[str] = ()) -> str:
        """Move on to the next listed broker (other than ``failed`` and, if one is left, ``avoid``) and return it."""
        self.current_broker = next_broker(self.brokers, self._next_index, failed, avoid)
        self._next_index = self.brokers.index(self.current_broker) + 1
        return self.current_broker

    async def call(
        self, fn: Callable[[str], Awaitable[T]], *, start: str | None = None, deadline: float | None = None
    ) -> T:
        """Await ``fn(address)``, following redirects and failing over on outages (see :class:`casq.Client`).

        ``start`` and ``deadline`` as for :meth:`casq.Client.call`.
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
                await asyncio.sleep(delay)
            # Per call, not the shared current broker: see casq.Client.call.
            if target is None:
                address = self.fail_over(address, retry.failed)
            else:
                if target != address:
                    self.current_broker = target
                address = target

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
