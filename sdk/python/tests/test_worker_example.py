"""sdk/python/examples/worker.py drains on SIGTERM and Ctrl-C: the running job finishes and is acked, exit 0, no traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from brokers import REPO_ROOT

import casq
from casq.v1 import admin_service_pb2

EXAMPLE = REPO_ROOT / "sdk" / "python" / "examples" / "worker.py"


def unsettled(client: casq.Client, queue: str) -> int:
    response = client.admin_stub().GetQueue(admin_service_pb2.GetQueueRequest(queue=queue), timeout=10)
    return int(response.totals.depth)


def read_until(process: subprocess.Popen[str], prefix: str, timeout: float = 30.0) -> str:
    """The first stdout line starting with ``prefix`` (the example flushes every line)."""
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith(prefix):
            return line.strip()
        if line == "" and process.poll() is not None:
            break
    raise AssertionError(f"no line starting with {prefix!r} before the timeout or the exit")


@pytest.fixture
def queue(client: casq.Client) -> Iterator[str]:
    name = f"example-{uuid.uuid4().hex[:8]}"
    client.admin_stub().CreateQueue(admin_service_pb2.CreateQueueRequest(queue=name), timeout=10)
    yield name


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_job_runs_drains_acks_and_exits_0(
    server_address: str, client: casq.Client, queue: str, sig: signal.Signals
) -> None:
    casq.Producer(client).enqueue(queue, "hello")
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--brokers", server_address, "--queue", queue, "--job-seconds", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = read_until(process, "started ")
        process.send_signal(sig)  # the job is still running (it takes 2 s)
        job_id = started.split()[1]
        assert read_until(process, "done ") == f"done {job_id} hello"
        assert read_until(process, "stopped") == "stopped"
        assert process.wait(30) == 0
        stderr = process.stderr.read() if process.stderr else ""
        assert "Traceback" not in stderr
        assert f"{sig.name}: draining" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert unsettled(client, queue) == 0  # acked, not left to a lease expiry
