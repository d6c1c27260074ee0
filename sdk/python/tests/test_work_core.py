"""The Work protocol core on its own: events in, requests and decisions out, on a manual clock, no gRPC."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from concurrent.futures import Future

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from casq._work_core import (
    ACK_BATCH,
    HEARTBEAT_CHUNK,
    PRIMARY,
    AckBatch,
    Stream,
    StreamClosed,
    WorkCore,
    outgoing,
)
from casq.errors import CasqError, LeaseLostError, RedirectError, StreamTimeoutError, UnavailableError
from casq.v1 import errors_pb2, message_pb2, shard_pb2, work_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Box:
    """An outbox that keeps what was put in it."""

    def __init__(self) -> None:
        self.items: list[work_pb2.WorkRequest | None] = []

    def put_nowait(self, item: work_pb2.WorkRequest | AckBatch | None, /) -> None:
        self.items.append(None if item is None else outgoing(item))  # sent at once: no ack waits for company

    def events(self) -> list[str]:
        return ["half-close" if i is None else str(i.WhichOneof("command")) for i in self.items]


@dataclass
class Settings:
    """The client settings the core reads."""

    timeout: float = 5.0
    brokers: list[str] = field(default_factory=lambda: ["b1:1", "b2:2"])
    backoff_initial: float = 0.1
    backoff_max: float = 1.0


def make_core(
    clock: Clock | None = None,
    *,
    settings: Settings | None = None,
    concurrency: int = 1,
    prefetch: int = 2,
    lease_ttl: float | None = None,
) -> WorkCore:
    return WorkCore(
        settings or Settings(),
        queue="q",
        subscription="default",
        worker_id="w1",
        concurrency=concurrency,
        prefetch=prefetch,
        lease_ttl=lease_ttl,
        clock=clock or Clock(),
        rng=random.Random(7),
    )


def job(receipt: str) -> work_pb2.WorkResponse:
    claimed = message_pb2.ClaimedMessage(receipt=receipt, attempt=1, subscription="default")
    claimed.message.id = f"id-{receipt}"
    return work_pb2.WorkResponse(job=claimed)


def opened(*, serving: list[int], leaders: dict[int, str], heartbeat: float = 0.0) -> work_pb2.WorkResponse:
    routing = work_pb2.WorkRouting(
        serving_shards=serving,
        shards=[
            shard_pb2.ShardRoute(shard=s, leader=shard_pb2.ShardLeader(address=a) if a else None)
            for s, a in sorted(leaders.items())
        ],
    )
    response = work_pb2.WorkResponse(opened=work_pb2.WorkOpened(routing=routing))
    if heartbeat:
        response.opened.heartbeat_interval.CopyFrom(Duration(seconds=int(heartbeat)))
    return response


def primary(core: WorkCore, address: str = "b1:1") -> tuple[Stream, Box]:
    box = Box()
    stream = core.open_stream(PRIMARY, address, box)
    assert stream is not None
    stream.cancel = lambda: None  # the call is open
    return stream, box


def test_open_asks_for_prefetch_credits_less_the_lane_s_held_jobs() -> None:
    core = make_core(prefetch=3, lease_ttl=12.5)
    stream, box = primary(core)
    first = box.items[0]
    assert first is not None and first.open.credits == 3 and first.open.worker_id == "w1"
    assert first.open.lease_ttl.ToTimedelta().total_seconds() == 12.5
    core.on_response(stream, job("r1"), Box)
    core.on_response(stream, job("r2"), Box)
    core.close_stream(stream)
    again, box = primary(core)
    reopened = box.items[0]
    assert reopened is not None and reopened.open.credits == 1  # two jobs still held from the lane
    assert all(h.stream is again for h in core.held.values())


def test_jobs_start_within_concurrency_and_give_their_credit_back_when_their_handler_finishes() -> None:
    core = make_core(concurrency=1, prefetch=2)
    stream, box = primary(core)
    assert [h.job.receipt for h in core.on_response(stream, job("r1"), Box).start] == ["r1"]
    assert core.on_response(stream, job("r2"), Box).start == []  # one handler at a time
    first = core.held["r1"]
    credits_before = box.events().count("credit")
    assert [h.job.receipt for h in core.handler_done(first)] == ["r2"]
    # The credit goes back with the handler's end, before the ack is answered...
    assert box.events().count("credit") == credits_before + 1
    settle = core.settle(first, ack=True)
    assert settle is not None and settle.ack is not None and list(settle.ack.receipts) == ["r1"]
    assert core.settle(first, ack=True) is None  # once
    # ... and only once.
    core.forget(first, credit=True)
    assert box.events().count("credit") == credits_before + 1
    assert "r1" not in core.held


def test_a_reopened_stream_does_not_count_jobs_whose_credit_came_back() -> None:
    core = make_core(concurrency=2, prefetch=3)
    stream, _ = primary(core)
    core.on_response(stream, job("r1"), Box)
    core.on_response(stream, job("r2"), Box)
    core.handler_done(core.held["r1"])  # finished, its ack not answered yet
    core.close_stream(stream)
    _, box = primary(core)
    reopened = box.items[0]
    assert reopened is not None and reopened.open.credits == 2  # only r2 still uses a credit


def test_nack_carries_the_reason_delay_and_release_on_both_paths() -> None:
    core = make_core()
    stream, _ = primary(core)
    core.on_response(stream, job("r1"), Box)
    settle = core.settle(core.held["r1"], ack=False, dead_letter=True, reason="bad", delay=2.0)
    assert settle is not None and settle.nack is not None
    assert settle.nack.dead_letter and settle.nack.reason == "bad" and settle.nack.delay.seconds == 2
    on_stream = settle.stream_request(9)
    assert on_stream.request_id == 9 and on_stream.nack.reason == "bad" and on_stream.nack.delay.seconds == 2


def test_routing_opens_one_secondary_stream_per_other_leader() -> None:
    core = make_core()
    stream, _ = primary(core, "b1:1")
    reaction = core.on_response(
        stream, opened(serving=[0], leaders={0: "b1:1", 1: "b2:2", 2: "b2:2", 3: "b3:3", 4: ""}), Box
    )
    assert reaction.start_heartbeats
    assert sorted(s.address for s in reaction.streams) == ["b2:2", "b3:3"]
    assert set(core.streams) == {PRIMARY, "b2:2", "b3:3"}
    # The same routing again (or reroute after nothing changed) opens nothing more.
    assert core.on_response(stream, opened(serving=[0], leaders={1: "b2:2"}), Box).streams == []
    assert core.reroute(Box) == []
    # A secondary that ended is reopened by reroute while routing still names its broker.
    core.close_stream(core.streams["b2:2"])
    assert [s.address for s in core.reroute(Box)] == ["b2:2"]


def test_answers_resolve_waiters_and_a_closed_stream_fails_the_rest() -> None:
    core = make_core()
    stream, box = primary(core)
    answered: Future[work_pb2.WorkResponse] = Future()
    failed: Future[work_pb2.WorkResponse] = Future()
    orphaned: Future[work_pb2.WorkResponse] = Future()
    build = lambda rid: work_pb2.WorkRequest(request_id=rid, ack=work_pb2.WorkAck(receipts=["r"]))  # noqa: E731
    assert core.send(stream, build, answered) and core.send(stream, build, failed) and core.send(stream, build, orphaned)
    ids = [item.request_id for item in box.items[1:] if item is not None]
    core.on_response(stream, work_pb2.WorkResponse(request_id=ids[0], acked=work_pb2.WorkAcked()), Box)
    status = errors_pb2.RpcStatus(code=grpc.StatusCode.UNAVAILABLE.value[0], message="not the leader")
    redirect = errors_pb2.LeaderRedirect(leader_address="b2:2")
    status.details.add().Pack(redirect)
    core.on_response(
        stream, work_pb2.WorkResponse(request_id=ids[1], request_failed=work_pb2.WorkRequestFailed(status=status)), Box
    )
    core.close_stream(stream)
    assert answered.result().WhichOneof("event") == "acked"
    error = failed.exception()
    assert isinstance(error, RedirectError) and error.leader_address == "b2:2"
    assert isinstance(orphaned.exception(), StreamClosed)
    assert not core.send(stream, build, Future())  # a closed stream takes no more: the driver goes unary


def test_watchdog_finds_a_stream_whose_broker_stopped_answering() -> None:
    clock = Clock()
    core = make_core(clock, settings=Settings(timeout=5.0))
    stream, _ = primary(core)
    clock.now += 4.9
    assert core.hung_streams() == []
    clock.now += 0.2
    [hung] = core.hung_streams()  # the open was never answered
    assert hung is stream and isinstance(stream.hung, StreamTimeoutError) and "open" in str(stream.hung)
    assert core.hung_streams() == []  # reported once

    other, _ = primary(core, "b2:2")
    core.on_response(other, opened(serving=[0], leaders={}), Box)
    clock.now += 60
    assert core.hung_streams() == []  # opened, nothing outstanding: idle is fine
    core.send(other, lambda rid: work_pb2.WorkRequest(request_id=rid), Future())
    clock.now += 5.1
    assert core.hung_streams() == [other] and "a request" in str(other.hung)


def test_a_lost_lease_drops_a_waiting_job_and_flags_a_running_one() -> None:
    core = make_core(concurrency=1, prefetch=2)
    stream, box = primary(core)
    core.on_response(stream, job("r1"), Box)
    core.on_response(stream, job("r2"), Box)
    core.on_response(stream, work_pb2.WorkResponse(leases_lost=work_pb2.WorkLeasesLost(receipts=["r1", "r2"])), Box)
    running = core.held["r1"]
    assert running.job.lost.is_set() and "r2" not in core.held and not core.waiting
    assert box.events()[-1] == "credit"  # the dropped job's credit comes back
    assert core.settle(running, ack=True) is not None  # still settled: the broker may yet accept it


def test_heartbeats_group_by_stream_in_chunks_and_skip_settled_and_lost() -> None:
    core = make_core(concurrency=2000, prefetch=1000)
    stream, _ = primary(core)
    for i in range(HEARTBEAT_CHUNK + 3):
        core.on_response(stream, job(f"r{i}"), Box)
    core.settle(core.held["r0"], ack=True)
    core.lost(["r1"])
    beats = core.heartbeats()
    assert [len(b.unary.receipts) for _, b in beats] == [HEARTBEAT_CHUNK, 1]
    assert all(s is stream for s, _ in beats)
    assert "r0" not in beats[0][1].unary.receipts and "r1" not in beats[0][1].unary.receipts
    results = [message_pb2.HeartbeatResult(receipt="r2", outcome=message_pb2.HEARTBEAT_OUTCOME_LOST)]
    core.heartbeated(results)
    assert core.held["r2"].job.lost.is_set()


def test_heartbeat_interval_comes_from_the_open() -> None:
    core = make_core()
    stream, _ = primary(core)
    core.on_response(stream, opened(serving=[], leaders={}, heartbeat=7), Box)
    assert core.heartbeat_interval == 7.0


def test_what_follows_the_end_of_the_primary_stream() -> None:
    core = make_core()
    stream, _ = primary(core, "b1:1")
    with pytest.raises(CasqError):
        core.primary_ended(stream, CasqError(grpc.StatusCode.NOT_FOUND, "no such queue"))
    ended = core.primary_ended(stream, None)
    assert isinstance(ended.report, UnavailableError) and ended.fail_over and ended.pause
    outage = core.primary_ended(stream, UnavailableError(grpc.StatusCode.UNAVAILABLE, "down"))
    assert outage.report is not None and outage.fail_over and outage.pause
    stream.draining = True
    assert not core.primary_ended(stream, UnavailableError(grpc.StatusCode.UNAVAILABLE, "bye")).pause
    away = core.primary_ended(stream, RedirectError("moved", errors_pb2.LeaderRedirect(leader_address="b2:2")))
    assert away.follow == "b2:2" and not away.pause and not away.fail_over and away.report is None
    to_itself = core.primary_ended(stream, RedirectError("me", errors_pb2.LeaderRedirect(leader_address="b1:1")))
    assert to_itself.pause  # a broker that redirects to itself: back off instead of spinning
    core.redirects = 0
    follows = [
        core.primary_ended(stream, RedirectError("x", errors_pb2.LeaderRedirect(leader_address="b2:2"))).pause
        for _ in range(4)
    ]
    assert follows == [False, False, False, True]  # more redirects in a row than brokers: back off


def test_backoff_grows_and_resets_once_the_primary_stream_opens() -> None:
    core = make_core(settings=Settings(backoff_initial=0.1, backoff_max=1.0))
    delays = [core.pause_delay() for _ in range(6)]
    assert 0.05 <= delays[0] <= 0.1 and 0.5 <= delays[5] <= 1.0
    stream, _ = primary(core)
    core.on_response(stream, opened(serving=[], leaders={}), Box)
    assert core.failures == 0


def test_stop_half_closes_hands_back_waiting_jobs_and_abandons_late_handlers() -> None:
    core = make_core(concurrency=1, prefetch=3)
    stream, box = primary(core)
    core.on_response(stream, job("r1"), Box)
    core.on_response(stream, job("r2"), Box)
    running = core.held["r1"]
    assert [h.job.receipt for h in core.stop()] == ["r2"]
    assert box.events()[-1] == "half-close" and not stream.usable
    assert core.open_stream(PRIMARY, "b2:2", Box()) is None
    assert core.on_response(stream, job("r3"), Box).release[0].job.receipt == "r3"  # came after the half-close
    assert core.abandon() == [running]
    assert core.handler_done(running) == [] and "r1" not in core.held
    assert core.settle(running, ack=True) is None
    core.forget(core.held["r2"], credit=True)
    assert box.events()[-1] == "half-close"  # no credit once stopping



class SlowWriter:
    """An outbox whose writer has not taken anything yet: acks put meanwhile gather in one batch."""

    def __init__(self) -> None:
        self.items: list[work_pb2.WorkRequest | AckBatch | None] = []

    def put_nowait(self, item: work_pb2.WorkRequest | AckBatch | None, /) -> None:
        self.items.append(item)


def test_acks_made_while_the_writer_is_busy_go_as_one_request_and_each_job_reads_its_own_result() -> None:
    core = make_core(concurrency=3, prefetch=3)
    box = SlowWriter()
    stream = core.open_stream(PRIMARY, "b1:1", box)
    assert stream is not None
    stream.cancel = lambda: None
    for receipt in ("r1", "r2", "r3"):
        core.on_response(stream, job(receipt), Box)
    assert all(h.in_handler for h in core.held.values())  # started as they came
    settles = []
    waiters = []
    for receipt in ("r1", "r2"):
        held = core.held[receipt]
        core.handler_done(held)
        settle = core.settle(held, ack=True)
        assert settle is not None
        settles.append(settle)
        waiters.append(core.send(stream, settle.stream_request, Future()))
    assert waiters[0] is not None and waiters[1] is waiters[0]  # the second joined the first's batch
    batches = [item for item in box.items if isinstance(item, AckBatch)]
    assert len(batches) == 1
    sent = batches[0].take()
    assert list(sent.ack.receipts) == ["r1", "r2"]
    # Taken: the next ack opens a batch of its own.
    third = core.settle(core.held["r3"], ack=True)
    assert third is not None
    assert core.send(stream, third.stream_request, Future()) is not waiters[0]
    assert len([item for item in box.items if isinstance(item, AckBatch)]) == 2

    reply = work_pb2.WorkResponse(
        request_id=sent.request_id,
        acked=work_pb2.WorkAcked(
            results=[
                message_pb2.AckResult(receipt="r1", outcome=message_pb2.ACK_OUTCOME_ACKED),
                message_pb2.AckResult(receipt="r2", outcome=message_pb2.ACK_OUTCOME_LEASE_LOST),
            ]
        ),
    )
    core.on_response(stream, reply, Box)
    answer = waiters[0].result() if isinstance(waiters[0], Future) else None
    assert answer is not None
    assert settles[0].from_reply(answer) == []
    lost = settles[1].from_reply(answer)
    assert len(lost) == 1 and isinstance(lost[0], LeaseLostError) and lost[0].receipt == "r2"

    # A stream that ends fails the batch not sent yet (each job then goes unary), and takes no more.
    core.close_stream(stream)
    assert not core.send(stream, third.stream_request, Future())


def test_an_ack_batch_holds_at_most_ack_batch_receipts() -> None:
    batch = AckBatch(7, "r0")
    assert all(batch.add(f"r{i}") for i in range(1, ACK_BATCH))
    assert not batch.add("one-too-many")
    request = batch.take()
    assert request.request_id == 7 and len(request.ack.receipts) == ACK_BATCH
    assert not AckBatch(8, "a").take().ack.receipts[1:]  # one receipt alone
    taken = AckBatch(9, "a")
    taken.take()
    assert not taken.add("b")  # sent: nothing joins it
