#!/usr/bin/env bash
# Builds the real prometheus-adapter (sigs.k8s.io/prometheus-adapter, cmd/adapter) the GPU HPA
# end-to-end tests register as the custom.metrics.k8s.io APIService, pinned, from the Go module proxy
# (no prebuilt download). Output: a cache directory outside the repository, keyed by the version; the
# last line printed is the path of the binary (also what `--print-bin` prints, without building).
#
# Idempotent: a built binary is never rebuilt. Needs Go (>= the version the adapter's go.mod names)
# and the Go module proxy.
set -euo pipefail

ADAPTER_VERSION=v0.12.0

CACHE_ROOT="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
DIR="$CACHE_ROOT/prometheus-adapter/$ADAPTER_VERSION"
BIN="$DIR/bin/prometheus-adapter"

if [ "${1:-}" = "--print-bin" ]; then
  echo "$BIN"
  exit 0
fi
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

LABEL="prometheus-adapter"
# shellcheck source=go-build.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/go-build.sh"
require_go
check_proxy sigs.k8s.io/prometheus-adapter "$ADAPTER_VERSION" || exit 1
mkdir -p "$DIR/bin"
: >"$DIR/build.log"
step "$ADAPTER_VERSION (building; a few minutes on 2 cores)"
# A wrapper module pins the version exactly and keeps the build out of any other module.
W="$DIR/src"
rm -rf "$W" && mkdir -p "$W" && cd "$W"
quiet go mod init gna-prometheus-adapter-build
quiet go get "sigs.k8s.io/prometheus-adapter@$ADAPTER_VERSION"
quiet go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" sigs.k8s.io/prometheus-adapter/cmd/adapter
# The binary must at least start and describe its flags.
HELP="$("$BIN.tmp" --help 2>&1 || true)"
if ! grep -q -- '--prometheus-url' <<<"$HELP"; then
  echo "error: the built prometheus-adapter does not start (its --help names no --prometheus-url):" >&2
  tail -n 20 <<<"$HELP" >&2
  exit 1
fi
mv "$BIN.tmp" "$BIN"
rm -rf "$W"
step "$ADAPTER_VERSION built"
echo "$BIN"
