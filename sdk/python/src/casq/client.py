"""Connection settings shared by Producer and Worker: brokers, token, TLS, retries."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc

from casq._backoff import backoff_delay
from casq.errors import CasqError, RedirectError, UnavailableError, error_from_rpc
from casq.v1 import admin_service_pb2_grpc, queue_service_pb2_grpc

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]
TlsOption = bool | grpc.ChannelCredentials | None


def build_metadata(token: str | None, traceparent: str | None, tracestate: str | None = None) -> Metadata:
    items: list[tuple[str, str]] = []
    if token:
        items.append(("authorization", f"Bearer {token}"))
    if traceparent:
        items.append(("traceparent", traceparent))
        if tracestate:
            items.append(("tracestate", tracestate))
    return tuple(items)


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
    ``grpc.ChannelCredentials``. ``timeout`` bounds each unary attempt (seconds);
    ``max_attempts`` bounds attempts across redirects and brokers.
    """

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
            raise ValueError("casq.Client needs at least one broker address")
        self.brokers = list(brokers)
        self.token = token
        self.tls = tls
        self.timeout = timeout
        self.max_attempts = max(1, max_attempts)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
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
                    grpc.secure_channel(address, creds) if creds is not None else grpc.insecure_channel(address)
                )
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

    def fail_over(self) -> str:
        """Move on to the next listed broker and return it."""
        with self._lock:
            self._current = self.brokers[self._next_index % len(self.brokers)]
            self._next_index += 1
            return self._current

    def metadata(self, traceparent: str | None = None, tracestate: str | None = None) -> Metadata:
        return build_metadata(self.token, traceparent, tracestate)

    # -- calls ------------------------------------------------------------------

    def call(self, fn: Callable[[str], T]) -> T:
        """Run ``fn(address)``, following redirects at once and failing over on outages."""
        last: CasqError | None = None
        outages = 0
        for _ in range(self.max_attempts):
            address = self.current_broker
            try:
                return fn(address)
            except grpc.RpcError as rpc_error:
                error = error_from_rpc(rpc_error)
            last = error
            if isinstance(error, RedirectError) and error.leader_address:
                self.follow_redirect(error.leader_address)
                continue
            if isinstance(error, UnavailableError):
                time.sleep(backoff_delay(outages, self.backoff_initial, self.backoff_max))
                outages += 1
                self.fail_over()
                continue
            raise error
        assert last is not None
        raise last

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
