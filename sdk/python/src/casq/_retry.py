"""Which failures of a unary call to retry, where, and after how long: shared by both flavours' Client."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Protocol

import grpc

from casq._backoff import backoff_delay
from casq.errors import CasqError, RedirectError, UnavailableError


def next_broker(brokers: Sequence[str], index: int, failed: str | None, avoid: Collection[str] = ()) -> str:
    """The broker at ``index`` (cyclically), skipping ``failed``, and ``avoid`` while another one is left."""
    for skip in ({failed, *avoid}, {failed}):
        for step in range(len(brokers)):
            candidate = brokers[(index + step) % len(brokers)]
            if candidate not in skip:
                return candidate
    return brokers[index % len(brokers)]


def is_outage(error: CasqError) -> bool:
    """A failure another attempt, possibly at another broker, may not meet.

    UNAVAILABLE without a redirect, and DEADLINE_EXCEEDED: the attempt's own
    deadline passed, so the broker is hung or too slow (a SIGSTOPped process
    still accepts connections, so this is how a hung broker shows). The
    attempt may have been applied, which makes the retry safe only for
    idempotent calls: acks, nacks, heartbeats, admin changes and enqueues
    with dedup ids (the producers give every message one by default).
    """
    return isinstance(error, UnavailableError) or error.code == grpc.StatusCode.DEADLINE_EXCEEDED


class RetryBudget:
    """Which failures of one unary call to retry, where, and how long to wait first.

    Redirects and outages (UNAVAILABLE, or DEADLINE_EXCEEDED for an attempt
    that ran out of its own ``timeout``) are retried until ``retry_timeout``
    or ``max_attempts`` runs out. An outage moves the call on to the next
    listed broker after a backoff delay, and the broker that failed is
    remembered for the rest of the call: a redirect to it (a dead or hung
    leader whose leader lease has not run out) is not followed; the call
    backs off and asks the redirecting broker again, which takes the shard
    over once that lease ends. Any other redirect is followed at once,
    unless the previous failure was one too (two brokers pointing at each
    other while leadership moves): that one, like every outage, waits a
    backoff delay. A call counted by attempts alone was too short to
    outlive a dead leader's leader lease, since every redirect back to it
    used up an attempt.
    """

    def __init__(self, client: RetrySettings, deadline: float | None = None) -> None:
        self.client = client
        # A given deadline (time.monotonic()) is shared by the calls of one
        # split Enqueue batch: the whole split retries no longer than one call.
        self.deadline = time.monotonic() + client.retry_timeout if deadline is None else deadline
        self.attempts = 0
        self.backoffs = 0
        self.last_was_redirect = False
        # Brokers that failed (an outage) in this call.
        self.failed: set[str] = set()

    def next_attempt(self, error: CasqError, address: str) -> tuple[float, str | None]:
        """Seconds to wait and where to send the next attempt (None: fail over); raises ``error`` when it is final."""
        self.attempts += 1
        target = _redirect_target(error)
        if not target and not is_outage(error):
            raise error
        if self.client.max_attempts is not None and self.attempts >= self.client.max_attempts:
            raise error
        if not target:
            self.failed.add(address)
        avoided = bool(target) and target in self.failed
        delay = 0.0
        if not target or avoided or self.last_was_redirect or target == address:
            delay = backoff_delay(self.backoffs, self.client.backoff_initial, self.client.backoff_max)
            self.backoffs += 1
        self.last_was_redirect = bool(target)
        if time.monotonic() + delay > self.deadline:
            raise error
        if avoided:
            return delay, address  # ask the redirecting broker again
        return delay, target or None


def attempt_timeout(timeout: float, retry_deadline: float) -> float:
    """Seconds left for one attempt of a call whose retries stop at ``retry_deadline``.

    A call may start its last retry just before the retry deadline and give
    it the whole ``timeout``, so a call lasts at most ``retry_deadline +
    timeout``; attempts made later within the same call (the sub-batches of a
    split Enqueue batch) get what is left of that, so splitting never makes a
    call longer than an unsplit one could have been. Raises DEADLINE_EXCEEDED
    when nothing is left.
    """
    left = min(timeout, retry_deadline + timeout - time.monotonic())
    if left <= 0:
        raise CasqError(grpc.StatusCode.DEADLINE_EXCEEDED, "the call ran out of time (retry_timeout + timeout)")
    return left


def _redirect_target(error: CasqError) -> str:
    """The leader address a redirect points at ("" for other errors)."""
    return error.leader_address if isinstance(error, RedirectError) else ""


class RetrySettings(Protocol):
    """The retry settings of a Client (either flavour)."""

    max_attempts: int | None
    backoff_initial: float
    backoff_max: float
    retry_timeout: float
