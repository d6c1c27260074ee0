#!/usr/bin/env bash
# Installs grpcurl (the command-line gRPC client operators use to poke a casq
# broker through server reflection) into .tools/bin (project-local,
# gitignored) at a pinned version. The end-to-end tests (test/e2e/) run it
# against a real `casq serve` process.
#
# Idempotent: when .tools/bin/grpcurl already reports being built from the
# pinned module version, nothing is done and the script returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

GRPCURL_PKG="github.com/fullstorydev/grpcurl/cmd/grpcurl"
GRPCURL_VERSION="v1.9.3"

export GOBIN="$ROOT/.tools/bin"
BIN="$GOBIN/grpcurl"

if ! command -v go >/dev/null 2>&1; then
  echo "setup-grpcurl: Go is required to install grpcurl; install Go >= 1.24" >&2
  exit 1
fi

have=""
if [[ -x "$BIN" ]]; then
  have="$(go version -m "$BIN" 2>/dev/null | awk '$1 == "mod" { print $3 }')"
fi
if [[ "$have" == "$GRPCURL_VERSION" ]]; then
  echo "setup-grpcurl: grpcurl $GRPCURL_VERSION already installed in .tools/bin"
  exit 0
fi

mkdir -p "$GOBIN"
echo "setup-grpcurl: go install $GRPCURL_PKG@$GRPCURL_VERSION -> .tools/bin/grpcurl"
go install "$GRPCURL_PKG@$GRPCURL_VERSION"
echo "setup-grpcurl: done"
