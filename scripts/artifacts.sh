#!/usr/bin/env bash
# npm run artifacts [-- OUT_DIR]: builds every release artifact of casq into one
# folder (default dist/artifacts, gitignored) with a SHA256SUMS file:
#   casq-VERSION.tgz                   npm: the server and the casq CLI
#   casq-sdk-VERSION.tgz               npm: @casq/sdk, the TypeScript SDK
#   casq-api-VERSION.tgz               npm: @casq/api, the generated protobuf code the SDK and server use
#   casq_sdk-VERSION-py3-none-any.whl  PyPI distribution casq-sdk (import casq)
#   casq_sdk-VERSION.tar.gz            its sdist
# VERSION (repository root) is the one version; every manifest must match it.
# Needs the npm packages (npm ci) and the Python tools in .venv
# (scripts/setup-python.sh; PYTHON overrides the interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-dist/artifacts}"
python="${PYTHON:-.venv/bin/python}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out"/*.tgz "$out"/*.whl "$out"/*.tar.gz "$out"/SHA256SUMS

version="$(cat VERSION)"
if ! grep -qx "version = \"$version\"" sdk/python/pyproject.toml; then
  echo "artifacts: sdk/python/pyproject.toml does not have version = \"$version\" (VERSION)" >&2
  exit 1
fi

echo "artifacts: npm run build"
npm run --silent build
echo "artifacts: npm packages"
node scripts/pack-npm.mjs "$out"
echo "artifacts: Python wheel and sdist"
"$python" -m build --no-isolation --wheel --sdist --outdir "$out" sdk/python >/dev/null
(cd "$out" && sha256sum -- *.tgz *.whl *.tar.gz > SHA256SUMS)
echo "artifacts: $out"
cat "$out/SHA256SUMS"
