#!/usr/bin/env bash
# Builds the S3-compatible server the tests run against into
# .tools/bin/casq-s3-fake (project-local, gitignored).
#
# The server is gofakes3 v1.2.0 (in-memory backend; its conditional PutObject
# is atomic) behind a small shim that adds AWS's If-Match on DeleteObject; the
# source is test/support/s3-fake/ (go.mod/go.sum pin every dependency, fetched
# from the Go module proxy). test/support/global-setup.ts starts it once per
# test run on a free loopback port.
#
# Idempotent: a stamp records a hash of the sources and the Go version; when
# nothing changed a re-run does nothing and returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

SRC="test/support/s3-fake"
BIN=".tools/bin/casq-s3-fake"
STAMP=".tools/bin/.casq-s3-fake.stamp"

if ! command -v go >/dev/null 2>&1; then
  echo "setup-s3: Go is required to build the S3 test server ($SRC); install Go >= 1.24" >&2
  exit 1
fi

want="$( { go version; cat "$SRC/go.mod" "$SRC/go.sum" "$SRC"/*.go; } | sha256sum | cut -d' ' -f1 )"

if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "setup-s3: $BIN is up to date"
  exit 0
fi

echo "setup-s3: building $BIN from $SRC (gofakes3 v1.2.0 + CAS shim)"
mkdir -p .tools/bin
(cd "$SRC" && go build -trimpath -o "../../../$BIN" .)
echo "$want" > "$STAMP"
echo "setup-s3: done"
