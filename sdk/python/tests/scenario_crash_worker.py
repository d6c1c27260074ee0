"""The child process of the scenario step ``crashWorker`` (see test/scenarios/README.md).

Runs a casq.Worker whose handler prints ``STARTED <payload>`` on its own
stdout line and then never returns; the scenario runner SIGKILLs this process
once it has seen the lines it waits for, so the jobs are never settled.

    python scenario_crash_worker.py --brokers A[,B...] --queue Q --subscription S --jobs N
"""

from __future__ import annotations

import argparse
import sys
import threading

import casq


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--brokers", required=True, help="comma-separated host:port list")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--subscription", default="default")
    parser.add_argument("--jobs", type=int, default=1, help="concurrency and prefetch")
    args = parser.parse_args(argv)

    never = threading.Event()
    print_lock = threading.Lock()

    def handler(job: casq.Job) -> None:
        with print_lock:  # one whole line per job, even with concurrent handlers
            print(f"STARTED {job.text()}", flush=True)
        never.wait()

    client = casq.Client(brokers=args.brokers.split(","))
    casq.Worker(client).run(
        args.queue, handler, subscription=args.subscription, concurrency=args.jobs, prefetch=args.jobs
    )


if __name__ == "__main__":
    main(sys.argv[1:])
