// Package casq is the Go SDK for casq, a durable job queue and pub/sub log
// whose whole state lives in object storage.
//
// Dial a Client with the brokers' addresses; its Producer enqueues, its
// Worker runs a handler over the Work stream (credits, heartbeats, ack on
// nil, nack on error, dead-letter on ErrDeadLetter, graceful shutdown when
// the context is cancelled), and its Admin wraps queue administration.
// Calls follow leader redirects and fail over across brokers with backoff.
// Calls carry the W3C trace context of the OpenTelemetry span in their
// context, and the worker runs each handler in a "process <queue>" span
// that continues the producer's trace (see Options.TracerProvider).
// See docs/sdk-go.md in the repository.
//
// The generated protobuf messages and gRPC client/server stubs of the API are
// in the package github.com/casq/casq/sdk/go/gen/casq/v1 (imported as casqv1).
// They are generated from proto/casq/v1/*.proto by scripts/generate.sh at the
// repository root and committed; never edit them by hand.
package casq
