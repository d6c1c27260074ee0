"""The asyncio API of casq (grpc.aio): :class:`Client` and :class:`Producer`."""

from casq.aio.client import Client
from casq.aio.producer import Producer

__all__ = ["Client", "Producer"]
