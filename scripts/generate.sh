#!/usr/bin/env bash
# Regenerates every SDK's protobuf code from proto/casq/**/*.proto:
#   TypeScript -> sdk/ts/src/gen/casq/v1/*_pb.ts                 buf + protoc-gen-es (node_modules)
#                 sdk/ts/src/gen/grpc/**/*_pb.ts                 the same, from the vendored gRPC health
#                                                                and reflection protos (proto/third_party/grpc)
#   Go         -> sdk/go/gen/casq/v1/*.pb.go                     buf + protoc-gen-go, protoc-gen-go-grpc (.tools/bin)
#   Python     -> sdk/python/src/casq/v1/*_pb2{,_grpc}.py{,i}    grpc_tools.protoc + mypy-protobuf (.venv)
# Generated files are committed; scripts/check-generated.sh fails when they are stale.
#
# Usage: scripts/generate.sh [--out DIR]
#   --out DIR  write the generated files under DIR (same relative layout)
#              instead of into the repository; check-generated.sh uses this.
#
# It first runs scripts/setup-go.sh and scripts/setup-python.sh, which return at
# once when the pinned generators are already installed. Every run starts from
# empty generated dirs, so files of deleted protos disappear, and the output is
# deterministic: no timestamps or absolute paths, byte-identical between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="."
if [[ $# -gt 0 ]]; then
  if [[ $# -eq 2 && "$1" == "--out" ]]; then
    OUT="$2"
  else
    echo "usage: $0 [--out DIR]" >&2
    exit 2
  fi
fi

bash scripts/setup-go.sh
bash scripts/setup-python.sh

# Generated locations, relative to the repository root (or to --out).
TS_GEN="sdk/ts/src/gen"
GO_GEN="sdk/go/gen"
PY_SRC="sdk/python/src" # generated modules sit beside hand-written __init__.py files

echo "generate: clearing previous generated code under $OUT"
rm -rf "${OUT:?}/$TS_GEN" "${OUT:?}/$GO_GEN"
mkdir -p "$OUT/$PY_SRC"
find "$OUT/$PY_SRC" -type f \
  \( -name '*_pb2.py' -o -name '*_pb2.pyi' -o -name '*_pb2_grpc.py' -o -name '*_pb2_grpc.pyi' \) -delete

echo "generate: buf generate (TypeScript -> $TS_GEN, Go -> $GO_GEN)"
npx --no-install buf generate --output "$OUT"
echo "generate: buf generate --template buf.gen.grpc.yaml (gRPC health and reflection, TypeScript -> $TS_GEN/grpc)"
npx --no-install buf generate --template buf.gen.grpc.yaml --output "$OUT"

echo "generate: grpc_tools.protoc + mypy-protobuf (Python -> $PY_SRC/casq)"
# Sorted, repository-relative proto paths keep the output byte-identical
# between runs and machines. grpc_tools adds its bundled well-known types
# (google/protobuf/*.proto) to the include path itself.
#   --python_out      messages          *_pb2.py        (protoc bundled in grpcio-tools)
#   --grpc_python_out gRPC stubs        *_pb2_grpc.py   (grpcio-tools)
#   --mypy_out        typed messages    *_pb2.pyi       (mypy-protobuf)
#   --mypy_grpc_out   typed gRPC stubs  *_pb2_grpc.pyi  (mypy-protobuf)
# mypy-protobuf is used instead of protoc's own --pyi_out because it also types
# the gRPC stubs and servicers, so hand-written SDK code type-checks strictly.
mapfile -t protos < <(cd proto && find casq -name '*.proto' | LC_ALL=C sort)
.venv/bin/python -m grpc_tools.protoc \
  --proto_path=proto \
  --plugin=protoc-gen-mypy=.venv/bin/protoc-gen-mypy \
  --plugin=protoc-gen-mypy_grpc=.venv/bin/protoc-gen-mypy_grpc \
  --python_out="$OUT/$PY_SRC" \
  --grpc_python_out="$OUT/$PY_SRC" \
  --mypy_out="quiet:$OUT/$PY_SRC" \
  --mypy_grpc_out="quiet:$OUT/$PY_SRC" \
  "${protos[@]}"

# Python needs an __init__.py in every package that holds generated modules
# (casq/, casq/v1/, ...). They are hand-written and committed; create a
# placeholder only where one is missing (e.g. for a new casq/v2), and only when
# generating into the repository itself.
[[ "$OUT" == "." ]] && while IFS= read -r dir; do
  while [[ "$dir" != "$OUT/$PY_SRC" && ! -f "$dir/__init__.py" ]]; do
    echo "generate: creating missing ${dir#"$OUT"/}/__init__.py"
    printf '"""Generated protobuf messages and gRPC stubs (see scripts/generate.sh)."""\n' > "$dir/__init__.py"
    dir="$(dirname "$dir")"
  done
done < <(find "$OUT/$PY_SRC" -name '*_pb2.py' -exec dirname {} \; | LC_ALL=C sort -u)

echo "generate: done"
