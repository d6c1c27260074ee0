"""The asyncio API of casq (grpc.aio): :class:`Client`, :class:`Producer`, :class:`Worker` and :class:`Admin`."""

from casq.aio.admin import Admin
from casq.aio.client import Client
from casq.aio.producer import Producer
from casq.aio.worker import Worker

__all__ = ["Admin", "Client", "Producer", "Worker"]
