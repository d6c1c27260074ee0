"""The Python chaos client: a producer or a worker on the casq SDK (sync),
configured with every broker address, writing what it was told to its
history (format in ``../history.ts``). Same behaviour as ``ts-client.ts``.

SIGTERM stops either gracefully and writes a ``stop`` record.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import casq
from casq import job as job_module


LOST = "chaos: lease lost"
NACK = "chaos: nack"
NACK_SHARE = 0.03  # handlers that fail on purpose, so nacks and their backoff are exercised too


def now_ms() -> int:
    return int(time.time() * 1000)


class History:
    """Appends one JSON record per line with one write call (a kill cannot tear two)."""

    def __init__(self, path: str, proc: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.proc = proc
        self.lock = threading.Lock()

    def record(self, **fields: Any) -> None:
        line = json.dumps({"t": now_ms(), "proc": self.proc, **fields}) + "\n"
        with self.lock:
            os.write(self.fd, line.encode())


def capture_lease_deadlines() -> None:
    """Keeps the claim's lease deadline on each Job when this SDK's Job has none of its own."""
    original = job_module.Job.__init__

    def init(self: Any, claimed: Any) -> None:
        original(self, claimed)
        if not hasattr(self, "lease_deadline") and claimed.HasField("lease_deadline"):
            self._chaos_lease_deadline = claimed.lease_deadline.ToMilliseconds()
        if not hasattr(self, "dedup_id"):
            self._chaos_dedup_id = claimed.message.dedup_id

    job_module.Job.__init__ = init  # type: ignore[method-assign]


def lease_deadline_ms(job: Any) -> int | None:
    deadline = getattr(job, "lease_deadline", None)
    if deadline is not None:
        if hasattr(deadline, "timestamp"):
            return int(deadline.timestamp() * 1000)
        return int(deadline * 1000) if deadline < 1e11 else int(deadline)
    return getattr(job, "_chaos_lease_deadline", None)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", required=True, choices=["producer", "worker"])
    parser.add_argument("--id", required=True)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--queue", default="chaos")
    parser.add_argument("--history", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--lease-ttl-ms", type=int, default=3000)
    parser.add_argument("--hold-max-ms", type=int, default=4000)
    args = parser.parse_args()

    history = History(args.history, args.id)
    rng = random.Random(args.seed)
    stopping = threading.Event()
    client = casq.Client(args.brokers.split(","), timeout=2.0, retry_timeout=15.0, backoff_max=1.0)
    history.record(kind="start", role=args.role, lang="python")

    if args.role == "producer":
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        produce(client, args, history, stopping)
    else:
        capture_lease_deadlines()
        worker = casq.Worker(client, worker_id=args.id)
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=worker.stop, args=(10.0,)).start())
        work(worker, args, history, rng)
    history.record(kind="stop")
    return 0


def produce(client: casq.Client, args: argparse.Namespace, history: History, stopping: threading.Event) -> None:
    producer = casq.Producer(client)
    interval = 1.0 / args.rate
    seq = 0
    while not stopping.is_set():
        seq += 1
        dedup = f"{args.id}.{seq}"
        started = time.monotonic()
        while True:
            try:
                result = producer.enqueue(
                    args.queue, json.dumps({"dedup": dedup, "producer": args.id}).encode(), dedup_id=dedup
                )
                history.record(kind="enqueue-ok", dedup=dedup, id=result.id, duplicate=bool(result.duplicate))
                break
            except Exception as error:  # noqa: BLE001 - every failure is recorded and retried
                history.record(kind="enqueue-fail", dedup=dedup, error=str(error)[:500])
                if stopping.is_set() and time.monotonic() - started > 60:
                    break
                time.sleep(0.2)
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


def hold_seconds(rng: random.Random, hold_max_ms: int) -> float:
    x = rng.random()
    if x < 0.7:
        return (5 + rng.random() * 300) / 1000
    if x < 0.95:
        return (300 + rng.random() * 1200) / 1000
    return (1500 + rng.random() * max(0, hold_max_ms - 1500)) / 1000


def work(worker: casq.Worker, args: argparse.Namespace, history: History, rng: random.Random) -> None:
    rng_lock = threading.Lock()

    def handler(job: casq.Job) -> None:
        payload = job.json()
        job_dedup = getattr(job, "dedup_id", getattr(job, "_chaos_dedup_id", None))
        history.record(
            kind="deliver",
            id=job.id,
            dedup=payload.get("dedup", ""),
            jobDedup=job_dedup,
            receipt=job.receipt,
            attempt=job.attempt,
            leaseDeadline=lease_deadline_ms(job),
            leaseTtlMs=args.lease_ttl_ms,
        )
        with rng_lock:
            hold = hold_seconds(rng, args.hold_max_ms)
            nack = rng.random() < NACK_SHARE
        if job.lost.wait(hold):
            # Not a nack: the SDK settles nothing once the lease is lost.
            history.record(kind="lease-lost", id=job.id, receipt=job.receipt)
            raise RuntimeError(LOST)
        if nack:
            history.record(kind="nack-sent", id=job.id, receipt=job.receipt)
            raise RuntimeError(NACK)
        history.record(kind="ack-sent", id=job.id, receipt=job.receipt)

    def on_error(error: Exception, job: casq.Job | None) -> None:
        if job is not None and str(error) in (LOST, NACK):
            return  # our own throw, recorded above
        fields: dict[str, Any] = {"kind": "error", "error": str(error)[:500]}
        if job is not None:
            fields.update(id=job.id, receipt=job.receipt)
        history.record(**fields)

    worker.run(
        args.queue,
        handler,
        concurrency=args.concurrency,
        prefetch=args.concurrency,
        lease_ttl=args.lease_ttl_ms / 1000,
        on_error=on_error,
    )


if __name__ == "__main__":
    sys.exit(main())
