"""The Python client under test of the scenario interpreter (protocol in test/scenario-interpreter/README.md).

Reads one JSON request a line on stdin, makes the casq (sync SDK) call it
names, and writes one JSON response a line on stdout. Workers run in threads.

    python scenario_client.py '{"brokers": ["host:port", ...]}'
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from google.protobuf import json_format

import casq

HANDLER_ERROR = "scenario handler:"


def _client(brokers: list[str]) -> casq.Client:
    # Unary calls retry across redirects and brokers for up to 30 s (a killed
    # leader's shards wait out its leader lease before moving).
    return casq.Client(brokers=brokers, timeout=10.0, retry_timeout=30.0)


class WorkerRun:
    """One ``startWorker``: an SDK worker run in a background thread, recording its handler calls."""

    def __init__(self, client: casq.Client, r: dict[str, Any]) -> None:
        self.handler: str = r["handler"]
        self.handler_ms: int = r["handlerMs"]
        self.grace: float = r["graceMs"] / 1000
        self.worker = casq.Worker(client)
        self.lock = threading.Lock()
        self.invocations: list[dict[str, Any]] = []
        self.started = 0
        self.completed = 0
        self.errors: list[str] = []
        self.error: BaseException | None = None
        self.never = threading.Event()
        lease = r.get("leaseTtlMs")

        def run() -> None:
            try:
                self.worker.run(
                    r["queue"],
                    self.handle,
                    subscription=r["subscription"],
                    concurrency=r["concurrency"],
                    prefetch=r["prefetch"],
                    lease_ttl=lease / 1000 if lease is not None else None,
                    on_error=self.on_error,
                )
            except BaseException as error:  # noqa: BLE001 - reported by workerState / stopWorker
                self.error = error

        self.thread = threading.Thread(target=run, name=f"scenario-worker-{r['name']}", daemon=True)
        self.thread.start()

    def handle(self, job: casq.Job) -> None:
        with self.lock:
            self.invocations.append({"payload": job.text(), "attempt": job.attempt})
            self.started += 1
        if self.handler == "hang":
            self.never.wait()
        try:
            if self.handler_ms:
                time.sleep(self.handler_ms / 1000)
            if self.handler == "nack":
                raise RuntimeError(f"{HANDLER_ERROR} nack")
            if self.handler == "deadLetter":
                raise casq.DeadLetter(f"{HANDLER_ERROR} dead letter")
        finally:
            with self.lock:
                self.completed += 1

    def on_error(self, error: BaseException, _job: casq.Job | None = None) -> None:
        if str(error).startswith(HANDLER_ERROR):
            return
        with self.lock:
            self.errors = [*self.errors[-4:], repr(error)]

    def state(self) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = {
                "started": self.started,
                "completed": self.completed,
                "invocations": list(self.invocations),
                "ended": not self.thread.is_alive(),
                "errors": list(self.errors),
            }
        if self.error is not None:
            out["error"] = repr(self.error)
        return out


class Session:
    """The SDK objects of one client process, and what each request does with them."""

    def __init__(self, brokers: list[str]) -> None:
        self.client = _client(brokers)
        self.admin = casq.Admin(self.client)
        self.producers: dict[tuple[str, ...], casq.Producer] = {}
        self.workers: dict[str, WorkerRun] = {}

    def producer(self, only: list[str] | None) -> casq.Producer:
        if only is None:
            return casq.Producer(self.client)
        key = tuple(only)
        if key not in self.producers:
            self.producers[key] = casq.Producer(_client(only))
        return self.producers[key]

    def worker(self, name: str) -> WorkerRun:
        if name not in self.workers:
            raise KeyError(f"no worker {name!r}")
        return self.workers[name]

    def handle(self, r: dict[str, Any]) -> Any:
        op = r["op"]
        if op == "createQueue":
            backoff = r["backoffMs"] / 1000
            self.admin.create_queue(
                r["queue"],
                r["shards"],
                lease_ttl=r["leaseTtlMs"] / 1000,
                max_attempts=r.get("maxAttempts"),
                backoff_initial=backoff,
                backoff_max=backoff,
                backoff_multiplier=1.0,
                backoff_jitter=0.0,
            )
            return {}
        if op == "createSubscription":
            self.admin.create_subscription(r["queue"], r["subscription"], start="earliest")
            return {}
        if op == "enqueue":
            messages = [
                casq.NewMessage(
                    payload=m["payload"].encode(),
                    key=m.get("key"),
                    priority=m.get("priority", 0),
                    delay=m["delayMs"] / 1000 if "delayMs" in m else None,
                    headers=m.get("headers"),
                    max_attempts=m.get("maxAttempts"),
                    dedup_id=m.get("dedupId"),
                )
                for m in r["messages"]
            ]
            producer = self.producer(r.get("brokers"))
            if r["batch"]:
                results = producer.enqueue_batch(r["queue"], messages)
            else:
                results = [producer.enqueue_batch(r["queue"], [m])[0] for m in messages]
            return {"results": [{"id": x.id, "duplicate": x.duplicate} for x in results]}
        if op == "getQueue":
            return json_format.MessageToDict(self.admin.get_queue(r["queue"]))
        if op == "listDeadLetters":
            letters = self.admin.list_dead_letters(r["queue"], r["subscription"])
            return {"payloads": [letter.message.payload.decode() for letter in letters]}
        if op == "redrive":
            return {"redriven": self.admin.redrive(r["queue"], r["subscription"]).redriven}
        if op == "startWorker":
            if r["name"] in self.workers:
                raise ValueError(f"worker {r['name']!r} was already started")
            self.workers[r["name"]] = WorkerRun(self.client, r)
            return {}
        if op == "workerState":
            return self.worker(r["name"]).state()
        if op == "stopWorker":
            run = self.worker(r["name"])
            run.worker.stop(timeout=run.grace)
            run.thread.join(run.grace + 5.0)
            if run.thread.is_alive():
                raise TimeoutError(f"worker {r['name']!r} run did not end after stop({run.grace:g})")
            return run.state()
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    session = Session(json.loads(sys.argv[1])["brokers"])
    for line in sys.stdin:
        request = json.loads(line)
        try:
            response = {"id": request["id"], "result": session.handle(request)}
        except Exception as error:  # noqa: BLE001 - every failure is the answer to its request
            response = {"id": request["id"], "error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(response) + "\n")
        sys.stdout.flush()
    # Worker threads are daemons: leaving ends them.


if __name__ == "__main__":
    main()
