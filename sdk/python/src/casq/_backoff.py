"""Exponential backoff with equal jitter: the one retry delay of the SDK."""

from __future__ import annotations

import random


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): equal jitter.

    The ceiling doubles from ``initial`` up to ``maximum``; the delay is drawn
    from its upper half, so a retry waits at least half the ceiling (full
    jitter would draw from zero up and sometimes retry at once).
    """
    ceiling = min(maximum, initial * (2 ** min(attempt, 30)))
    return (rng or random).uniform(ceiling / 2, ceiling)
