#!/usr/bin/env bash
# Installs the Go protobuf code generators into .tools/bin (project-local,
# gitignored) at pinned versions, and downloads the sdk/go module dependencies.
# Idempotent: a generator already installed at the pinned version is kept, so a
# re-run takes well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

PROTOC_GEN_GO_VERSION="v1.36.12"     # google.golang.org/protobuf/cmd/protoc-gen-go
PROTOC_GEN_GO_GRPC_VERSION="v1.6.2"  # google.golang.org/grpc/cmd/protoc-gen-go-grpc

export GOBIN="$ROOT/.tools/bin"
mkdir -p "$GOBIN"

# install_tool BINARY PACKAGE VERSION: installs PACKAGE@VERSION unless
# .tools/bin/BINARY already reports being built from that module version.
install_tool() {
  local bin="$1" pkg="$2" version="$3"
  local have=""
  if [[ -x "$GOBIN/$bin" ]]; then
    have="$(go version -m "$GOBIN/$bin" 2>/dev/null | awk '$1 == "mod" { print $3 }')"
  fi
  if [[ "$have" == "$version" ]]; then
    echo "setup-go: $bin $version already installed in .tools/bin"
  else
    echo "setup-go: go install $pkg@$version -> .tools/bin/$bin"
    go install "$pkg@$version"
  fi
}

install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

echo "setup-go: go mod download (sdk/go, sdk/go/examples)"
(cd sdk/go && go mod download)
(cd sdk/go/examples && go mod download)
echo "setup-go: done"
