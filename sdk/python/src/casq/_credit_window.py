"""The credit window of one Work stream (as the TypeScript SDK's ``worker/credit-window.ts``).

How many jobs the stream may have held by the worker plus granted to the
broker and not yet used, and how that number adapts. The broker claims at most
the stream's credit per commit, so with a fixed window of ``concurrency`` a
worker whose handlers are fast waits a whole commit (100 ms and more on S3)
for every ``concurrency`` jobs. A window that holds what the handlers drain in
one round trip (the bandwidth-delay product) keeps them busy. Nobody knows
that product in advance, so the window measures it, in epochs of one window's
worth of arrivals:

- **grow** (doubles, up to ``max``) when, within the epoch, the handlers sat
  idle with nothing buffered (starved) while the broker had used most of the
  credit (the lowest outstanding credit seen at an arrival was at most half
  the window): the credit, not the queue, was what they waited for. Up to
  ``grow_freely_to`` that is all, and it quadruples when the broker used every
  credit it had (an epoch takes a commit or two, 100 ms each on a slow store);
  past it the window also must hold fewer jobs
  than arrive in ``ROUND_TRIPS_HELD`` commit intervals at the epoch's rate.
  Jobs come in one burst per commit, so the longest pause between two
  arrivals in an epoch is about one commit interval (the shortest of the last
  ``GAP_EPOCHS`` epochs' is taken, so one pause of the worker's own does not
  count). A broker that is busy, not far away, sends no more jobs for more
  credit, while every job it has claimed and not seen settled is a lease its
  head carries in every write: on a local disk 20 × ``concurrency`` keeps the
  handlers busy, at 100 ms a write it takes thousands;
- **shrink** by half the smallest buffer seen when the buffer never emptied
  within the epoch (a standing queue: the extra jobs only wait, holding
  leases other workers could use);
- **decay** a quarter of the way back to ``min`` when the handlers were
  starved but the broker sat on more than three quarters of the credit all
  epoch (nothing runnable).

Grants are held back while they would be smaller than the credit the broker
still has: credit given back one job at a time would split the window into
small claims that take turns, one per commit (TCP's silly window syndrome); a
grant at least as large as the broker's remaining credit merges them again.
``min == max`` is a fixed window (``prefetch``). The broker never lets
outstanding credit pass ``max_outstanding`` (``Opened.max_credits``), so a
window above that is granted as jobs arrive.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# Largest prefetch (fixed or adaptive) per stream.
MAX_PREFETCH = 10_000
# Past ``grow_freely_to`` the window grows only while it holds fewer jobs than arrive in this many commit intervals.
ROUND_TRIPS_HELD = 4
# Epochs whose longest pause between arrivals (about a commit interval) are remembered.
GAP_EPOCHS = 3


@dataclass(frozen=True)
class WindowBounds:
    """The initial size and bounds of each stream's window; ``grow_freely_to`` None means ``max``."""

    initial: int
    min: int
    max: int
    grow_freely_to: int | None = None


def credit_window_bounds(concurrency: int, prefetch: int | None, max_prefetch: int | None) -> WindowBounds:
    """The bounds for a run's options: ``prefetch`` fixes the window; else it adapts up to ``max_prefetch``.

    Both are kept within ``concurrency..MAX_PREFETCH``; ``max_prefetch``
    defaults to 100 × ``concurrency``, and the window grows past 20 ×
    ``concurrency`` only for a slow store (see the module doc). Raises
    ValueError outside 1..MAX_PREFETCH.
    """
    for name, value in (("prefetch", prefetch), ("max_prefetch", max_prefetch)):
        if value is not None and not 1 <= value <= MAX_PREFETCH:
            raise ValueError(f"{name} must be between 1 and {MAX_PREFETCH}")

    def clamp(n: int) -> int:
        return min(MAX_PREFETCH, max(concurrency, n))

    if prefetch is not None:
        fixed = clamp(prefetch)
        return WindowBounds(fixed, fixed, fixed)
    return WindowBounds(
        concurrency,
        concurrency,
        clamp(max_prefetch if max_prefetch is not None else 100 * concurrency),
        20 * concurrency,
    )


class CreditWindow:
    """The adaptive credit window of one stream (see the module doc)."""

    def __init__(
        self, bounds: WindowBounds, max_outstanding: int, now: Callable[[], float] | None = None
    ) -> None:
        """``now`` (seconds) times arrivals; without it the window never grows past ``grow_freely_to``."""
        self.min = max(1, bounds.min)
        self.max = max(self.min, bounds.max)
        self.size = min(self.max, max(self.min, bounds.initial))
        self.grow_freely_to = min(self.max, bounds.grow_freely_to if bounds.grow_freely_to is not None else self.max)
        self.held = 0  # held jobs whose credit goes back to this stream
        self.outstanding = 0  # credit granted (or about to be) and not yet used
        self.max_outstanding = max_outstanding
        self._now = now
        self._arrivals = 0
        self._low_outstanding = math.inf
        self._low_buffered = math.inf
        self._starved = False
        self._epoch_start = now() if now is not None else 0.0
        self._last_arrival: float | None = None
        self._longest_gap = 0.0
        self._recent_gaps: deque[float] = deque(maxlen=GAP_EPOCHS)

    @property
    def fixed(self) -> bool:
        return self.min == self.max

    def adopt(self, n: int) -> None:
        """Takes over the credit of ``n`` held jobs of an ended stream (they count as held here)."""
        self.held += n

    def _grantable(self) -> int:
        n = min(self.size - self.held - self.outstanding, self.max_outstanding - self.outstanding)
        return n if n > 0 and n >= self.outstanding else 0

    def take_grant(self) -> int:
        """The credit to grant now, counted as outstanding (the caller sends it)."""
        n = self._grantable()
        self.outstanding += n
        return n

    def arrived(self) -> None:
        """A job arrived on the stream: it used one credit and is held."""
        if self._now is not None:
            at = self._now()
            if self._last_arrival is not None:
                self._longest_gap = max(self._longest_gap, at - self._last_arrival)
            self._last_arrival = at
        self.outstanding = max(0, self.outstanding - 1)
        self.held += 1
        self._low_outstanding = min(self._low_outstanding, self.outstanding)
        self._arrivals += 1
        if self._arrivals >= self.size:
            self._end_epoch()

    def returned(self) -> None:
        """A held job's credit came back (its handler finished, or it was dropped)."""
        self.held = max(0, self.held - 1)

    def note_starved(self) -> None:
        """The handlers sat idle with nothing buffered."""
        self._starved = True

    def note_started(self, buffered: int) -> None:
        """A handler started with ``buffered`` jobs still waiting behind it."""
        self._low_buffered = min(self._low_buffered, buffered)

    def _jobs_per_round_trips(self, now: float) -> float:
        """The jobs that arrive in ``ROUND_TRIPS_HELD`` commit intervals at this epoch's rate (0: unknown)."""
        if self._now is None or len(self._recent_gaps) < GAP_EPOCHS or now < self._epoch_start:
            return 0.0
        per_second = self._arrivals / max(0.001, now - self._epoch_start)
        return ROUND_TRIPS_HELD * per_second * min(self._recent_gaps)

    def _end_epoch(self) -> None:
        now = self._now() if self._now is not None else 0.0
        self._recent_gaps.append(self._longest_gap)
        self._longest_gap = 0.0
        if not self.fixed:
            if self._starved and self._low_outstanding * 2 <= self.size:
                # The broker took every credit it had: quadruple (a slow store's window is far off).
                step = 4 if self._low_outstanding == 0 else 2
                if self.size < self.grow_freely_to:
                    self.size = min(self.grow_freely_to, self.size * step)
                elif self.size < self._jobs_per_round_trips(now):
                    self.size = min(self.max, self.size * 2)
            elif not self._starved and 0 < self._low_buffered < math.inf:
                self.size = max(self.min, self.size - math.ceil(self._low_buffered / 2))
            elif self._starved and self._low_outstanding * 4 > self.size * 3:
                self.size = max(self.min, self.size - math.ceil((self.size - self.min) / 4))
        self._arrivals = 0
        self._epoch_start = now
        self._low_outstanding = math.inf
        self._low_buffered = math.inf
        self._starved = False
