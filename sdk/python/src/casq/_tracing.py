"""OpenTelemetry for casq calls: W3C trace context out, processing spans in.

Only the OpenTelemetry *API* is used. Without an SDK configured by the
application every call here is a cheap no-op; with one, an enqueue made
inside a span carries that span's context to the broker (which stores it with
the message), and each job runs in a ``process <queue>`` span whose parent
is the context the producer stored, so producer, broker and worker share one
trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from casq.job import Job

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER = "casq"


def active_trace_context() -> tuple[str | None, str | None]:
    """The ``traceparent`` / ``tracestate`` of the active span, or ``(None, None)`` when there is none."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate")


def trace_metadata(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None]:
    """The trace context to send: the caller's explicit one if given, else the active span's."""
    if traceparent:
        return traceparent, tracestate
    return active_trace_context()


@contextmanager
def processing_span(job: Job, queue: str) -> Iterator[Span]:
    """Runs the body in a CONSUMER span ``process <queue>`` under the job's stored producer context.

    An exception escaping the body is recorded and marks the span as failed.
    """
    parent = _PROPAGATOR.extract(job.trace_context) if job.trace_context else None
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(
        f"process {queue}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "casq",
            "messaging.operation.type": "process",
            "messaging.destination.name": queue,
            "messaging.consumer.group.name": job.subscription,
            "messaging.message.id": job.id,
            "casq.attempt": job.attempt,
        },
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span
