"""Runs the language-neutral SDK scenarios of test/scenarios/*.json with the Python SDK.

The spec is test/scenarios/README.md. Each scenario gets its own brokers on a
fresh file store, one casq.Client over all of them, a fresh queue made with
casq.Admin, and its steps run in order. Parsing is strict: an unknown field
or step fails the scenario rather than being skipped.
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
from typing import Any

import pytest
from brokers import BROKER_START_TIMEOUT, REPO_ROOT, Broker, Lines, start_casq_serve

import casq
from casq.v1 import admin_service_pb2

SCENARIO_DIR = REPO_ROOT / "test" / "scenarios"
SCENARIOS = sorted(SCENARIO_DIR.glob("*.json"))
CRASH_WORKER = Path(__file__).resolve().parent / "scenario_crash_worker.py"
POLL = 0.05


class ScenarioError(Exception):
    """A malformed scenario file or a failed expectation."""


# -- strict parsing -------------------------------------------------------------


class Fields:
    """Typed reads of one JSON object's fields; :meth:`done` rejects the fields nobody read."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise ScenarioError(f"{where}: expected an object, got {value!r}")
        self.value: dict[str, Any] = value
        self.where = where
        self.read: set[str] = set()

    def _get(self, key: str) -> object:
        self.read.add(key)
        return self.value.get(key)

    def has(self, key: str) -> bool:
        return key in self.value

    def opt_int(self, key: str, default: int | None = None) -> int | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{self.where}.{key}: expected an integer, got {value!r}")
        return value

    def req_int(self, key: str) -> int:
        value = self.opt_int(key)
        if value is None:
            raise ScenarioError(f"{self.where}.{key} is required")
        return value

    def opt_str(self, key: str, default: str | None = None) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ScenarioError(f"{self.where}.{key}: expected a string, got {value!r}")
        return value

    def req_str(self, key: str) -> str:
        value = self.opt_str(key)
        if value is None:
            raise ScenarioError(f"{self.where}.{key} is required")
        return value

    def opt_bool(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ScenarioError(f"{self.where}.{key}: expected true or false, got {value!r}")
        return value

    def opt_list(self, key: str) -> list[object] | None:
        value = self._get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise ScenarioError(f"{self.where}.{key}: expected an array, got {value!r}")
        return value

    def str_list(self, key: str) -> list[str] | None:
        items = self.opt_list(key)
        if items is not None and not all(isinstance(item, str) for item in items):
            raise ScenarioError(f"{self.where}.{key}: expected an array of strings, got {items!r}")
        return [str(item) for item in items] if items is not None else None

    def int_list(self, key: str) -> list[int] | None:
        items = self.opt_list(key)
        if items is None:
            return None
        out: list[int] = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int):
                raise ScenarioError(f"{self.where}.{key}: expected an array of integers, got {items!r}")
            out.append(item)
        return out

    def bool_list(self, key: str) -> list[bool] | None:
        items = self.opt_list(key)
        if items is None:
            return None
        out: list[bool] = []
        for item in items:
            if not isinstance(item, bool):
                raise ScenarioError(f"{self.where}.{key}: expected an array of booleans, got {items!r}")
            out.append(item)
        return out

    def obj(self, key: str) -> Fields | None:
        value = self._get(key)
        return None if value is None else Fields(value, f"{self.where}.{key}")

    def str_map(self, key: str) -> dict[str, str] | None:
        value = self._get(key)
        if value is None:
            return None
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ScenarioError(f"{self.where}.{key}: expected an object of strings, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}

    def int_map(self, key: str) -> dict[str, int] | None:
        value = self._get(key)
        if value is None:
            return None
        if not isinstance(value, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value.values()
        ):
            raise ScenarioError(f"{self.where}.{key}: expected an object of integers, got {value!r}")
        return {str(k): int(v) for k, v in value.items()}

    def done(self) -> None:
        unknown = sorted(set(self.value) - self.read)
        if unknown:
            raise ScenarioError(f"{self.where}: unknown field(s) {', '.join(unknown)}")


def positive(value: int | None, where: str) -> int | None:
    if value is not None and value < 0:
        raise ScenarioError(f"{where}: must not be negative, got {value}")
    return value


@dataclass
class QueueSpec:
    shards: int = 1
    lease_ttl_ms: int = 2000
    max_attempts: int | None = None
    backoff_ms: int = 100


@dataclass
class Message:
    payload: str
    key: str | None = None
    priority: int = 0
    delay_ms: int | None = None
    max_attempts: int | None = None
    dedup_id: str | None = None
    headers: dict[str, str] | None = None


@dataclass
class Enqueue:
    batch: bool
    messages: list[Message]
    expect_duplicate: list[bool] | None
    via: int | None = None  # send through a client that knows only this broker


@dataclass
class RestartBroker:
    broker: int


@dataclass
class ExpectLeaders:
    distinct: int


@dataclass
class FreezeBroker:
    """freezeBroker (SIGSTOP, ``freeze`` true) or thawBroker (SIGCONT)."""

    broker: int
    freeze: bool


@dataclass
class AwaitLeaseLapse:
    broker: int
    timeout_ms: int


@dataclass
class Produce:
    count: int
    prefix: str
    kill_leader_after: int | None


@dataclass
class StartWorker:
    name: str
    subscription: str
    concurrency: int
    prefetch: int
    handler: str
    handler_ms: int
    lease_ttl_ms: int | None


@dataclass
class AwaitWorker:
    name: str
    condition: str  # started | completed | distinctPayloads
    target: int
    timeout_ms: int
    expect: list[str] | None
    ordered: bool
    expect_attempts: list[int] | None
    expect_all_of: tuple[str, int] | None


@dataclass
class StopWorker:
    name: str
    timeout_ms: int
    expect_started: int | None
    expect_completed: int | None


@dataclass
class CrashWorker:
    subscription: str
    jobs: int
    expect: list[str]
    timeout_ms: int


@dataclass
class Stats:
    subscription: str
    expect: dict[str, int]
    counters: dict[str, int]
    timeout_ms: int


@dataclass
class DeadLetters:
    subscription: str
    expect: list[str]


@dataclass
class Redrive:
    subscription: str
    expect: int


Action = (
    Enqueue
    | Produce
    | RestartBroker
    | ExpectLeaders
    | FreezeBroker
    | AwaitLeaseLapse
    | StartWorker
    | AwaitWorker
    | StopWorker
    | CrashWorker
    | Stats
    | DeadLetters
    | Redrive
)


@dataclass
class Step:
    index: int
    do: str
    action: Action


@dataclass
class Scenario:
    name: str
    brokers: int
    queue: QueueSpec
    subscriptions: list[str]
    steps: list[Step]


def _proto_fields(descriptor: Any) -> dict[str, str]:
    """camelCase (JSON) name -> proto field name, for the integer fields of a stats message."""
    return {f.json_name: f.name for f in descriptor.fields if f.message_type is None}


STATS_FIELDS = _proto_fields(admin_service_pb2.SubscriptionStats.DESCRIPTOR)
COUNTER_FIELDS = _proto_fields(admin_service_pb2.SubscriptionCounters.DESCRIPTOR)
STATS_FIELDS.pop("subscription", None)
HANDLERS = ("ack", "nack", "deadLetter")


def parse_message(fields: Fields) -> Message:
    message = Message(
        payload=fields.req_str("payload"),
        key=fields.opt_str("key"),
        priority=fields.opt_int("priority", 0) or 0,
        delay_ms=positive(fields.opt_int("delayMs"), f"{fields.where}.delayMs"),
        max_attempts=positive(fields.opt_int("maxAttempts"), f"{fields.where}.maxAttempts"),
        dedup_id=fields.opt_str("dedupId"),
        headers=fields.str_map("headers"),
    )
    fields.done()
    return message


def parse_stats_fields(values: dict[str, int] | None, known: dict[str, str], where: str) -> dict[str, int]:
    for key in values or {}:
        if key not in known:
            raise ScenarioError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(known))})")
    return dict(values or {})


def parse_action(do: str, f: Fields) -> Action:
    where = f.where
    if do == "enqueue":
        raw = f.opt_list("messages")
        if not raw:
            raise ScenarioError(f"{where}.messages: at least one message is required")
        messages = [parse_message(Fields(item, f"{where}.messages[{i}]")) for i, item in enumerate(raw)]
        expect_duplicate = f.bool_list("expectDuplicate")
        if expect_duplicate is not None and len(expect_duplicate) != len(messages):
            raise ScenarioError(f"{where}.expectDuplicate: needs one flag per message")
        via = positive(f.opt_int("via"), f"{where}.via")
        return Enqueue(f.opt_bool("batch", False), messages, expect_duplicate, via)
    if do == "restartBroker":
        return RestartBroker(positive(f.req_int("broker"), f"{where}.broker") or 0)
    if do in ("freezeBroker", "thawBroker"):
        return FreezeBroker(positive(f.req_int("broker"), f"{where}.broker") or 0, do == "freezeBroker")
    if do == "awaitLeaseLapse":
        broker = positive(f.req_int("broker"), f"{where}.broker") or 0
        return AwaitLeaseLapse(broker, positive(f.opt_int("timeoutMs", 20000), f"{where}.timeoutMs") or 0)
    if do == "expectLeaders":
        distinct = f.req_int("distinct")
        if distinct < 1:
            raise ScenarioError(f"{where}.distinct: must be at least 1")
        return ExpectLeaders(distinct)
    if do == "produce":
        count = positive(f.req_int("count"), f"{where}.count") or 0
        kill = positive(f.opt_int("killLeaderAfter"), f"{where}.killLeaderAfter")
        if kill is not None and kill > count:
            raise ScenarioError(f"{where}.killLeaderAfter: above count")
        return Produce(count, f.req_str("prefix"), kill)
    if do == "startWorker":
        concurrency = f.opt_int("concurrency", 1) or 0
        if concurrency < 1:
            raise ScenarioError(f"{where}.concurrency: must be at least 1")
        handler = f.req_str("handler")
        if handler not in HANDLERS:
            raise ScenarioError(f"{where}.handler: unknown handler {handler!r} (known: {', '.join(HANDLERS)})")
        return StartWorker(
            name=f.req_str("name"),
            subscription=f.opt_str("subscription", "default") or "default",
            concurrency=concurrency,
            prefetch=positive(f.opt_int("prefetch", concurrency), f"{where}.prefetch") or concurrency,
            handler=handler,
            handler_ms=positive(f.opt_int("handlerMs", 0), f"{where}.handlerMs") or 0,
            lease_ttl_ms=positive(f.opt_int("leaseTtlMs"), f"{where}.leaseTtlMs"),
        )
    if do == "awaitWorker":
        conditions = [(key, f.opt_int(key)) for key in ("started", "completed", "distinctPayloads")]
        given = [(key, value) for key, value in conditions if value is not None]
        if len(given) != 1:
            raise ScenarioError(f"{where}: needs exactly one of started, completed, distinctPayloads")
        all_of = f.obj("expectAllOf")
        expect_all_of = None
        if all_of is not None:
            expect_all_of = (all_of.req_str("prefix"), all_of.req_int("count"))
            all_of.done()
        return AwaitWorker(
            name=f.req_str("name"),
            condition=given[0][0],
            target=given[0][1] or 0,
            timeout_ms=f.opt_int("timeoutMs", 30000) or 0,
            expect=f.str_list("expect"),
            ordered=f.opt_bool("ordered", False),
            expect_attempts=f.int_list("expectAttempts"),
            expect_all_of=expect_all_of,
        )
    if do == "stopWorker":
        return StopWorker(
            name=f.req_str("name"),
            timeout_ms=f.opt_int("timeoutMs", 10000) or 0,
            expect_started=f.opt_int("expectStarted"),
            expect_completed=f.opt_int("expectCompleted"),
        )
    if do == "crashWorker":
        jobs = f.opt_int("jobs", 1) or 0
        if jobs < 1:
            raise ScenarioError(f"{where}.jobs: must be at least 1")
        expect = f.str_list("expect")
        if expect is None:
            raise ScenarioError(f"{where}.expect is required")
        subscription = f.opt_str("subscription", "default") or "default"
        return CrashWorker(subscription, jobs, expect, f.opt_int("timeoutMs", 30000) or 0)
    if do == "stats":
        return Stats(
            subscription=f.opt_str("subscription", "default") or "default",
            expect=parse_stats_fields(f.int_map("expect"), STATS_FIELDS, f"{where}.expect"),
            counters=parse_stats_fields(f.int_map("counters"), COUNTER_FIELDS, f"{where}.counters"),
            timeout_ms=f.opt_int("timeoutMs", 10000) or 0,
        )
    if do == "deadLetters":
        expect = f.str_list("expect")
        if expect is None:
            raise ScenarioError(f"{where}.expect is required")
        return DeadLetters(f.opt_str("subscription", "default") or "default", expect)
    if do == "redrive":
        return Redrive(f.opt_str("subscription", "default") or "default", f.req_int("expect"))
    raise ScenarioError(f"{where}: unknown do {do!r}")


def check_broker_index(action: Action, brokers: int) -> None:
    """A step naming broker *i* must name one the scenario starts."""
    index: int | None = None
    field_name = "broker"
    if isinstance(action, RestartBroker | FreezeBroker | AwaitLeaseLapse):
        index = action.broker
    elif isinstance(action, Enqueue):
        index, field_name = action.via, "via"
    if index is not None and index >= brokers:
        raise ScenarioError(f"{field_name}: broker {index} does not exist (the scenario starts {brokers})")


def parse_scenario(value: object, source: str) -> Scenario:
    top = Fields(value, source)
    name = top.req_str("name")
    top.opt_str("description")
    queue = QueueSpec()
    queue_fields = top.obj("queue")
    if queue_fields is not None:
        queue = QueueSpec(
            shards=queue_fields.opt_int("shards", 1) or 1,
            lease_ttl_ms=queue_fields.opt_int("leaseTtlMs", 2000) or 2000,
            max_attempts=queue_fields.opt_int("maxAttempts"),
            backoff_ms=positive(queue_fields.opt_int("backoffMs", 100), f"{source}.queue.backoffMs") or 0,
        )
        queue_fields.done()
    brokers = top.opt_int("brokers", 1) or 0
    if brokers < 1:
        raise ScenarioError(f"{source}.brokers: must be at least 1")
    subscriptions = top.str_list("subscriptions") or []
    raw_steps = top.opt_list("steps")
    if not raw_steps:
        raise ScenarioError(f"{source}.steps: at least one step is required")
    top.done()
    steps: list[Step] = []
    for index, raw in enumerate(raw_steps):
        fields = Fields(raw, f"scenario {name!r} step {index}")
        do = fields.req_str("do")
        try:
            action = parse_action(do, fields)
            fields.done()
            check_broker_index(action, brokers)
        except ScenarioError as error:
            raise ScenarioError(f"scenario {name!r} step {index} ({do}): {error}") from None
        steps.append(Step(index, do, action))
    return Scenario(name, brokers, queue, subscriptions, steps)


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
        else:
            redriven = self.admin.redrive(self.queue, action.subscription).redriven
            if redriven != action.expect:
                raise ScenarioError(f"redrove {redriven} dead letters, expected {action.expect}")

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


def load(path: Path) -> Scenario:
    return parse_scenario(json.loads(path.read_text()), path.name)


def test_scenarios_found() -> None:
    assert SCENARIOS, f"no scenarios in {SCENARIO_DIR}"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    run_scenario(load(path))


def test_parsing_is_strict() -> None:
    """Unknown fields and steps fail instead of being skipped."""
    base: dict[str, object] = {"name": "x", "steps": [{"do": "redrive", "expect": 0}]}
    parse_scenario(base, "ok")
    parse_scenario(
        {
            "name": "x",
            "brokers": 2,
            "steps": [
                {"do": "restartBroker", "broker": 1},
                {"do": "enqueue", "via": 1, "messages": [{"payload": "a"}]},
                {"do": "expectLeaders", "distinct": 2},
                {"do": "freezeBroker", "broker": 1},
                {"do": "awaitLeaseLapse", "broker": 1, "timeoutMs": 5000},
                {"do": "thawBroker", "broker": 1},
            ],
        },
        "ok with brokers",
    )
    bad_cases: list[tuple[str, dict[str, object]]] = [
        ("unknown field", {**base, "extra": 1}),
        ("unknown do", {**base, "steps": [{"do": "dance"}]}),
        ("unknown step field", {**base, "steps": [{"do": "redrive", "expect": 0, "subscriptoin": "a"}]}),
        ("unknown queue field", {**base, "queue": {"shard": 2}}),
        ("unknown stats field", {**base, "steps": [{"do": "stats", "expect": {"readyy": 0}}]}),
        ("unknown handler", {**base, "steps": [{"do": "startWorker", "name": "w", "handler": "explode"}]}),
        ("two conditions", {**base, "steps": [{"do": "awaitWorker", "name": "w", "started": 1, "completed": 1}]}),
        ("wrong type", {**base, "steps": [{"do": "redrive", "expect": "1"}]}),
        ("restart missing broker", {**base, "steps": [{"do": "restartBroker"}]}),
        ("restart unknown broker", {**base, "steps": [{"do": "restartBroker", "broker": 1}]}),
        ("restart extra field", {**base, "steps": [{"do": "restartBroker", "broker": 0, "grace": 1}]}),
        ("leaders missing distinct", {**base, "steps": [{"do": "expectLeaders"}]}),
        ("leaders wrong type", {**base, "steps": [{"do": "expectLeaders", "distinct": "2"}]}),
        ("via unknown broker", {**base, "steps": [{"do": "enqueue", "via": 1, "messages": [{"payload": "a"}]}]}),
        ("freeze unknown broker", {**base, "steps": [{"do": "freezeBroker", "broker": 1}]}),
        ("thaw missing broker", {**base, "steps": [{"do": "thawBroker"}]}),
        ("lapse extra field", {**base, "steps": [{"do": "awaitLeaseLapse", "broker": 0, "timeout": 1}]}),
        ("via wrong type", {**base, "steps": [{"do": "enqueue", "via": True, "messages": [{"payload": "a"}]}]}),
    ]
    for label, case in bad_cases:
        with pytest.raises(ScenarioError):
            parse_scenario(case, label)
