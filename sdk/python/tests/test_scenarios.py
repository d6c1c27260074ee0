"""Runs the language-neutral SDK scenarios of test/scenarios/*.json with the Python SDK.

The spec is test/scenarios/README.md. Each scenario, loaded and validated
against the schema by scenario_file.py, gets its own brokers on a fresh file
store, one casq.Client over all of them, a fresh queue made with casq.Admin,
and its steps run in order.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, assert_never

import pytest
from brokers import BROKER_START_TIMEOUT, REPO_ROOT, Broker, Lines, start_casq_serve
import scenario_file
from scenario_file import (
    SCENARIO_DIR,
    SCHEMA_PATH,
    SCHEMA_STEP_KINDS,
    STEP_KINDS,
    Action,
    AwaitLeaseLapse,
    AwaitWorker,
    CrashWorker,
    DeadLetters,
    Enqueue,
    ExpectLeaders,
    FreezeBroker,
    Message,
    Produce,
    QueueSpec,
    Redrive,
    RestartBroker,
    Scenario,
    ScenarioError,
    StartWorker,
    Stats,
    StopWorker,
    load,
    parse_scenario,
    scenario_files,
)

import casq
from casq.v1 import admin_service_pb2

SCENARIOS = scenario_files()
CRASH_WORKER = Path(__file__).resolve().parent / "scenario_crash_worker.py"
POLL = 0.05


def _proto_fields(descriptor: Any) -> dict[str, str]:
    """camelCase (JSON) name -> proto field name, for the integer fields of a stats message."""
    return {f.json_name: f.name for f in descriptor.fields if f.message_type is None}


STATS_FIELDS = _proto_fields(admin_service_pb2.SubscriptionStats.DESCRIPTOR)
COUNTER_FIELDS = _proto_fields(admin_service_pb2.SubscriptionCounters.DESCRIPTOR)


# -- processes ----------------------------------------------------------------


def start_broker(store: Path, listen: str = "127.0.0.1:0") -> Broker:
    """A scenario broker: `casq serve` on the scenario's file store, with the spec's flags."""
    return start_casq_serve(f"file:{store}", listen, "--leader-lease", "2s")


# -- workers ----------------------------------------------------------------------


class WorkerRun:
    """One ``startWorker``: an SDK worker run in a background thread, recording its handler calls."""

    def __init__(self, client: casq.Client, queue: str, step: StartWorker) -> None:
        self.step = step
        self.worker = casq.Worker(client)
        self.lock = threading.Lock()
        self.invocations: list[tuple[str, int]] = []  # (payload, attempt), in the order handlers started
        self.started = 0
        self.completed = 0
        self.error: BaseException | None = None
        lease_ttl = step.lease_ttl_ms / 1000 if step.lease_ttl_ms is not None else None

        def run() -> None:
            try:
                self.worker.run(
                    queue,
                    self.handle,
                    subscription=step.subscription,
                    concurrency=step.concurrency,
                    prefetch=step.prefetch,
                    lease_ttl=lease_ttl,
                )
            except BaseException as error:  # noqa: BLE001 - reported by stopWorker / awaitWorker
                self.error = error

        self.thread = threading.Thread(target=run, name=f"scenario-worker-{step.name}", daemon=True)
        self.thread.start()

    def handle(self, job: casq.Job) -> None:
        with self.lock:
            self.invocations.append((job.text(), job.attempt))
            self.started += 1
        try:
            if self.step.handler_ms:
                time.sleep(self.step.handler_ms / 1000)
            if self.step.handler == "nack":
                raise RuntimeError("scenario handler: nack")
            if self.step.handler == "deadLetter":
                raise casq.DeadLetter("scenario handler: dead letter")
        finally:
            with self.lock:
                self.completed += 1

    def snapshot(self) -> tuple[int, int, list[tuple[str, int]]]:
        with self.lock:
            return self.started, self.completed, list(self.invocations)


# -- running ------------------------------------------------------------------------


def queue_name(scenario: str) -> str:
    """``py-<scenario>-<suffix>``: at most 100 characters of [a-z0-9-]."""
    suffix = uuid.uuid4().hex[:8]
    base = re.sub(r"[^a-z0-9-]", "-", scenario.lower())[: 100 - len("py--") - len(suffix)]
    return f"py-{base}-{suffix}"


def wait_until(condition: Callable[[], bool], timeout: float, describe: Callable[[], str]) -> None:
    """Bounded poll: returns once ``condition()`` holds, else fails with ``describe()``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise ScenarioError(f"timed out after {timeout:g}s: {describe()}")
        time.sleep(POLL)


def same_multiset(seen: list[str], expected: list[str]) -> bool:
    return Counter(seen) == Counter(expected)


@dataclass
class Run:
    """The live state of one scenario: brokers, client, queue, workers, remembered dedup ids."""

    scenario: Scenario
    store: Path
    brokers: list[Broker] = field(default_factory=list)
    workers: dict[str, WorkerRun] = field(default_factory=dict)
    dedup_ids: dict[str, str] = field(default_factory=dict)
    children: list[subprocess.Popen[str]] = field(default_factory=list)
    # Indexes of the brokers frozen (SIGSTOP) and not thawed yet.
    frozen: set[int] = field(default_factory=set)
    # Output of brokers that were restarted, for the failure message.
    retired_logs: list[str] = field(default_factory=list)
    client: casq.Client | None = None
    queue: str = ""

    @property
    def admin(self) -> casq.Admin:
        assert self.client is not None
        return casq.Admin(self.client)

    @property
    def producer(self) -> casq.Producer:
        assert self.client is not None
        return casq.Producer(self.client)

    def setup(self) -> None:
        for _ in range(self.scenario.brokers):
            self.brokers.append(start_broker(self.store))
        # Unary calls retry across redirects and brokers for up to 30 s (a
        # killed leader's shards wait out its leader lease before moving).
        self.client = casq.Client(brokers=[b.address for b in self.brokers], timeout=10.0, retry_timeout=30.0)
        self.queue = queue_name(self.scenario.name)
        spec = self.scenario.queue
        backoff = spec.backoff_ms / 1000
        self.admin.create_queue(
            self.queue,
            spec.shards,
            lease_ttl=spec.lease_ttl_ms / 1000,
            max_attempts=spec.max_attempts,
            backoff_initial=backoff,
            backoff_max=backoff,
            backoff_multiplier=1.0,
            backoff_jitter=0.0,
        )
        for subscription in self.scenario.subscriptions:
            self.admin.create_subscription(self.queue, subscription, start="earliest")

    def teardown(self) -> None:
        for run in self.workers.values():
            if run.thread.is_alive():
                run.worker.stop(timeout=1.0)
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
            child.wait()
        for index in self.frozen:
            self.brokers[index].process.send_signal(signal.SIGCONT)
        for broker in self.brokers:
            broker.kill()
        if self.client is not None:
            self.client.close()
        shutil.rmtree(self.store, ignore_errors=True)

    def broker_logs(self) -> str:
        lines: list[str] = list(self.retired_logs)
        for i, broker in enumerate(self.brokers):
            lines += [f"  broker {i} ({broker.address}): {line}" for line in broker.output.seen[-20:]]
        return "\n".join(lines)

    # -- steps --------------------------------------------------------------

    def step(self, action: Action) -> None:
        if isinstance(action, Enqueue):
            self.enqueue(action)
        elif isinstance(action, Produce):
            self.produce(action)
        elif isinstance(action, RestartBroker):
            self.restart_broker(action.broker)
        elif isinstance(action, ExpectLeaders):
            self.expect_leaders(action.distinct)
        elif isinstance(action, FreezeBroker):
            self.freeze_broker(action)
        elif isinstance(action, AwaitLeaseLapse):
            self.await_lease_lapse(action)
        elif isinstance(action, StartWorker):
            if action.name in self.workers:
                raise ScenarioError(f"worker {action.name!r} was already started")
            assert self.client is not None
            self.workers[action.name] = WorkerRun(self.client, self.queue, action)
        elif isinstance(action, AwaitWorker):
            self.await_worker(action)
        elif isinstance(action, StopWorker):
            self.stop_worker(action)
        elif isinstance(action, CrashWorker):
            self.crash_worker(action)
        elif isinstance(action, Stats):
            self.stats(action)
        elif isinstance(action, DeadLetters):
            letters = self.admin.list_dead_letters(self.queue, action.subscription)
            payloads = [letter.message.payload.decode() for letter in letters]
            if not same_multiset(payloads, action.expect):
                raise ScenarioError(f"dead letters {payloads}, expected {action.expect} (any order)")
        elif isinstance(action, Redrive):
            redriven = self.admin.redrive(self.queue, action.subscription).redriven
            if redriven != action.expect:
                raise ScenarioError(f"redrove {redriven} dead letters, expected {action.expect}")
        else:
            assert_never(action)

    def enqueue(self, step: Enqueue) -> None:
        messages = [
            casq.NewMessage(
                payload=m.payload.encode(),
                key=m.key,
                priority=m.priority,
                delay=m.delay_ms / 1000 if m.delay_ms is not None else None,
                headers=m.headers,
                max_attempts=m.max_attempts,
                dedup_id=m.dedup_id,
            )
            for m in step.messages
        ]
        via: casq.Client | None = None
        producer = self.producer
        if step.via is not None:
            # Only this broker is known; the SDK still follows redirects from it.
            via = casq.Client(brokers=[self.brokers[step.via].address], timeout=10.0, retry_timeout=30.0)
            producer = casq.Producer(via)
        try:
            if step.batch:
                results = producer.enqueue_batch(self.queue, messages)
            else:
                results = [producer.enqueue_batch(self.queue, [message])[0] for message in messages]
        finally:
            if via is not None:
                via.close()
        if len(results) != len(messages):
            raise ScenarioError(f"{len(results)} results for {len(messages)} messages")
        for i, (message, result) in enumerate(zip(step.messages, results, strict=True)):
            if not result.id:
                raise ScenarioError(f"message {i} ({message.payload!r}): empty id")
            if step.expect_duplicate is not None and result.duplicate != step.expect_duplicate[i]:
                raise ScenarioError(
                    f"message {i} ({message.payload!r}): duplicate={result.duplicate}, "
                    f"expected {step.expect_duplicate[i]}"
                )
            if message.dedup_id is None:
                continue
            remembered = self.dedup_ids.get(message.dedup_id)
            if result.duplicate:
                if remembered != result.id:
                    raise ScenarioError(
                        f"message {i} ({message.payload!r}): duplicate of dedup id {message.dedup_id!r} "
                        f"carries id {result.id!r}, expected {remembered!r}"
                    )
            else:
                self.dedup_ids[message.dedup_id] = result.id

    def produce(self, step: Produce) -> None:
        for i in range(step.count + 1):
            if step.kill_leader_after == i:
                self.kill_leader()
            if i == step.count:
                break
            payload = f"{step.prefix}{i}"
            result = self.producer.enqueue(self.queue, payload.encode(), dedup_id=payload)
            if not result.id:
                raise ScenarioError(f"enqueue {i} ({payload!r}): empty id")
            self.dedup_ids.setdefault(payload, result.id)

    def restart_broker(self, index: int) -> None:
        old = self.brokers[index]
        old.terminate(BROKER_START_TIMEOUT)
        self.retired_logs += [f"  broker {index} before restart ({old.address}): {line}" for line in old.output.seen[-20:]]
        # Same address and store, so that clients configured with the old address reach it.
        new = start_broker(self.store, listen=old.address)
        self.brokers[index] = new
        if new.address != old.address:
            raise ScenarioError(f"broker {index} restarted on {new.address}, expected {old.address}")

    def freeze_broker(self, step: FreezeBroker) -> None:
        """SIGSTOP (freeze) or SIGCONT: a frozen process keeps its connections open and answers nothing."""
        if (step.broker in self.frozen) == step.freeze:
            raise ScenarioError(f"broker {step.broker} is {'already' if step.freeze else 'not'} frozen")
        self.brokers[step.broker].process.send_signal(signal.SIGSTOP if step.freeze else signal.SIGCONT)
        if step.freeze:
            self.frozen.add(step.broker)
        else:
            self.frozen.discard(step.broker)

    def await_lease_lapse(self, step: AwaitLeaseLapse) -> None:
        """Waits until no shard names broker *i* as its live leader, asking only brokers not frozen."""
        address = self.brokers[step.broker].address
        others = [b.address for i, b in enumerate(self.brokers) if i not in self.frozen]
        if not others:
            raise ScenarioError("every broker is frozen: none to ask")
        last = ["no answer yet"]
        with casq.Client(brokers=others, timeout=2.0, retry_timeout=2.0) as client:
            admin = casq.Admin(client)

            def lapsed() -> bool:
                try:
                    described = admin.get_queue(self.queue)
                except casq.CasqError as error:
                    last[0] = str(error)
                    return False
                now = time.time()
                held = [
                    s.shard
                    for s in described.shards
                    if s.HasField("leader")
                    and s.leader.address == address
                    and s.leader.lease_until.ToNanoseconds() / 1e9 > now
                ]
                last[0] = f"shards still led by {address}: {held}"
                return not held

            wait_until(
                lapsed,
                step.timeout_ms / 1000,
                lambda: f"the leases of broker {step.broker} did not lapse: {last[0]}",
            )

    def expect_leaders(self, distinct: int) -> None:
        described = self.admin.get_queue(self.queue)
        now = time.time()
        leaders = {
            shard.leader.address
            for shard in described.shards
            if shard.HasField("leader") and shard.leader.lease_until.ToNanoseconds() / 1e9 > now
        }
        if len(leaders) != distinct:
            shards = [(s.shard, s.leader.address if s.HasField("leader") else None) for s in described.shards]
            raise ScenarioError(f"shards are led by {sorted(leaders)} ({len(leaders)}), expected {distinct}: {shards}")

    def kill_leader(self) -> None:
        described = self.admin.get_queue(self.queue)
        if not described.shards or not described.shards[0].HasField("leader"):
            raise ScenarioError("GetQueue shows no leader for shard 0")
        address = described.shards[0].leader.address
        matching = [b for b in self.brokers if b.address == address]
        if not matching:
            addresses = [b.address for b in self.brokers]
            raise ScenarioError(f"shard 0 leader {address!r} is none of the brokers {addresses}")
        matching[0].kill()

    def worker(self, name: str) -> WorkerRun:
        run = self.workers.get(name)
        if run is None:
            raise ScenarioError(f"no worker named {name!r} was started")
        return run

    def await_worker(self, step: AwaitWorker) -> None:
        run = self.worker(step.name)

        def reached() -> bool:
            if run.error is not None:
                raise ScenarioError(f"worker {step.name!r} run failed: {run.error!r}")
            started, completed, invocations = run.snapshot()
            current = {
                "started": started,
                "completed": completed,
                "distinctPayloads": len({payload for payload, _ in invocations}),
            }[step.condition]
            return current >= step.target

        def describe() -> str:
            started, completed, invocations = run.snapshot()
            return (
                f"worker {step.name!r} wanted {step.condition} >= {step.target}; started={started} "
                f"completed={completed} distinct payloads={len({p for p, _ in invocations})} "
                f"invocations={invocations[:20]}"
            )

        wait_until(reached, step.timeout_ms / 1000, describe)
        _, _, invocations = run.snapshot()
        if step.expect is not None:
            payloads = [payload for payload, _ in invocations[: len(step.expect)]]
            ok = payloads == step.expect if step.ordered else same_multiset(payloads, step.expect)
            if not ok:
                order = "in order" if step.ordered else "any order"
                raise ScenarioError(f"first payloads {payloads}, expected {step.expect} ({order}); all: {invocations}")
        if step.expect_attempts is not None:
            attempts = [attempt for _, attempt in invocations[: len(step.expect_attempts)]]
            if attempts != step.expect_attempts:
                raise ScenarioError(f"first attempts {attempts}, expected {step.expect_attempts}; all: {invocations}")
        if step.expect_all_of is not None:
            prefix, count = step.expect_all_of
            seen = {payload for payload, _ in invocations}
            missing = [f"{prefix}{i}" for i in range(count) if f"{prefix}{i}" not in seen]
            if missing:
                raise ScenarioError(f"payloads never seen: {missing}")

    def stop_worker(self, step: StopWorker) -> None:
        run = self.worker(step.name)
        grace = step.timeout_ms / 1000
        run.worker.stop(timeout=grace)
        run.thread.join(grace + 5.0)
        if run.thread.is_alive():
            raise ScenarioError(f"worker {step.name!r} run did not end after stop({grace:g})")
        if run.error is not None:
            raise ScenarioError(f"worker {step.name!r} run ended with an error: {run.error!r}")
        started, completed, invocations = run.snapshot()
        if step.expect_started is not None and started != step.expect_started:
            raise ScenarioError(f"started={started}, expected {step.expect_started}; invocations={invocations}")
        if step.expect_completed is not None and completed != step.expect_completed:
            raise ScenarioError(f"completed={completed}, expected {step.expect_completed}; invocations={invocations}")

    def crash_worker(self, step: CrashWorker) -> None:
        child = subprocess.Popen(
            [
                sys.executable,
                str(CRASH_WORKER),
                "--brokers",
                ",".join(b.address for b in self.brokers),
                "--queue",
                self.queue,
                "--subscription",
                step.subscription,
                "--jobs",
                str(step.jobs),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.children.append(child)
        output = Lines(child)
        payloads: list[str] = []
        deadline = time.monotonic() + step.timeout_ms / 1000
        try:
            while len(payloads) < step.jobs:
                line = output.next(deadline)
                if line is None:
                    raise ScenarioError(f"crash worker exited ({child.wait()}) after {payloads}")
                if line.startswith("STARTED "):
                    payloads.append(line[len("STARTED ") :])
        except TimeoutError:
            raise ScenarioError(f"crash worker started {payloads}, wanted {step.jobs}; stdout: {output.seen}") from None
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
            child.wait()
        if not same_multiset(payloads, step.expect):
            raise ScenarioError(f"crash worker started {payloads}, expected {step.expect} (any order)")

    def stats(self, step: Stats) -> None:
        last: dict[str, int] = {}

        def matches() -> bool:
            nonlocal last
            described = self.admin.get_queue(self.queue)
            entry = next((s for s in described.subscriptions if s.subscription == step.subscription), None)
            if entry is None:
                raise ScenarioError(f"GetQueue has no subscription {step.subscription!r}")
            last = {key: int(getattr(entry, STATS_FIELDS[key])) for key in step.expect}
            last.update({key: int(getattr(entry.counters, COUNTER_FIELDS[key])) for key in step.counters})
            return all(last[key] == value for key, value in {**step.expect, **step.counters}.items())

        deadline = time.monotonic() + step.timeout_ms / 1000
        while not matches():
            if time.monotonic() >= deadline:
                raise ScenarioError(
                    f"subscription {step.subscription!r} stats {last}, expected {step.expect} "
                    f"and counters {step.counters} within {step.timeout_ms} ms"
                )
            time.sleep(0.1)


def run_scenario(scenario: Scenario) -> None:
    run = Run(scenario, Path(tempfile.mkdtemp(prefix=f"casq-py-{scenario.name}-")))
    try:
        try:
            run.setup()
        except Exception as error:
            raise AssertionError(
                f"scenario {scenario.name!r} setup: {type(error).__name__}: {error}\n{run.broker_logs()}"
            ) from error
        for step in scenario.steps:
            try:
                run.step(step.action)
            except Exception as error:
                raise AssertionError(
                    f"scenario {scenario.name!r} step {step.index} ({step.do}): "
                    f"{type(error).__name__}: {error}\nbroker output:\n{run.broker_logs()}"
                ) from error
    finally:
        run.teardown()


def test_scenarios_found() -> None:
    assert SCENARIOS, f"no scenarios in {SCENARIO_DIR}"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    run_scenario(load(path))


def test_every_scenario_file_validates() -> None:
    for path in SCENARIOS:
        load(path)


def test_step_kinds_match_the_schema() -> None:
    """The kinds this runner builds (and Run.step runs: mypy checks it is exhaustive) are the schema's."""
    assert sorted(STEP_KINDS) == sorted(SCHEMA_STEP_KINDS)


BASE: dict[str, Any] = {"name": "x", "steps": [{"do": "redrive", "expect": 0}]}
# The loader cases all three runners share.
LOADER_CASES: dict[str, list[dict[str, Any]]] = json.loads((SCENARIO_DIR / "loader-cases" / "cases.json").read_text())


def with_steps(*steps: dict[str, Any], brokers: int = 1) -> dict[str, Any]:
    return {**BASE, "brokers": brokers, "steps": list(steps)}


@pytest.mark.parametrize("case", LOADER_CASES["refused"], ids=[c["why"] for c in LOADER_CASES["refused"]])
def test_loader_refuses(case: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(case["scenario"], "bad.json")
    message = str(caught.value)
    assert message.startswith("bad.json: ")
    for mention in case["mentions"]:
        assert mention in message


@pytest.mark.parametrize("case", LOADER_CASES["accepted"], ids=[c["why"] for c in LOADER_CASES["accepted"]])
def test_loader_accepts(case: dict[str, Any]) -> None:
    parse_scenario(case["scenario"], "ok.json")


def test_loader_refuses_a_field_no_builder_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A field the schema allows but this runner ignores fails the load instead of being skipped."""
    step = {"do": "enqueue", "messages": [{"payload": "a", "dedupId": "d"}]}
    parse_scenario(with_steps(step), "ok.json")
    monkeypatch.setattr(scenario_file, "_message", lambda m: Message(payload=m["payload"]))
    assert "step 0 (enqueue) messages/0: 'dedupId'" in refused(with_steps(step))
    monkeypatch.setitem(STEP_KINDS, "redrive", lambda s: Redrive("default", 0))
    assert "step 0 (redrive): 'expect'" in refused(BASE)


def refused(case: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(case, "bad.json")
    return str(caught.value)


def test_loader_lists_every_problem() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario({**BASE, "extra": 1, "steps": [{"do": "restartBroker"}, {"do": "teleport"}]}, "bad.json")
    assert str(caught.value).startswith(f"bad.json: not a valid scenario ({SCHEMA_PATH}):\n")
    lines = str(caught.value).splitlines()[1:]
    assert lines[0] == "  top level: Additional properties are not allowed ('extra' was unexpected)"
    assert lines[1] == "  step 0 (restartBroker): 'broker' is a required property"
    assert lines[2].startswith("  step 1 (teleport) do: 'teleport' is not one of ['enqueue', 'produce', ")


def test_loader_accepts_and_fills_in_the_schemas_defaults() -> None:
    scenario = parse_scenario(
        with_steps(
            {"do": "stats", "expect": {"ready": 0}},
            {"do": "awaitLeaseLapse", "broker": 0},
            {"do": "startWorker", "name": "w", "handler": "ack", "subscription": "s"},
        ),
        "ok",
    )
    assert scenario.brokers == 1 and scenario.subscriptions == []
    assert scenario.queue == QueueSpec(shards=1, lease_ttl_ms=2000, max_attempts=None, backoff_ms=100)
    assert [s.action for s in scenario.steps] == [
        Stats(subscription="default", expect={"ready": 0}, counters={}, timeout_ms=10000),
        AwaitLeaseLapse(broker=0, timeout_ms=20000),
        StartWorker(
            name="w", subscription="s", concurrency=1, prefetch=1, handler="ack", handler_ms=0, lease_ttl_ms=None
        ),
    ]
    steps = [
        {"do": "restartBroker", "broker": 1},
        {"do": "enqueue", "via": 1, "messages": [{"payload": "a", "headers": {"Any-Name": "v"}}]},
        {"do": "expectLeaders", "distinct": 2},
        {"do": "freezeBroker", "broker": 1},
        {"do": "awaitLeaseLapse", "broker": 1, "timeoutMs": 5000},
        {"do": "thawBroker", "broker": 1},
    ]
    assert [s.do for s in parse_scenario(with_steps(*steps, brokers=2), "ok").steps] == [s["do"] for s in steps]
