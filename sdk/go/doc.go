// Package casq is the Go SDK for casq, a durable job queue and pub/sub log
// whose whole state lives in object storage.
//
// The generated protobuf messages and gRPC client/server stubs of the API are
// in the package github.com/casq/casq/sdk/go/gen/casq/v1 (imported as casqv1).
// They are generated from proto/casq/v1/*.proto by scripts/generate.sh at the
// repository root and committed; never edit them by hand.
package casq
