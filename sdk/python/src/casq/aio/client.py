"""Connection settings for the asyncio API: brokers, token, TLS, retries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc
from grpc import aio

from casq._backoff import backoff_delay
from casq.client import Metadata, TlsOption, build_metadata, channel_credentials
from casq.errors import CasqError, RedirectError, UnavailableError, error_from_rpc
from casq.v1 import admin_service_pb2_grpc, queue_service_pb2_grpc

T = TypeVar("T")


class Client:
    """Like :class:`casq.Client`, over ``grpc.aio`` channels. Use ``async with`` or ``await close()``."""

    def __init__(
        self,
        brokers: Sequence[str],
        token: str | None = None,
        tls: TlsOption = None,
        timeout: float = 30.0,
        *,
        max_attempts: int = 8,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        if not brokers:
            raise ValueError("casq.aio.Client needs at least one broker address")
        self.brokers = list(brokers)
        self.token = token
        self.tls = tls
        self.timeout = timeout
        self.max_attempts = max(1, max_attempts)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._channels: dict[str, aio.Channel] = {}
        self.current_broker = self.brokers[0]
        self._next_index = 1

    def channel(self, address: str) -> aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            creds = channel_credentials(self.tls)
            channel = aio.secure_channel(address, creds) if creds is not None else aio.insecure_channel(address)
            self._channels[address] = channel
        return channel

    def queue_stub(self, address: str) -> queue_service_pb2_grpc.QueueServiceAsyncStub:
        return queue_service_pb2_grpc.QueueServiceStub(self.channel(address))

    def admin_stub(self, address: str | None = None) -> admin_service_pb2_grpc.AdminServiceAsyncStub:
        return admin_service_pb2_grpc.AdminServiceStub(self.channel(address or self.current_broker))

    def metadata(self, traceparent: str | None = None, tracestate: str | None = None) -> Metadata:
        return build_metadata(self.token, traceparent, tracestate)

    def fail_over(self) -> str:
        self.current_broker = self.brokers[self._next_index % len(self.brokers)]
        self._next_index += 1
        return self.current_broker

    async def call(self, fn: Callable[[str], Awaitable[T]]) -> T:
        """Await ``fn(address)``, following redirects at once and failing over on outages."""
        last: CasqError | None = None
        outages = 0
        for _ in range(self.max_attempts):
            try:
                return await fn(self.current_broker)
            except grpc.RpcError as rpc_error:
                error = error_from_rpc(rpc_error)
            last = error
            if isinstance(error, RedirectError) and error.leader_address:
                self.current_broker = error.leader_address
                continue
            if isinstance(error, UnavailableError):
                await asyncio.sleep(backoff_delay(outages, self.backoff_initial, self.backoff_max))
                outages += 1
                self.fail_over()
                continue
            raise error
        assert last is not None
        raise last

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
