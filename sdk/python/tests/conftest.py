"""A real `casq serve` (in-memory store) for the SDK tests, started once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from brokers import BrokerError, start_casq_serve

import casq


@pytest.fixture(scope="session")
def server_address() -> Iterator[str]:
    broker = start_casq_serve("memory:")
    try:
        yield broker.address
    finally:
        try:
            broker.terminate(10)
        except BrokerError:
            pass  # killed after the timeout; the tests are over either way


@pytest.fixture
def client(server_address: str) -> Iterator[casq.Client]:
    with casq.Client(brokers=[server_address], timeout=10.0) as c:
        yield c
