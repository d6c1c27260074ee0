// Package examples holds runnable programs that use the casq Go SDK; each
// subdirectory is one command (go run ./worker). It is a module of its own,
// so the SDK itself does not depend on the OpenTelemetry SDK and exporters.
package examples
