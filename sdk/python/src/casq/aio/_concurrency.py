"""What the asyncio flavour awaits where the threaded one blocks: sleeping, locking, channels, parallel calls.

The asyncio sources of casq/client.py, producer.py and admin.py (this
folder's client.py, producer.py, admin.py) import these by a relative import;
the generated threaded modules get the same names from casq/_concurrency.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc import aio

from casq._connection import ChannelOptions, Metadata

T = TypeVar("T")
S = TypeVar("S")

Channel = aio.Channel
Interceptor = aio.ClientInterceptor
Attempt = Callable[[str], Awaitable[T]]
"""One attempt of a call at a broker address."""
StubCall = Callable[[S, Metadata], Awaitable[T]]
"""One RPC on a stub with the call's metadata."""

sleep = asyncio.sleep


def new_lock() -> contextlib.nullcontext[None]:
    """No lock: one event loop thread, and nothing awaits while holding it."""
    return contextlib.nullcontext()


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: ChannelOptions,
    interceptors: Sequence[Interceptor],
) -> aio.Channel:
    if credentials is not None:
        return aio.secure_channel(address, credentials, options=options, interceptors=interceptors)
    return aio.insecure_channel(address, options=options, interceptors=interceptors)


async def run_parallel(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Runs the calls concurrently and returns their results in order; raises the first failure.

    Returns only once every call is over, also when one failed: nothing runs
    on behalf of the caller afterwards. Cancelling it cancels them all.
    """
    outcomes = await asyncio.gather(*(call() for call in calls), return_exceptions=True)
    results: list[T] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        results.append(outcome)
    return results


def new_future() -> asyncio.Future[Any]:
    """A future of the running loop, for one caller of a merged enqueue."""
    return asyncio.get_running_loop().create_future()


async def wait_future(future: asyncio.Future[Any]) -> Any:
    """The future's result (raises its exception)."""
    return await future


async def detached(call: Callable[[], Awaitable[T]]) -> T:
    """Runs ``call`` to its end even if the caller is cancelled (it then raises CancelledError at once)."""
    return await asyncio.shield(asyncio.ensure_future(call()))
