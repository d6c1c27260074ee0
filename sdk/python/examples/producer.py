"""A traced casq producer: enqueues ``<prefix>0`` … ``<prefix>N-1``, each in its own span.

    python sdk/python/examples/producer.py --brokers 127.0.0.1:50051 --queue emails --count 3

Prints exactly one line ``enqueued <id> <payload>`` per message on stdout.
Each enqueue runs inside a PRODUCER span ``produce <queue>``; the SDK sends
that span's context with the message, so the worker's ``process <queue>``
span joins the same trace. Spans are exported only when
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set:
over OTLP/HTTP protobuf, configured by the usual OTEL_* variables, with the
service name and attributes of OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES.
"""

from __future__ import annotations

import argparse
import os

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

import casq


def install_tracing() -> TracerProvider | None:
    """An OTLP-exporting tracer provider when an endpoint is configured, else None (no tracing)."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    provider = TracerProvider(resource=Resource.create())  # reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # reads the OTEL_EXPORTER_OTLP_* env
    trace.set_tracer_provider(provider)
    return provider


def main() -> None:
    """Parses the arguments and enqueues the messages."""
    parser = argparse.ArgumentParser(description="Enqueue <prefix>0..<prefix>N-1 to a casq queue, traced.")
    parser.add_argument("--brokers", required=True, help="comma-separated host:port list")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--prefix", default="job-")
    args = parser.parse_args()

    provider = install_tracing()
    tracer = trace.get_tracer("casq-example-producer")
    try:
        with casq.Client(brokers=args.brokers.split(",")) as client:
            producer = casq.Producer(client)
            for i in range(args.count):
                payload = f"{args.prefix}{i}"
                attributes = {"messaging.system": "casq", "messaging.destination.name": args.queue}
                with tracer.start_as_current_span(
                    f"produce {args.queue}", kind=SpanKind.PRODUCER, attributes=attributes
                ) as span:
                    result = producer.enqueue(args.queue, payload)  # carries this span's context
                    span.set_attribute("messaging.message.id", result.id)
                print(f"enqueued {result.id} {payload}", flush=True)
    finally:
        if provider is not None:
            provider.shutdown()  # flushes the spans still batched


if __name__ == "__main__":
    main()
