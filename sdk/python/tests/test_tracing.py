"""OpenTelemetry: calls carry the active span's context; handlers run in a ``process <queue>`` span.

The global tracer provider can be set only once per process, so these tests
install an SDK TracerProvider only if none is set yet (else they reuse the
SDK provider already there), attach one in-memory exporter to it once, and
look only at the spans of their own queue.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import casq
import casq.aio

_EXPORTER: InMemorySpanExporter | None = None


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """The process-wide in-memory exporter on the global SDK tracer provider."""
    global _EXPORTER
    if _EXPORTER is None:
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            pytest.skip("another, non-SDK tracer provider is installed globally")
        _EXPORTER = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    yield _EXPORTER


def fresh_queue(client: casq.Client) -> str:
    name = f"py-trace-{uuid.uuid4().hex[:12]}"
    casq.Admin(client).create_queue(name, max_attempts=1)
    return name


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def work_one(client: casq.Client, queue: str, handler: Callable[[casq.Job], None]) -> None:
    """Runs a worker until its handler has been called once, then stops it."""
    called = threading.Event()

    def wrapped(job: casq.Job) -> None:
        try:
            handler(job)
        finally:
            called.set()

    worker = casq.Worker(client)
    thread = threading.Thread(target=worker.run, args=(queue, wrapped), daemon=True)
    thread.start()
    assert called.wait(10), "the handler was not called"
    worker.stop(5)
    thread.join(5)
    assert not thread.is_alive()


def test_enqueue_in_span_is_parent_of_process_span(client: casq.Client, exporter: InMemorySpanExporter) -> None:
    queue = fresh_queue(client)
    tracer = trace.get_tracer("casq-tests")
    with tracer.start_as_current_span(f"produce {queue}", kind=SpanKind.PRODUCER) as producer_span:
        casq.Producer(client).enqueue(queue, "traced")
    produced = producer_span.get_span_context()

    current: list[trace.SpanContext] = []
    work_one(client, queue, lambda job: current.append(trace.get_current_span().get_span_context()))

    wait_for(lambda: len(spans_named(exporter, f"process {queue}")) == 1)
    span = spans_named(exporter, f"process {queue}")[0]
    assert span.kind == SpanKind.CONSUMER
    assert span.context is not None and span.context.trace_id == produced.trace_id
    assert span.parent is not None and span.parent.span_id == produced.span_id
    assert span.status.status_code != StatusCode.ERROR
    assert span.attributes is not None and span.attributes["messaging.destination.name"] == queue
    # The handler ran with the process span as its current span.
    assert current and current[0].span_id == span.context.span_id


def test_failing_handler_marks_span_as_error(client: casq.Client, exporter: InMemorySpanExporter) -> None:
    queue = fresh_queue(client)
    casq.Producer(client).enqueue(queue, "boom")

    def handler(job: casq.Job) -> None:
        raise RuntimeError("handler failed")

    work_one(client, queue, handler)
    wait_for(lambda: len(spans_named(exporter, f"process {queue}")) == 1)
    span = spans_named(exporter, f"process {queue}")[0]
    assert span.status.status_code == StatusCode.ERROR
    assert any(event.name == "exception" for event in span.events)


def test_explicit_traceparent_wins_and_no_span_sends_none(
    client: casq.Client, exporter: InMemorySpanExporter
) -> None:
    queue = fresh_queue(client)
    explicit = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    producer = casq.Producer(client)
    with trace.get_tracer("casq-tests").start_as_current_span("outer"):
        producer.enqueue(queue, "explicit", traceparent=explicit, tracestate="k=v")
    producer.enqueue(queue, "untraced")

    seen: dict[str, dict[str, str]] = {}
    done = threading.Event()

    def handler(job: casq.Job) -> None:
        seen[job.text()] = job.trace_context
        if len(seen) == 2:
            done.set()

    worker = casq.Worker(client)
    thread = threading.Thread(target=worker.run, args=(queue, handler), daemon=True)
    thread.start()
    assert done.wait(10)
    worker.stop(5)
    thread.join(5)
    assert seen["explicit"] == {"traceparent": explicit, "tracestate": "k=v"}
    assert seen["untraced"] == {}


def test_async_producer_sends_active_span(
    server_address: str, client: casq.Client, exporter: InMemorySpanExporter
) -> None:
    queue = fresh_queue(client)

    async def produce() -> trace.SpanContext:
        async with casq.aio.Client(brokers=[server_address], timeout=10.0) as aclient:
            with trace.get_tracer("casq-tests").start_as_current_span("async produce") as span:
                await casq.aio.Producer(aclient).enqueue(queue, b"async")
            return span.get_span_context()

    produced = asyncio.run(produce())
    contexts: list[dict[str, str]] = []
    work_one(client, queue, lambda job: contexts.append(job.trace_context))
    # Flags are the tracer's business (e.g. the W3C level-2 random bit); ids must match.
    assert contexts[0]["traceparent"].startswith(f"00-{produced.trace_id:032x}-{produced.span_id:016x}-")
