#!/usr/bin/env bash
# Installs VersityGW (Apache-2.0; a production S3 gateway, here over its posix
# backend) into .tools/bin (project-local, gitignored) at a pinned version.
# The store conformance suite and the S3 end-to-end tests run against it as
# well as against the gofakes3-based test server (scripts/setup-s3.sh), so a
# real server's conditional-write semantics are checked, not only a fake's.
# test/support/global-setup.ts starts it once per test run on a free loopback
# port.
#
# A cold build takes a few minutes (many dependencies); later runs are
# instant: when .tools/bin/versitygw already reports being built from the
# pinned module version, nothing is done and the script returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

VERSITYGW_PKG="github.com/versity/versitygw/cmd/versitygw"
VERSITYGW_VERSION="v1.8.0"

export GOBIN="$ROOT/.tools/bin"
BIN="$GOBIN/versitygw"

if ! command -v go >/dev/null 2>&1; then
  echo "setup-versitygw: Go is required to install VersityGW; install Go >= 1.24" >&2
  exit 1
fi

have=""
if [[ -x "$BIN" ]]; then
  have="$(go version -m "$BIN" 2>/dev/null | awk '$1 == "mod" { print $3 }')"
fi
if [[ "$have" == "$VERSITYGW_VERSION" ]]; then
  echo "setup-versitygw: versitygw $VERSITYGW_VERSION already installed in .tools/bin"
  exit 0
fi

mkdir -p "$GOBIN"
echo "setup-versitygw: go install $VERSITYGW_PKG@$VERSITYGW_VERSION -> .tools/bin/versitygw (a cold build takes minutes)"
go install "$VERSITYGW_PKG@$VERSITYGW_VERSION"
echo "setup-versitygw: done"
