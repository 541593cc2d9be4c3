#!/usr/bin/env bash
# Builds the real Kubernetes control plane the end-to-end tests run against, pinned, from the Go
# module proxy: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (which plays
# the kubelets). Output: a cache directory outside the repository, keyed by the versions; the last
# line printed is that directory's bin/ (its path is also what `--print-bin` prints, without building).
#
# Idempotent: a complete build is marked by a stamp file and never redone. Needs Go (>= the version
# Kubernetes' go.mod names) and the Go module proxy.
set -euo pipefail

KUBERNETES_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0

CACHE_ROOT="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
DIR="$CACHE_ROOT/control-plane/k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
BIN="$DIR/bin"

if [ "${1:-}" = "--print-bin" ]; then
  echo "$BIN"
  exit 0
fi

if [ -f "$DIR/.complete" ]; then
  echo "control plane: cached in $BIN" >&2
  echo "$BIN"
  exit 0
fi

LABEL="control plane"
# shellcheck source=go-build.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/go-build.sh"
require_go
check_proxy k8s.io/kubernetes "$KUBERNETES_VERSION" || exit 1
PROXY="$(go env GOPROXY | cut -d, -f1)"
mkdir -p "$BIN"

# --- etcd: from a wrapper module (the server module's own replace lines only apply inside it).
if [ ! -x "$BIN/etcd" ]; then
  step "etcd $ETCD_VERSION (building)"
  W="$DIR/src/etcd"
  rm -rf "$W" && mkdir -p "$W" && cd "$W"
  quiet go mod init gna-etcd-build
  quiet go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  quiet go build -trimpath -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN/etcd.tmp" "$BIN/etcd"
fi
step "etcd: $("$BIN/etcd" --version | head -1)"

# --- kube-apiserver, kube-controller-manager, kube-scheduler: k8s.io/kubernetes replaces its staging
# modules with ./staging/src/k8s.io/<name>, which the module zip leaves out; the wrapper replaces
# each with its published v0.X.Y instead (the list read from the downloaded go.mod).
if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-controller-manager" ] || [ ! -x "$BIN/kube-scheduler" ]; then
  step "Kubernetes $KUBERNETES_VERSION (downloading modules)"
  W="$DIR/src/kubernetes"
  rm -rf "$W" && mkdir -p "$W" && cd "$W"
  STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"
  curl -fsS --max-time 60 -o kubernetes.mod "$PROXY/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.mod"
  GO_LINE="$(grep -E '^go [0-9]' kubernetes.mod)"
  cat >go.mod <<EOF
module gna-kubernetes-build

$GO_LINE

require k8s.io/kubernetes $KUBERNETES_VERSION
EOF
  grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' kubernetes.mod | awk '{print $1}' |
    while read -r m; do
      quiet go mod edit -replace="$m=$m@$STAGING_VERSION"
    done
  cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
EOF
  quiet go get "k8s.io/kubernetes@$KUBERNETES_VERSION" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
  MINOR="${KUBERNETES_VERSION#v1.}"
  MINOR="${MINOR%%.*}"
  LDFLAGS=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDFLAGS="$LDFLAGS -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
    if [ ! -x "$BIN/$cmd" ]; then
      step "$cmd $KUBERNETES_VERSION (building; several minutes on 2 cores)"
      quiet go build -trimpath -ldflags "-s -w $LDFLAGS" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
      mv "$BIN/$cmd.tmp" "$BIN/$cmd"
    fi
  done
fi
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
  step "$cmd: $("$BIN/$cmd" --version 2>&1 | head -1)"
done

# --- kwok (no replace lines: go install works).
if [ ! -x "$BIN/kwok" ]; then
  step "kwok $KWOK_VERSION (building)"
  GOBIN="$BIN" quiet go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
step "kwok: $("$BIN/kwok" --version 2>&1 | head -1)"

rm -rf "$DIR/src"
touch "$DIR/.complete"
echo "$BIN"
