"""Scenario files (test/scenarios/*.json) for the Python runner: their typed steps, and loading.

Loading validates a file against test/scenarios/scenario.schema.json with
``jsonschema`` (unknown steps, unknown fields, missing fields and wrong types
are refused, all of them listed), then checks what a schema cannot say
(fields that depend on one another), then builds the typed steps with the
defaults of test/scenarios/README.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokers import REPO_ROOT
from jsonschema import Draft202012Validator, ValidationError

SCENARIO_DIR = REPO_ROOT / "test" / "scenarios"
SCHEMA_PATH = SCENARIO_DIR / "scenario.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
# The step kinds the schema allows.
SCHEMA_STEP_KINDS: list[str] = SCHEMA["$defs"]["step"]["properties"]["do"]["enum"]
Draft202012Validator.check_schema(SCHEMA)
VALIDATOR = Draft202012Validator(SCHEMA)


def scenario_files() -> list[Path]:
    """Every ``*.json`` of the folder but the schema, sorted."""
    return sorted(p for p in SCENARIO_DIR.glob("*.json") if not p.name.endswith(".schema.json"))


class ScenarioError(Exception):
    """A malformed scenario file or a failed expectation."""


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


def _message(m: dict[str, Any]) -> Message:
    return Message(
        payload=m["payload"],
        key=m.get("key"),
        priority=m.get("priority", 0),
        delay_ms=m.get("delayMs"),
        max_attempts=m.get("maxAttempts"),
        dedup_id=m.get("dedupId"),
        headers=m.get("headers"),
    )


def _enqueue(s: dict[str, Any]) -> Enqueue:
    return Enqueue(s.get("batch", False), [_message(m) for m in s["messages"]], s.get("expectDuplicate"), s.get("via"))


def _start_worker(s: dict[str, Any]) -> StartWorker:
    concurrency = s.get("concurrency", 1)
    return StartWorker(
        name=s["name"],
        subscription=s.get("subscription", "default"),
        concurrency=concurrency,
        prefetch=s.get("prefetch", concurrency),
        handler=s["handler"],
        handler_ms=s.get("handlerMs", 0),
        lease_ttl_ms=s.get("leaseTtlMs"),
    )


def _await_worker(s: dict[str, Any]) -> AwaitWorker:
    # The schema lets exactly one condition through.
    condition = next(key for key in ("started", "completed", "distinctPayloads") if key in s)
    all_of = s.get("expectAllOf")
    return AwaitWorker(
        name=s["name"],
        condition=condition,
        target=s[condition],
        timeout_ms=s.get("timeoutMs", 30000),
        expect=s.get("expect"),
        ordered=s.get("ordered", False),
        expect_attempts=s.get("expectAttempts"),
        expect_all_of=(all_of["prefix"], all_of["count"]) if all_of is not None else None,
    )


# How each step kind is built from its (validated) JSON object: every kind
# this runner implements. A drift test checks the keys against the schema.
STEP_KINDS: dict[str, Callable[[dict[str, Any]], Action]] = {
    "enqueue": _enqueue,
    "produce": lambda s: Produce(s["count"], s["prefix"], s.get("killLeaderAfter")),
    "restartBroker": lambda s: RestartBroker(s["broker"]),
    "freezeBroker": lambda s: FreezeBroker(s["broker"], True),
    "thawBroker": lambda s: FreezeBroker(s["broker"], False),
    "awaitLeaseLapse": lambda s: AwaitLeaseLapse(s["broker"], s.get("timeoutMs", 20000)),
    "expectLeaders": lambda s: ExpectLeaders(s["distinct"]),
    "startWorker": _start_worker,
    "awaitWorker": _await_worker,
    "stopWorker": lambda s: StopWorker(
        s["name"], s.get("timeoutMs", 10000), s.get("expectStarted"), s.get("expectCompleted")
    ),
    "crashWorker": lambda s: CrashWorker(
        s.get("subscription", "default"), s["jobs"], s["expect"], s.get("timeoutMs", 30000)
    ),
    "stats": lambda s: Stats(
        s.get("subscription", "default"), s.get("expect", {}), s.get("counters", {}), s.get("timeoutMs", 10000)
    ),
    "deadLetters": lambda s: DeadLetters(s.get("subscription", "default"), s["expect"]),
    "redrive": lambda s: Redrive(s.get("subscription", "default"), s["expect"]),
}


def _place(value: Any, error: ValidationError) -> str:
    """Where an error is, in words: ``step 2 (enqueue) messages/0`` rather than ``$.steps[2].messages[0]``."""
    path = list(error.absolute_path)
    if len(path) >= 2 and path[0] == "steps" and isinstance(path[1], int):
        step = value["steps"][path[1]]
        kind = step.get("do", "?") if isinstance(step, dict) else "?"
        rest = "/".join(str(p) for p in path[2:])
        return f"step {path[1]} ({kind})" + (f" {rest}" if rest else "")
    return "/".join(str(p) for p in path) or "top level"


def _check_semantics(action: Action, brokers: int) -> str | None:
    """The checks that relate several fields, which the schema cannot express."""
    index: int | None = None
    if isinstance(action, RestartBroker | FreezeBroker | AwaitLeaseLapse):
        index = action.broker
    elif isinstance(action, Enqueue):
        index = action.via
        if action.expect_duplicate is not None and len(action.expect_duplicate) != len(action.messages):
            return "expectDuplicate needs one entry per message"
    elif isinstance(action, Produce) and action.kill_leader_after is not None:
        if action.kill_leader_after > action.count:
            return f"killLeaderAfter {action.kill_leader_after} is above count {action.count}"
    if index is not None and index >= brokers:
        return f"broker index {index} is not one of the {brokers} brokers"
    return None


def parse_scenario(value: Any, source: str) -> Scenario:
    """Validates a decoded scenario document and builds its typed steps; raises :class:`ScenarioError`."""
    errors = sorted(VALIDATOR.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = "\n  ".join(f"{_place(value, e)}: {e.message}" for e in errors)
        raise ScenarioError(f"{source}: not a valid scenario ({SCHEMA_PATH}):\n  {lines}")
    brokers: int = value.get("brokers", 1)
    q = value.get("queue", {})
    queue = QueueSpec(q.get("shards", 1), q.get("leaseTtlMs", 2000), q.get("maxAttempts"), q.get("backoffMs", 100))
    steps: list[Step] = []
    for index, raw in enumerate(value["steps"]):
        build = STEP_KINDS.get(raw["do"])
        if build is None:
            raise ScenarioError(f"{source}: step {index} ({raw['do']}): allowed by the schema, not implemented here")
        action = build(raw)
        problem = _check_semantics(action, brokers)
        if problem is not None:
            raise ScenarioError(f"{source}: step {index} ({raw['do']}): {problem}")
        steps.append(Step(index, raw["do"], action))
    return Scenario(value["name"], brokers, queue, value.get("subscriptions", []), steps)


def load(path: Path) -> Scenario:
    return parse_scenario(json.loads(path.read_text()), path.name)
