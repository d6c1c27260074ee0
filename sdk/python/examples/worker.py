"""A casq worker that drains on Ctrl-C and SIGTERM instead of dying mid-job.

    python sdk/python/examples/worker.py --brokers 127.0.0.1:50051 --queue emails

Prints ``started <id>`` when a job's handler starts and ``done <id> <payload>``
when it returns (the job is then acked). The first SIGINT (Ctrl-C) or SIGTERM
(what systemd, Kubernetes and ``docker stop`` send) stops taking jobs, lets
the running ones finish and be acked (up to ``--drain-timeout`` seconds),
prints ``stopped``, and exits 0: no traceback, no job cut off. A second
signal exits at once (130 for SIGINT, 143 for SIGTERM); jobs still running
then are not acked, and casq delivers them again after their lease.

``Worker.stop()`` waits for ``run()`` to return, and ``run()`` runs on the main
thread, which is also where Python runs signal handlers; so the handler only
starts a thread that calls ``stop()``, and returns at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from types import FrameType

import casq


def main() -> None:
    """Parses the arguments and works the queue until a signal stops it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="127.0.0.1:50051", help="comma-separated host:port list")
    parser.add_argument("--queue", default="emails")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--job-seconds", type=float, default=0.0, help="how long each job takes (a stand-in for work)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="longest wait for running jobs on a stop")
    args = parser.parse_args()

    worker = casq.Worker(casq.Client(brokers=args.brokers.split(",")))

    def handle(job: casq.Job) -> None:
        print(f"started {job.id}", flush=True)
        time.sleep(args.job_seconds)
        print(f"done {job.id} {job.text()}", flush=True)  # returning acks the job

    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stopping.is_set():  # the second signal: give up on the drain
            os._exit(128 + signum)
        stopping.set()
        print(f"{signal.Signals(signum).name}: draining (signal again to exit at once)", file=sys.stderr, flush=True)
        threading.Thread(target=worker.stop, args=(args.drain_timeout,), daemon=True).start()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    worker.run(args.queue, handle, concurrency=args.concurrency)  # returns once stop() has drained
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
