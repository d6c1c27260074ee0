"""A real `casq serve` (in-memory store) for the SDK tests, started once per session."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import casq

REPO_ROOT = Path(__file__).resolve().parents[3]
LISTENING = re.compile(r"listening on (\S+)")


@pytest.fixture(scope="session")
def server_address() -> Iterator[str]:
    process = subprocess.Popen(
        ["node", "server/bin/casq.js", "serve", "--store", "memory:", "--listen", "127.0.0.1:0", "--log-level", "warn"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    found = threading.Event()
    address: list[str] = []
    output: list[str] = []

    def read() -> None:  # drain output for the server's whole life: a full pipe would block it
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            match = LISTENING.search(line)
            if match and not found.is_set():
                address.append(match.group(1))
                found.set()
        found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not found.wait(30) or not address:
            raise RuntimeError("casq serve did not start:\n" + "".join(output))
        yield address[0]
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(5)


@pytest.fixture
def client(server_address: str) -> Iterator[casq.Client]:
    with casq.Client(brokers=[server_address], timeout=10.0) as c:
        yield c
