"""Runs the Python code blocks of docs/sdk-python.md against the test broker."""

from __future__ import annotations

import re
import threading
import time

from conftest import REPO_ROOT

import casq
from casq.v1 import admin_service_pb2

DOC = REPO_ROOT / "docs" / "sdk-python.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def blocks(address: str) -> list[str]:
    return [code.replace("127.0.0.1:50051", address) for code in BLOCK.findall(DOC.read_text())]


def test_doc_examples_run(server_address: str, client: casq.Client) -> None:
    produce, work = blocks(server_address)
    exec(compile(produce, f"{DOC}:produce", "exec"), {})

    namespace: dict[str, object] = {}
    thread = threading.Thread(target=exec, args=(compile(work, f"{DOC}:work", "exec"), namespace), daemon=True)
    thread.start()

    def ready() -> int:
        request = admin_service_pb2.GetQueueRequest(queue="emails")
        response = client.admin_stub().GetQueue(request, timeout=10)
        default = [s for s in response.subscriptions if s.subscription == "default"][0]
        return int(default.ready + default.in_flight)

    deadline = time.monotonic() + 15
    while ready() > 0 or "worker" not in namespace:  # the delayed message stays for later
        assert time.monotonic() < deadline, "the doc's worker did not drain the queue"
        time.sleep(0.05)
    worker = namespace["worker"]
    assert isinstance(worker, casq.Worker)
    worker.stop(5)
    thread.join(5)
    assert not thread.is_alive()
