#!/usr/bin/env bash
# The one test command (`npm test`, also what CI runs): installs everything the
# tests need on a fresh machine — npm packages, pinned Go code generators, the
# project-local Python virtualenv, the S3-compatible test server — and then runs
# every check and every suite. Each step prints a header so a failure is easy
# to place.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
step() { printf '\n==> %s  (+%ss)\n' "$*" "$((SECONDS - started))"; }

step "npm packages (npm ci)"
npm ci --no-audit --no-fund --loglevel=error

step "Go code generators (scripts/setup-go.sh)"
bash scripts/setup-go.sh

step "Python virtualenv .venv (scripts/setup-python.sh)"
bash scripts/setup-python.sh

step "S3-compatible test server (scripts/setup-s3.sh)"
bash scripts/setup-s3.sh

step "VersityGW, the production S3 gateway the S3 tests also run against (scripts/setup-versitygw.sh; a cold build takes ~2-3 minutes, cached after)"
bash scripts/setup-versitygw.sh

step "grpcurl for the end-to-end tests (scripts/setup-grpcurl.sh)"
bash scripts/setup-grpcurl.sh

step "the benchmark's peers: redis-server, PostgreSQL and nats-server from Debian, and their client libraries (scripts/setup-bench-peers.sh)"
bash scripts/setup-bench-peers.sh

step "generated code matches the protos; buf lint and buf format are clean"
bash scripts/check-generated.sh

step "TypeScript type check (tsc --noEmit)"
npx tsc --noEmit -p tsconfig.json

step "format and lint, including the determinism rules of engine code (biome ci)"
npx biome ci .

step "layer boundaries: imports between layers, no cycles, no test code in production (npm run check:deps)"
npm run --silent check:deps

step "casq as published, run by every suite's brokers and casq commands (test/support/install-built-casq.ts: build, pack, unpack under server/; CASQ_TEST_BIN)"
built_dir=$(mktemp -d "$PWD/server/.test-install.XXXXXX")
trap 'rm -rf "$built_dir"' EXIT
CASQ_TEST_BIN=$(npx tsx test/support/install-built-casq.ts "$built_dir")
export CASQ_TEST_BIN

step "TypeScript tests (vitest)"
npx vitest run

step "Go SDK (go vet, go test -race)"
(cd sdk/go && go vet ./... && go test -race -count=1 ./...)
(cd sdk/go/examples && go vet ./...)

step "Python SDK (mypy, pytest)"
.venv/bin/mypy --config-file sdk/python/pyproject.toml
.venv/bin/pytest -q sdk/python

step "all suites passed in $((SECONDS - started))s"
