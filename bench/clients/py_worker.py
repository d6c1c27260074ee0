"""The Python SDK's side of ``npm run bench``.

Works a preloaded casq queue with the SDK's (thread-based) Worker at a given
concurrency and prints one JSON line with the jobs/s it measured from its
first job to its last::

    .venv/bin/python bench/clients/py_worker.py --brokers 127.0.0.1:50051 --queue bench-1 --jobs 20000 --concurrency 50
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import casq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="127.0.0.1:50051", help="comma-separated broker addresses")
    parser.add_argument("--queue", required=True, help="queue to work")
    parser.add_argument("--jobs", type=int, required=True, help="jobs to handle before stopping")
    parser.add_argument("--concurrency", type=int, default=50, help="handlers at once")
    args = parser.parse_args()

    client = casq.Client(brokers=args.brokers.split(","))
    worker = casq.Worker(client)
    lock = threading.Lock()
    seen = {"done": 0, "first": 0.0, "last": 0.0}

    def handle(job: casq.Job) -> None:
        with lock:
            if seen["done"] == 0:
                seen["first"] = time.perf_counter()
            seen["done"] += 1
            if seen["done"] == args.jobs:
                seen["last"] = time.perf_counter()
                threading.Thread(target=worker.stop, kwargs={"timeout": 10.0}, daemon=True).start()

    worker.run(args.queue, handle, concurrency=args.concurrency)
    seconds = seen["last"] - seen["first"]
    print(json.dumps({"jobs": args.jobs, "seconds": seconds, "jobs_per_s": args.jobs / seconds if seconds else 0}))
    client.close()


if __name__ == "__main__":
    main()
