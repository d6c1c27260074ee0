"""The workers' log: what went wrong, through the standard ``logging`` module.

Everything goes to the logger ``casq.worker`` (a child of ``casq``), at
WARNING: a handler that raised (with the job id, attempt and traceback),
a settle the broker did not apply, a stream that broke. The SDK adds no
handler, so Python's last-resort handler prints warnings to stderr until the
application configures logging; ``logging.getLogger("casq.worker")`` can be
given its own level, handlers or filters, or ``propagate = False``, like any
library logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

from casq.errors import DeadLetter
from casq.job import Job

logger = logging.getLogger("casq.worker")


def log_handler_failure(job: Job, error: BaseException) -> None:
    """One job's handler raised: the job is nacked (retried or dead-lettered by the queue's policy)."""
    if isinstance(error, DeadLetter):
        logger.warning(
            "casq: job %s (attempt %d of %d) dead-lettered by its handler: %s",
            job.id,
            job.attempt,
            job.max_attempts,
            error.reason or "no reason given",
            extra={"casq_job_id": job.id, "casq_attempt": job.attempt},
        )
        return
    last = job.max_attempts > 0 and job.attempt >= job.max_attempts
    logger.warning(
        "casq: handler failed for job %s (attempt %d of %d, %s): %s: %s",
        job.id,
        job.attempt,
        job.max_attempts,
        "the last one: it will be dead-lettered" if last else "it will be retried",
        type(error).__name__,
        error,
        exc_info=error,
        extra={"casq_job_id": job.id, "casq_attempt": job.attempt},
    )


def log_worker_error(error: BaseException, job: Job | None) -> None:
    """A failure that does not end ``run()`` and is not a handler's: a settle not applied, a broken stream."""
    if job is not None:
        logger.warning("casq: job %s (attempt %d): %s", job.id, job.attempt, error, extra={"casq_job_id": job.id})
    else:
        logger.warning("casq: %s", error)


def report_failure(
    error: BaseException,
    job: Job | None,
    on_error: Callable[[Exception, Job | None], None] | None,
    *,
    handler_failed: bool = False,
) -> None:
    """A failure that does not end ``run()``: logged (a handler's with its job), then given to ``on_error``.

    Only a handler's failure may be a BaseException that is not an Exception
    (a CancelledError of its own, a SystemExit): ``on_error`` gets it as it
    is, like any handler failure, though it is typed for the Exceptions every
    other failure is (so that callbacks written for those type-check).
    """
    if handler_failed and job is not None:
        log_handler_failure(job, error)
    else:
        log_worker_error(error, job)
    if on_error is not None:
        try:
            on_error(cast(Exception, error), job)
        except Exception:  # noqa: BLE001 - a failing callback must not kill the worker
            pass
