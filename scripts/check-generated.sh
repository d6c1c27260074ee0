#!/usr/bin/env bash
# Fails when the committed generated code is not exactly what the protos produce,
# or when the protos are not lint- and format-clean. Run by CI and `npm test`.
#
#   1. buf lint                          (STANDARD + COMMENTS, see buf.yaml)
#   2. buf format --diff --exit-code     (prints the needed changes; fix with `npx buf format -w --path proto/casq`;
#                                        proto/third_party holds upstream files, kept verbatim)
#   3. scripts/generate.sh --out TMP     regenerates every SDK into a temporary directory and
#                                        compares it with the generated files in the work tree:
#                                        a changed, missing (would be created) or extra (would be
#                                        deleted) file fails, with `git diff --stat` of the change.
#   4. go mod tidy -diff in sdk/go and sdk/go/examples: go.mod / go.sum match the code.
#
# The work tree is never modified, so uncommitted work is safe; on a clean clone
# (CI) the work tree is the commit, so this checks exactly what is committed.
# Generated files that exist but are not committed yet are listed as a reminder.
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0

echo "check-generated: buf lint"
if ! npx --no-install buf lint; then
  echo "check-generated: FAIL: buf lint found problems in proto/ (see above)." >&2
  failed=1
fi

echo "check-generated: buf format --diff --exit-code --path proto/casq"
if ! npx --no-install buf format --diff --exit-code --path proto/casq; then
  echo "check-generated: FAIL: proto/casq is not buf-formatted; run: npx buf format -w --path proto/casq" >&2
  failed=1
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/casq-check-generated.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "check-generated: regenerating into a temporary directory"
bash scripts/generate.sh --out "$tmp/expected" >/dev/null

# The generated files, relative to the repository root (or to a --out dir).
list_generated() {
  (
    cd "$1"
    {
      [[ -d api/ts/src ]] && find api/ts/src -type f
      [[ -d sdk/ts/src/gen ]] && find sdk/ts/src/gen -type f
      [[ -d sdk/go/gen ]] && find sdk/go/gen -type f
      [[ -d sdk/python/src ]] && find sdk/python/src -type f \
        \( -name '*_pb2.py' -o -name '*_pb2.pyi' -o -name '*_pb2_grpc.py' -o -name '*_pb2_grpc.pyi' \)
    } | LC_ALL=C sort
  )
}

# Copy the work tree's generated files side by side with the fresh ones.
mkdir -p "$tmp/committed"
list_generated . | while IFS= read -r f; do
  mkdir -p "$tmp/committed/$(dirname "$f")"
  cp "$f" "$tmp/committed/$f"
done

echo "check-generated: comparing generated code with the work tree"
if ! (cd "$tmp" && git diff --no-index --quiet -- committed expected); then
  echo >&2
  echo "check-generated: FAIL: the generated code is stale: regeneration would change these files" >&2
  echo "(committed = in the work tree, expected = regenerated from proto/):" >&2
  (cd "$tmp" && git --no-pager diff --no-index --stat=200 -- committed expected) >&2 || true
  echo "First lines of the difference:" >&2
  (cd "$tmp" && git --no-pager diff --no-index -- committed expected | head -n 60) >&2 || true
  echo "Run 'npm run generate' and commit the result." >&2
  failed=1
fi

for module in sdk/go sdk/go/examples; do
  [[ -f "$module/go.mod" ]] || continue
  echo "check-generated: go mod tidy -diff ($module)"
  if ! (cd "$module" && go mod tidy -diff); then
    echo "check-generated: FAIL: $module/go.mod or go.sum is not tidy; run: (cd $module && go mod tidy)" >&2
    failed=1
  fi
done

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  pending="$(git status --porcelain --untracked-files=all -- api/ts/src sdk/ts/src/gen sdk/go/gen sdk/go/go.mod sdk/go/go.sum \
    'sdk/python/src/**/*_pb2.py' 'sdk/python/src/**/*_pb2.pyi' \
    'sdk/python/src/**/*_pb2_grpc.py' 'sdk/python/src/**/*_pb2_grpc.pyi')"
  if [[ -n "$pending" ]]; then
    echo "check-generated: note: generated files not committed yet (commit them with the protos):"
    echo "$pending"
  fi
fi

if [[ "$failed" -ne 0 ]]; then
  echo "check-generated: FAILED" >&2
  exit 1
fi
echo "check-generated: OK (protos lint- and format-clean; generated code up to date)"
