#!/usr/bin/env bash
# Soak the seeded simulation: run many seeds, in parallel over disjoint ranges,
# and print a summary plus the replay command of every failing seed.
#
#   bash scripts/sim-soak.sh [SEEDS] [FIRST_SEED] [JOBS]
#
# SEEDS defaults to 2000, FIRST_SEED to a value derived from the time (printed,
# so the run can be repeated exactly), JOBS to the number of CPUs. Each job is
# `npx tsx test/sim/soak.ts <count> <first>`; a failing seed replays with
# `CASQ_SIM_SEED=<seed> npx vitest run test/sim`.
set -euo pipefail
cd "$(dirname "$0")/.."

seeds="${1:-2000}"
first="${2:-$(( ($(date +%s) % 100000) * 1000 + 1000000 ))}"
jobs="${3:-$(nproc 2>/dev/null || echo 2)}"
if ! [[ "$seeds" =~ ^[0-9]+$ && "$first" =~ ^[0-9]+$ && "$jobs" =~ ^[0-9]+$ ]] || (( seeds < 1 || jobs < 1 )); then
  echo "usage: bash scripts/sim-soak.sh [SEEDS] [FIRST_SEED] [JOBS]" >&2
  exit 2
fi
(( jobs > seeds )) && jobs="$seeds"

echo "sim-soak: seeds ${first}..$(( first + seeds - 1 )) in ${jobs} job(s)"
logdir="$(mktemp -d)"
trap 'rm -rf "$logdir"' EXIT
start=$(date +%s)
per=$(( (seeds + jobs - 1) / jobs ))
pids=()
for (( j = 0; j < jobs; j++ )); do
  from=$(( first + j * per ))
  n=$(( per ))
  (( from + n > first + seeds )) && n=$(( first + seeds - from ))
  (( n <= 0 )) && continue
  npx tsx test/sim/soak.ts "$n" "$from" >"$logdir/job-$j.log" 2>&1 &
  pids+=("$!")
done

status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done

cat "$logdir"/job-*.log | grep -v '^soak: ' | grep -v '^failed seeds: ' || true
echo "---"
grep -h '^soak: ' "$logdir"/job-*.log || true
failed=$(grep -h '^failed seeds: ' "$logdir"/job-*.log | sed 's/^failed seeds: //' | tr '\n' ' ' || true)
echo "sim-soak: ${seeds} seeds in $(( $(date +%s) - start )) s; failed: ${failed:-none}"
for seed in $failed; do echo "  replay: CASQ_SIM_SEED=${seed} npx vitest run test/sim"; done
exit "$status"
