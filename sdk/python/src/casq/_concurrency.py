"""What the threaded flavour does where the asyncio one awaits: sleeping, locking, channels, parallel calls.

The generated modules (client.py, producer.py, admin.py) import these by a
relative import; their asyncio sources get the same names from
casq/aio/_concurrency.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from casq._connection import ChannelOptions, Metadata

T = TypeVar("T")
S = TypeVar("S")

Channel = grpc.Channel
Interceptor = (
    grpc.UnaryUnaryClientInterceptor
    | grpc.UnaryStreamClientInterceptor
    | grpc.StreamUnaryClientInterceptor
    | grpc.StreamStreamClientInterceptor
)
Attempt = Callable[[str], T]
"""One attempt of a call at a broker address."""
StubCall = Callable[[S, Metadata], T]
"""One RPC on a stub with the call's metadata."""

sleep = time.sleep


def new_lock() -> threading.Lock:
    """Guards a Client's channels and current broker: producers call from several threads."""
    return threading.Lock()


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: ChannelOptions,
    interceptors: Sequence[Interceptor],
) -> grpc.Channel:
    channel = (
        grpc.secure_channel(address, credentials, options=options)
        if credentials is not None
        else grpc.insecure_channel(address, options=options)
    )
    if interceptors:
        # Closing the intercepted channel closes the one it wraps.
        channel = grpc.intercept_channel(channel, *interceptors)
    return channel


def run_parallel(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Runs the calls at once (one thread each) and returns their results in order; raises the first failure.

    Returns only once every call is over, also when one failed: nothing runs
    on behalf of the caller afterwards.
    """
    if len(calls) == 1:
        return [calls[0]()]
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="casq-parallel") as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def new_future() -> Future[Any]:
    """A future for one caller of a merged enqueue (set from another thread)."""
    return Future()


def wait_future(future: Future[Any]) -> Any:
    """Blocks for the future's result (raises its exception)."""
    return future.result()


def detached(call: Callable[[], T]) -> T:
    """Runs ``call`` (a thread is not cancelled: as it is)."""
    return call()
