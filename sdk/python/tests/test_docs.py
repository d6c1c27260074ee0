"""Runs the Python code blocks of docs/sdk-python.md against the test broker."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time

from brokers import REPO_ROOT

import casq
from casq.v1 import admin_service_pb2

DOC = REPO_ROOT / "docs" / "sdk-python.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def blocks(address: str) -> list[str]:
    return [code.replace("127.0.0.1:50051", address) for code in BLOCK.findall(DOC.read_text())]


def named_blocks(address: str) -> dict[str, str]:
    """The page's blocks by section, in page order: produce, work, aio work, admin."""
    found = blocks(address)
    assert len(found) == 4, "a Python block was added to or removed from the doc: give it a test"
    return dict(zip(["produce", "work", "aio", "admin"], found))


def run_block(code: str, name: str, timeout: float = 30.0) -> None:
    """Executes a block that ends by itself, in a thread so that a hang fails instead of blocking."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            exec(compile(code, f"{DOC}:{name}", "exec"), {})
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            errors.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the doc's {name} example did not finish"
    if errors:
        raise errors[0]


def subscription(client: casq.Client, queue: str, name: str = "default") -> admin_service_pb2.SubscriptionStats:
    response = client.admin_stub().GetQueue(admin_service_pb2.GetQueueRequest(queue=queue), timeout=10)
    return [s for s in response.subscriptions if s.subscription == name][0]


def test_doc_examples_run(server_address: str, client: casq.Client) -> None:
    examples = named_blocks(server_address)
    run_block(examples["produce"], "produce")

    # The work example installs signal handlers, which only the main thread may: run it as a process.
    process = subprocess.Popen(
        [sys.executable, "-c", examples["work"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:

        def ready() -> int:
            default = subscription(client, "emails")
            return int(default.ready + default.in_flight)

        deadline = time.monotonic() + 15
        while ready() > 0:  # the delayed message stays for later
            assert process.poll() is None, f"the doc's worker exited: {process.communicate()}"
            assert time.monotonic() < deadline, "the doc's worker did not drain the queue"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)  # the documented handler drains and run() returns
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert "Traceback" not in err
        assert "mail to ann@example.com" in out
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_doc_asyncio_worker_runs(server_address: str, client: casq.Client) -> None:
    code = named_blocks(server_address)["aio"]
    run_block(code, "aio")
    thumbnails = subscription(client, "thumbnails")
    assert thumbnails.ready + thumbnails.in_flight + thumbnails.delayed == 0  # handled and acked


def test_doc_admin_runs(server_address: str, client: casq.Client) -> None:
    run_block(named_blocks(server_address)["admin"], "admin")
    response = client.admin_stub().GetQueue(admin_service_pb2.GetQueueRequest(queue="reports"), timeout=10)
    assert response.shard_count == 2 and response.config.max_attempts == 5
    assert [s.subscription for s in response.subscriptions] == ["audit", "default"]
