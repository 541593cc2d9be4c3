#!/usr/bin/env bash
# Builds the `helm` the chart tests run (`helm lint`, `helm template`, `helm package`), pinned, from
# the Go module proxy (no prebuilt download). Output: a cache directory outside the repository, keyed
# by the version; the last line printed is the path of the binary (also what `--print-bin` prints,
# without building).
#
# Idempotent: a built binary is never rebuilt. Needs Go (>= the version helm's go.mod names) and the
# Go module proxy.
set -euo pipefail

HELM_VERSION=v3.22.0

CACHE_ROOT="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
DIR="$CACHE_ROOT/helm/$HELM_VERSION"
BIN="$DIR/bin/helm"

if [ "${1:-}" = "--print-bin" ]; then
  echo "$BIN"
  exit 0
fi
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

LABEL="helm"
# shellcheck source=go-build.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/go-build.sh"
require_go
check_proxy helm.sh/helm/v3 "$HELM_VERSION" || exit 1
mkdir -p "$DIR/bin"
: >"$DIR/build.log"
step "$HELM_VERSION (building)"
# The version helm reports is a link-time variable; a wrapper module keeps the module's own
# replace lines out of the way (helm has none today) and pins the version exactly.
W="$DIR/src"
rm -rf "$W" && mkdir -p "$W" && cd "$W"
quiet go mod init gna-helm-build
quiet go get "helm.sh/helm/v3@$HELM_VERSION"
quiet go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  -o "$BIN.tmp" helm.sh/helm/v3/cmd/helm
"$BIN.tmp" version --short >/dev/null
mv "$BIN.tmp" "$BIN"
rm -rf "$W"
step "$("$BIN" version --short)"
echo "$BIN"
