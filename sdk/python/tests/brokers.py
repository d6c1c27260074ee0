"""Real `casq serve` processes for the Python SDK tests: start one, read the
address it prints, drain its output, stop it gracefully or kill it."""

from __future__ import annotations

import os
import queue as queue_mod
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
# The casq launcher: CASQ_TEST_BIN when set (`npm test` installs the build once,
# see test/support/install-built-casq.ts), else the checkout's (TypeScript through tsx).
CASQ_BIN = os.environ.get("CASQ_TEST_BIN") or str(REPO_ROOT / "server" / "bin" / "casq.js")
LISTENING = re.compile(r"listening on (\S+)")
BROKER_START_TIMEOUT = 30.0


class BrokerError(Exception):
    """A broker process did not start or stop as it should."""

class Lines:
    """Drains a child's stdout in a thread (a full pipe would block it) into a queue of lines."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: queue_mod.Queue[str | None] = queue_mod.Queue()
        self.seen: list[str] = []
        self._process = process
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.seen.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next(self, deadline: float) -> str | None:
        """The next line, None at end of output; raises TimeoutError past ``deadline``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            return self.lines.get(timeout=remaining)
        except queue_mod.Empty:
            raise TimeoutError from None


@dataclass
class Broker:
    """One `casq serve` process and its output."""

    process: subprocess.Popen[str]
    output: Lines
    address: str = ""

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def terminate(self, timeout: float) -> None:
        """Graceful stop (SIGTERM): the broker releases its shard leases and must exit with status 0."""
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BrokerError(f"broker {self.address} did not exit within {timeout:g}s of SIGTERM") from None
        if status != 0:
            raise BrokerError(f"broker {self.address} exited with status {status} after SIGTERM")


def start_casq_serve(store: str, listen: str = "127.0.0.1:0", *args: str) -> Broker:
    """Starts `casq serve --store STORE --listen LISTEN ARGS...` and waits until it prints its address."""
    process = subprocess.Popen(
        ["node", CASQ_BIN, "serve", "--store", store, "--listen", listen, "--log-level", "warn", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    broker = Broker(process, Lines(process))
    deadline = time.monotonic() + BROKER_START_TIMEOUT
    try:
        while True:
            line = broker.output.next(deadline)
            if line is None:
                raise BrokerError("casq serve exited before listening:\n" + "\n".join(broker.output.seen))
            match = LISTENING.search(line)
            if match:
                broker.address = match.group(1)
                return broker
    except BaseException:
        broker.kill()
        raise


def start_file_broker(store: Path, listen: str = "127.0.0.1:0") -> Broker:
    """`casq serve` on a file store with a 2 s leader lease, so shards move soon after a broker goes."""
    return start_casq_serve(f"file:{store}", listen, "--leader-lease", "2s")
