"""Scenario files (test/scenarios/*.json) for the Python runner: their typed steps, and loading.

Loading validates a file against test/scenarios/scenario.schema.json with
``jsonschema`` (unknown steps, unknown fields, missing fields and wrong types
are refused, all of them listed), then checks what a schema cannot say
(fields that depend on one another), then builds the typed steps with the
defaults the schema gives (``default`` on a property).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokers import REPO_ROOT
from jsonschema import Draft202012Validator, ValidationError, validators

SCENARIO_DIR = REPO_ROOT / "test" / "scenarios"
SCHEMA_PATH = SCENARIO_DIR / "scenario.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
# The step kinds the schema allows.
SCHEMA_STEP_KINDS: list[str] = SCHEMA["$defs"]["step"]["properties"]["do"]["enum"]
Draft202012Validator.check_schema(SCHEMA)


def _fill_defaults(
    validator: Any, properties: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    """``properties`` that first sets each absent property with a ``default`` (ajv's useDefaults rule)."""
    if isinstance(instance, dict):
        for name, subschema in properties.items():
            if "default" in subschema:
                instance.setdefault(name, copy.deepcopy(subschema["default"]))
    yield from Draft202012Validator.VALIDATORS["properties"](validator, properties, instance, schema)


# Validates, and fills in the schema's defaults as it goes (so they are written once, in the schema).
# (The stubs leave validators.extend untyped.)
_Filling = validators.extend(Draft202012Validator, {"properties": _fill_defaults})  # type: ignore[no-untyped-call]
VALIDATOR: Draft202012Validator = _Filling(SCHEMA)


def scenario_files() -> list[Path]:
    """Every ``*.json`` of the folder but the schema, sorted."""
    return sorted(p for p in SCENARIO_DIR.glob("*.json") if not p.name.endswith(".schema.json"))


class ScenarioError(Exception):
    """A malformed scenario file or a failed expectation."""


@dataclass
class QueueSpec:
    shards: int
    lease_ttl_ms: int
    max_attempts: int | None
    backoff_ms: int


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


class Reads(dict[str, Any]):
    """A validated JSON object that records which of its keys the builders read.

    The schema says what a file may hold; this makes sure the runner uses all
    of it: a field the schema allows but no builder reads is an error, not a
    silent skip (see :func:`parse_scenario`). Nested objects read field by
    field come through :meth:`child`, so they are checked too.
    """

    def __init__(self, value: dict[str, Any], where: str, tree: list[Reads]) -> None:
        super().__init__(value)
        self.where = where
        self.read: set[str] = set()
        self.tree = tree
        tree.append(self)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)

    def child(self, value: dict[str, Any], where: str) -> Reads:
        return Reads(value, f"{self.where} {where}", self.tree)

    def ignore(self, *keys: str) -> None:
        """Keys this runner leaves alone on purpose."""
        self.read.update(keys)

    def unread(self) -> list[str]:
        return [f"{r.where}: {key!r}" for r in self.tree for key in sorted(set(r) - r.read)]


def _message(m: Reads) -> Message:
    return Message(
        payload=m["payload"],
        key=m.get("key"),
        priority=m.get("priority", 0),  # the proto's zero
        delay_ms=m.get("delayMs"),
        max_attempts=m.get("maxAttempts"),
        dedup_id=m.get("dedupId"),
        headers=m.get("headers"),
    )


def _enqueue(s: Reads) -> Enqueue:
    messages = [_message(s.child(m, f"messages/{i}")) for i, m in enumerate(s["messages"])]
    return Enqueue(s["batch"], messages, s.get("expectDuplicate"), s.get("via"))


def _start_worker(s: Reads) -> StartWorker:
    return StartWorker(
        name=s["name"],
        subscription=s["subscription"],
        concurrency=s["concurrency"],
        prefetch=s.get("prefetch", s["concurrency"]),
        handler=s["handler"],
        handler_ms=s["handlerMs"],
        lease_ttl_ms=s.get("leaseTtlMs"),
    )


def _await_worker(s: Reads) -> AwaitWorker:
    # The schema lets exactly one condition through.
    condition = next(key for key in ("started", "completed", "distinctPayloads") if key in s)
    all_of = s.child(s["expectAllOf"], "expectAllOf") if "expectAllOf" in s else None
    return AwaitWorker(
        name=s["name"],
        condition=condition,
        target=s[condition],
        timeout_ms=s["timeoutMs"],
        expect=s.get("expect"),
        ordered=s["ordered"],
        expect_attempts=s.get("expectAttempts"),
        expect_all_of=(all_of["prefix"], all_of["count"]) if all_of is not None else None,
    )


# How each step kind is built from its (validated) JSON object: every kind
# this runner implements. A drift test checks the keys against the schema.
STEP_KINDS: dict[str, Callable[[Reads], Action]] = {
    "enqueue": _enqueue,
    "produce": lambda s: Produce(s["count"], s["prefix"], s.get("killLeaderAfter")),
    "restartBroker": lambda s: RestartBroker(s["broker"]),
    "freezeBroker": lambda s: FreezeBroker(s["broker"], True),
    "thawBroker": lambda s: FreezeBroker(s["broker"], False),
    "awaitLeaseLapse": lambda s: AwaitLeaseLapse(s["broker"], s["timeoutMs"]),
    "expectLeaders": lambda s: ExpectLeaders(s["distinct"]),
    "startWorker": _start_worker,
    "awaitWorker": _await_worker,
    "stopWorker": lambda s: StopWorker(s["name"], s["timeoutMs"], s.get("expectStarted"), s.get("expectCompleted")),
    "crashWorker": lambda s: CrashWorker(s["subscription"], s["jobs"], s["expect"], s["timeoutMs"]),
    "stats": lambda s: Stats(s["subscription"], s.get("expect", {}), s.get("counters", {}), s["timeoutMs"]),
    "deadLetters": lambda s: DeadLetters(s["subscription"], s["expect"]),
    "redrive": lambda s: Redrive(s["subscription"], s["expect"]),
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
    value = copy.deepcopy(value)  # validation fills in defaults: leave the caller's document alone
    errors = sorted(VALIDATOR.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = "\n  ".join(f"{_place(value, e)}: {e.message}" for e in errors)
        raise ScenarioError(f"{source}: not a valid scenario ({SCHEMA_PATH}):\n  {lines}")
    tree: list[Reads] = []
    top = Reads(value, "top level", tree)
    top.ignore("$schema", "description")
    brokers: int = top["brokers"]
    q = top.child(top["queue"], "queue")
    queue = QueueSpec(q["shards"], q["leaseTtlMs"], q.get("maxAttempts"), q["backoffMs"])
    steps: list[Step] = []
    for index, raw in enumerate(top["steps"]):
        where = f"step {index} ({raw['do']})"
        build = STEP_KINDS.get(raw["do"])
        if build is None:
            raise ScenarioError(f"{source}: {where}: allowed by the schema, not implemented here")
        fields = Reads(raw, where, tree)
        fields.ignore("do")
        action = build(fields)
        problem = _check_semantics(action, brokers)
        if problem is not None:
            raise ScenarioError(f"{source}: {where}: {problem}")
        steps.append(Step(index, raw["do"], action))
    scenario = Scenario(top["name"], brokers, queue, top["subscriptions"], steps)
    unread = top.unread()
    if unread:
        raise ScenarioError(f"{source}: fields the schema allows but this runner does not read: {', '.join(unread)}")
    return scenario


def load(path: Path) -> Scenario:
    return parse_scenario(json.loads(path.read_text()), path.name)
