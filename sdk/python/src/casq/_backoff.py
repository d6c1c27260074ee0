"""Exponential backoff with full jitter."""

from __future__ import annotations

import random


def backoff_delay(attempt: int, initial: float, maximum: float) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): full jitter."""
    ceiling = min(maximum, initial * (2 ** min(attempt, 30)))
    return random.uniform(ceiling / 2, ceiling)
