"""The SDK's one retry delay (casq._backoff), without a broker."""

from __future__ import annotations

import random

import pytest

from casq._backoff import backoff_delay


class Fixed(random.Random):
    """A Random whose uniform(a, b) always lands at the same fraction of [a, b]."""

    def __init__(self, fraction: float) -> None:
        super().__init__(0)
        self.fraction = fraction

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.fraction


@pytest.mark.parametrize(
    ("attempt", "cap"), [(0, 0.1), (1, 0.2), (2, 0.4), (5, 3.2), (6, 5.0), (7, 5.0), (10_000, 5.0)]
)
def test_equal_jitter_between_half_and_all_of_a_doubling_capped_ceiling(attempt: int, cap: float) -> None:
    assert backoff_delay(attempt, 0.1, 5.0, Fixed(0.0)) == pytest.approx(cap / 2)
    assert backoff_delay(attempt, 0.1, 5.0, Fixed(1.0)) == pytest.approx(cap)


def test_a_seeded_rng_replays_and_the_module_rng_stays_in_bounds() -> None:
    assert [backoff_delay(n, 0.1, 5.0, random.Random(7)) for n in range(8)] == [
        backoff_delay(n, 0.1, 5.0, random.Random(7)) for n in range(8)
    ]
    for n in range(40):
        cap = min(5.0, 0.1 * 2**n)
        assert cap / 2 <= backoff_delay(n, 0.1, 5.0) <= cap
