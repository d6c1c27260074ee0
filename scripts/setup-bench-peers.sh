#!/usr/bin/env bash
# Installs the servers `npm run bench` compares casq with, from Debian's
# packages: Redis (for BullMQ), PostgreSQL (for pg-boss) and nats-server (for
# NATS JetStream), plus the peers' client libraries into bench/peers. The
# benchmark starts each server itself on loopback in a temporary directory, so
# the packages' own services are stopped and left disabled. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || missing+=(postgresql)
if ((${#missing[@]} > 0)); then
  echo "setup-bench-peers: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  for service in redis-server postgresql; do
    $SUDO service "$service" stop >/dev/null 2>&1 || true
  done
fi

echo "setup-bench-peers: client libraries (npm ci in bench/peers)"
(cd bench/peers && npm ci --no-audit --no-fund --loglevel=error)
echo "setup-bench-peers: done"
