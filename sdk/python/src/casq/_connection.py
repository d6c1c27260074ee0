"""What every call to a broker carries: metadata (token, trace context), TLS credentials, channel options."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

Metadata = tuple[tuple[str, str], ...]
TlsOption = bool | grpc.ChannelCredentials | None
ChannelOptions = Sequence[tuple[str, Any]]
"""grpcio channel arguments, e.g. ``[("grpc.keepalive_time_ms", 20000)]``."""


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
