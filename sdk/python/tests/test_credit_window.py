"""The credit window's rules, driven by hand (as sdk/ts/src/worker/credit-window.test.ts), and in the Work core."""

from __future__ import annotations

import random

import pytest

from casq._credit_window import CreditWindow, WindowBounds, credit_window_bounds
from casq._work_core import PRIMARY, AckBatch, WorkCore, outgoing
from casq.v1 import message_pb2, work_pb2


def open_window(initial: int, low: int, high: int, max_outstanding: int = 1000) -> CreditWindow:
    w = CreditWindow(WindowBounds(initial, low, high), max_outstanding)
    assert w.take_grant() == w.size
    return w


def fast_round(w: CreditWindow) -> None:
    """Every outstanding credit comes back as a job that finishes at once."""
    n = w.outstanding
    w.note_starved()
    for _ in range(n):
        w.arrived()
    for _ in range(n):
        w.returned()
        w.note_starved()
    w.take_grant()


def test_grows_while_starved_handlers_waited_for_credit_the_broker_used_up_to_max() -> None:
    # The broker used all the credit: x4.
    w = open_window(4, 4, 50)
    sizes = []
    for _ in range(4):
        fast_round(w)
        sizes.append(w.size)
    assert sizes == [16, 50, 50, 50]
    assert w.outstanding <= 50
    # It keeps one credit back each round (used most, not all): x2.
    most = open_window(4, 4, 50)
    seen: list[int] = []
    for _ in range(12):
        most.note_starved()
        n = most.outstanding - 1
        for _ in range(n):
            most.arrived()
        for _ in range(n):
            most.returned()
        most.outstanding = most.size  # the held-back credit is used by the next round
        if not seen or seen[-1] != most.size:
            seen.append(most.size)
    assert seen == [4, 8, 16, 32, 50]


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_past_grow_freely_to_grows_while_each_commits_burst_is_a_large_part_of_the_window() -> None:
    # A slow store: every 100 ms a commit brings all the credit the broker had, at once.
    clock = ManualClock()
    w = CreditWindow(WindowBounds(50, 50, 5000, 1000), 10_000, clock)
    w.take_grant()
    sizes = []
    for _ in range(12):
        clock.t += 0.1
        fast_round(w)
        sizes.append(w.size)
    assert sizes[:5] == [200, 800, 1000, 2000, 4000]
    assert sizes[-1] == 5000


def test_past_grow_freely_to_stays_for_a_busy_broker_that_sends_the_same_few_jobs_per_commit() -> None:
    # A fast store, a busy broker: 100 jobs every 5 ms whatever the credit (it used all it had left).
    clock = ManualClock()
    w = CreditWindow(WindowBounds(800, 50, 5000, 800), 10_000, clock)
    w.take_grant()
    for round_ in range(40):
        clock.t += 0.1 if round_ == 20 else 0.005  # one long pause (a GC, say) is not a commit interval
        w.outstanding = 100
        w.note_starved()
        for _ in range(100):
            w.arrived()
            w.returned()
    assert w.size == 800
    # Without a clock it never grows past grow_freely_to either.
    untimed = CreditWindow(WindowBounds(800, 50, 5000, 800), 10_000)
    untimed.take_grant()
    for _ in range(10):
        fast_round(untimed)
    assert untimed.size == 800


def test_shrinks_by_half_the_standing_queue() -> None:
    w = open_window(40, 10, 100)
    for _ in range(40):
        w.arrived()
        w.note_started(30)
    assert w.size == 25


def test_decays_when_the_broker_sat_on_the_credit() -> None:
    w = open_window(100, 10, 1000)
    for _ in range(100):
        w.arrived()
        w.returned()
        w.note_starved()
        w.outstanding += 1
    assert 10 <= w.size < 100


def test_a_fixed_window_never_changes() -> None:
    w = open_window(6, 6, 6)
    for _ in range(5):
        fast_round(w)
    assert w.size == 6 and w.fixed


def test_holds_back_a_grant_smaller_than_the_broker_s_remaining_credit() -> None:
    w = open_window(10, 10, 10)
    for _ in range(6):
        w.arrived()
    w.returned()
    assert w.take_grant() == 0
    for _ in range(3):
        w.returned()
    assert w.take_grant() == 4 and w.outstanding == 8


def test_keeps_outstanding_credit_within_max_credits() -> None:
    w = CreditWindow(WindowBounds(2500, 2500, 2500), 1000)
    assert w.take_grant() == 1000
    for _ in range(1000):
        w.arrived()
    assert w.take_grant() == 1000 and w.held + w.outstanding == 2000


def test_bounds_of_the_options() -> None:
    assert credit_window_bounds(50, None, None) == WindowBounds(50, 50, 5000, 1000)
    assert credit_window_bounds(1000, None, None) == WindowBounds(1000, 1000, 10_000, 20_000)
    assert credit_window_bounds(10, None, 5) == WindowBounds(10, 10, 10, 200)
    assert credit_window_bounds(10, 30, None) == WindowBounds(30, 30, 30)
    with pytest.raises(ValueError):
        credit_window_bounds(10, 0, None)
    with pytest.raises(ValueError):
        credit_window_bounds(10, None, 10_001)


class _Settings:
    timeout = 5.0
    brokers = ["b1:1"]
    backoff_initial = 0.1
    backoff_max = 1.0


class _Box:
    def __init__(self) -> None:
        self.items: list[work_pb2.WorkRequest | None] = []

    def put_nowait(self, item: work_pb2.WorkRequest | AckBatch | None, /) -> None:
        self.items.append(None if item is None else outgoing(item))  # sent at once: no ack waits for company


def _grants(box: _Box) -> list[int]:
    out = []
    for item in box.items:
        if item is not None and item.HasField("open"):
            out.append(item.open.credits)
        elif item is not None and item.HasField("credit"):
            out.append(item.credit.credits)
    return out


def _core(prefetch: int | None, max_prefetch: int | None = None) -> tuple[WorkCore, _Box]:
    core = WorkCore(
        _Settings(),
        queue="q",
        subscription="default",
        worker_id="w1",
        concurrency=2,
        prefetch=prefetch,
        max_prefetch=max_prefetch,
        lease_ttl=None,
        clock=lambda: 0.0,
        rng=random.Random(1),
    )
    box = _Box()
    stream = core.open_stream(PRIMARY, "b1:1", box)
    assert stream is not None
    core.on_response(stream, work_pb2.WorkResponse(opened=work_pb2.WorkOpened()), _Box)
    # Fast handlers: every job the broker may send comes and finishes at once.
    n = 0
    for _ in range(20):
        for _ in range(stream.credit.outstanding):
            n += 1
            claimed = message_pb2.ClaimedMessage(receipt=f"r{n}", attempt=1)
            for held in core.on_response(stream, work_pb2.WorkResponse(job=claimed), _Box).start:
                for nxt in [held, *core.handler_done(held)]:
                    if nxt is not held:
                        core.handler_done(nxt)
    return core, box


def test_the_core_grows_the_window_of_fast_handlers_up_to_max_prefetch() -> None:
    _, box = _core(None, 16)
    grants = _grants(box)
    assert grants[0] == 2  # opens at the concurrency
    assert 2 < max(grants) <= 16


def test_the_core_keeps_a_fixed_prefetch() -> None:
    _, box = _core(4)
    assert max(_grants(box)) == 4
