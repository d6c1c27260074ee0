"""casq: a durable job queue and pub/sub log whose whole state lives in object storage.

The synchronous SDK: :class:`Client`, :class:`Producer`, :class:`Worker`,
:class:`Admin`; the
asyncio one is :mod:`casq.aio`. The generated protobuf messages and gRPC stubs
of the API are in :mod:`casq.v1`.
"""

from casq._messages import EnqueueResult, NewMessage
from casq.admin import Admin
from casq.client import Client
from casq.errors import (
    AlreadyExistsError,
    BatchRedirectError,
    CasqError,
    DeadLetter,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    RedirectError,
    StreamTimeoutError,
    UnavailableError,
)
from casq.job import Job
from casq.producer import Producer
from casq.worker import Worker

__all__ = [
    "AlreadyExistsError",
    "BatchRedirectError",
    "Admin",
    "CasqError",
    "Client",
    "DeadLetter",
    "EnqueueResult",
    "InvalidArgumentError",
    "Job",
    "LeaseLostError",
    "NewMessage",
    "NotFoundError",
    "Producer",
    "RedirectError",
    "StreamTimeoutError",
    "UnavailableError",
    "Worker",
]
