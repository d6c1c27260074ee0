"""What every call to a broker carries: metadata (token, trace context), TLS credentials, channel options."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

Metadata = tuple[tuple[str, str], ...]
TlsOption = bool | grpc.ChannelCredentials | None
ChannelOptions = Sequence[tuple[str, Any]]
"""grpcio channel arguments, e.g. ``[("grpc.keepalive_time_ms", 20000)]``."""

DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    # HTTP/2 keepalive pings, also on an idle connection: a Work stream to a
    # frozen broker (no job held, so no request of ours ever times out) is
    # given up after ~20 s and the worker moves to the broker that took over.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Recent gRPC core (grpcio 1.85 here) times a keepalive ping out by this
    # argument (default 60 s), not by keepalive_timeout_ms alone.
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # gRPC core stops pinging after 2 pings without data by default; an idle
    # Work stream sends no data for as long as there is no job.
    ("grpc.http2.max_pings_without_data", 0),
)
"""Channel arguments every client sets unless the user's ``options`` name the same key."""


def channel_options(user: ChannelOptions) -> list[tuple[str, Any]]:
    """The user's channel arguments, preceded by the defaults they do not override."""
    named = {key for key, _ in user}
    return [option for option in DEFAULT_CHANNEL_OPTIONS if option[0] not in named] + list(user)


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
