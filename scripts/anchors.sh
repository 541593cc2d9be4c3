#!/usr/bin/env bash
# Builds the two real peer autoscalers the comparisons run against, pinned, from the Go module
# proxy: the Cluster Autoscaler with only its kwok cloud provider (`cluster-autoscaler`) and
# Karpenter's kwok provider (`karpenter-kwok`; its own name, `kwok`, is the kwok binary's), plus
# Karpenter's CRDs (NodePool, NodeClaim, KWOKNodeClass, ...). Output: a cache directory outside the
# repository, keyed by the versions, with bin/ and crds/; the last line printed is that bin/ (its
# path is also what `--print-bin` prints, without building).
#
#   scripts/anchors.sh [--print-bin] [cluster-autoscaler] [karpenter]   (no name: both)
#
# Idempotent: each binary is built once; a build of both is marked by a stamp file and never
# redone. Needs Go >= the version Karpenter's go.mod names (GOTOOLCHAIN=local: no other toolchain is
# fetched) and the Go module proxy.
set -euo pipefail

# Cluster Autoscaler: released as tags `cluster-autoscaler-X.Y.Z` of github.com/kubernetes/autoscaler,
# which are not semver tags of the module (that lives in the cluster-autoscaler/ folder), so the proxy
# serves the tagged commit only as a pseudo-version: v0.0.0-<commit time, UTC>-<12 hex of the commit>.
CA_VERSION=1.36.1
CA_PSEUDO=v0.0.0-20260722070747-35e8a280425c # tag cluster-autoscaler-1.36.1 = 35e8a280425c76a4
CA_COMMIT=35e8a280425c76a4040f57ae0fa232a952c02024
# (On 2026-11-23 and 2026-11-25 the module proxy refused this version with 403 "This module version
# is not available", as it did every other 1.36/1.37 commit tried. The other way: GNA_CA_SOURCE=a
# git clone of https://github.com/kubernetes/autoscaler that has this commit; its cluster-autoscaler/
# folder at the commit is built as the main module, its dependencies from the module proxy. Without
# either, the Cluster Autoscaler part stops with the proxy's error; `scripts/anchors.sh karpenter`
# builds Karpenter alone.)
# Karpenter: v1.14.1 is the newest release whose go.mod asks no more than Go 1.26.8 (v1.14.3 asks
# 1.26.10, v1.15.0 1.26.9).
KARPENTER_VERSION=v1.14.1

CACHE_ROOT="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
DIR="$CACHE_ROOT/anchors/ca-$CA_VERSION-karpenter-$KARPENTER_VERSION"
BIN="$DIR/bin"
CRDS="$DIR/crds"

WANT_CA=0
WANT_KARPENTER=0
for arg in "$@"; do
  case "$arg" in
    --print-bin) echo "$BIN"; exit 0 ;;
    cluster-autoscaler | ca) WANT_CA=1 ;;
    karpenter) WANT_KARPENTER=1 ;;
    *) echo "usage: $0 [--print-bin] [cluster-autoscaler] [karpenter]" >&2; exit 2 ;;
  esac
done
if [ "$WANT_CA$WANT_KARPENTER" = 00 ]; then
  WANT_CA=1
  WANT_KARPENTER=1
fi

if [ -f "$DIR/.complete" ] && [ -f "$BIN/.cluster-autoscaler-holds-scaled" ] && [ -f "$BIN/.karpenter-waits-scaled" ]; then
  echo "anchors: cached in $BIN" >&2
  echo "$BIN"
  exit 0
fi

LABEL="peer autoscalers"
# shellcheck source=go-build.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/go-build.sh"
require_go
PROXY="$(go env GOPROXY | cut -d, -f1)"
mkdir -p "$BIN" "$CRDS"

elapsed() { echo "$(($(date +%s) - $1)) s"; }
# The module version recorded in a built binary (-trimpath leaves the -X values out of its build info).
built_version() { # binary module
  go version -m "$1" | awk -v m="$2" '($1 == "mod" || $1 == "dep") && $2 == m {print $2, $3; exit}'
}

# --- Karpenter's kwok provider: a package of sigs.k8s.io/karpenter, which has no replace lines; a
# wrapper module only so that the binary can be named karpenter-kwok.
# A Go file of package $2 declaring, as variables, durations (name, seconds) that the products'
# source declares as constants, each divided by the environment's GNA_TIME_SCALE (the harness's time
# compression; unset or below 1: the release's values).
write_scaled_go() { # file package what name seconds [name seconds ...]
  local file="$1" pkg="$2" what="$3"
  shift 3
  {
    printf 'package %s\n\nimport (\n\t"os"\n\t"strconv"\n\t"time"\n)\n\n' "$pkg"
    printf '// Built for gpu-node-autoscaler'"'"'s anchors harness: %s, divided by GNA_TIME_SCALE.\nvar (\n' "$what"
    while [ $# -gt 0 ]; do
      printf '\t%s = gnaScaled(%s * time.Second)\n' "$1" "$2"
      shift 2
    done
    printf ')\n\nfunc gnaScaled(d time.Duration) time.Duration {\n'
    printf '\ts, err := strconv.ParseFloat(os.Getenv("GNA_TIME_SCALE"), 64)\n'
    printf '\tif err != nil || s < 1 {\n\t\treturn d\n\t}\n\treturn time.Duration(float64(d) / s)\n}\n'
  } >"$file"
}

# Its disruption controller's timers are constants no setting reaches: it looks for nodes to
# disrupt every 10 s, waits 15 s before it validates a consolidation or emptiness command, and
# retries its queue after 1 s doubling to 10 s (pkg/controllers/disruption). `anchors` compresses
# time, so this build turns them into variables divided by the environment's GNA_TIME_SCALE (unset
# or 1: the release's values), as the harness divides every other duration. The stamp marks a
# binary built so; one built without it is rebuilt.
KARPENTER_STAMP="$BIN/.karpenter-waits-scaled"
scale_karpenter_waits() { # the directory of the sigs.k8s.io/karpenter module's source (writable)
  local d="$1/pkg/controllers/disruption" n
  n="$(cat "$d/consolidation.go" "$d/controller.go" "$d/queue.go" |
    grep -cE '^[[:space:]]*(const )?(commandValidationDelay|pollingPeriod|queueBaseDelay|queueMaxDelay)[[:space:]]+= ' || true)"
  if [ "$n" != 4 ]; then
    echo "error: $d: expected the constants commandValidationDelay, pollingPeriod, queueBaseDelay and queueMaxDelay (found $n); the time-scale patch no longer applies" >&2
    exit 1
  fi
  sed -i -E '/^[[:space:]]*(const )?(commandValidationDelay|pollingPeriod|queueBaseDelay|queueMaxDelay)[[:space:]]+= /d' \
    "$d/consolidation.go" "$d/controller.go" "$d/queue.go"
  write_scaled_go "$d/gna_time_scale.go" disruption "the release's disruption timers" \
    commandValidationDelay 15 pollingPeriod 10 queueBaseDelay 1 queueMaxDelay 10
}
if [ "$WANT_KARPENTER" = 1 ] && [ -x "$BIN/karpenter-kwok" ] && [ ! -f "$KARPENTER_STAMP" ]; then
  step "karpenter-kwok was built without its disruption timers scaled: building it again"
  rm -f "$BIN/karpenter-kwok" "$DIR/.complete"
fi
if [ "$WANT_KARPENTER" = 1 ]; then
  MOD="$(go env GOMODCACHE)/sigs.k8s.io/karpenter@$KARPENTER_VERSION"
  if [ ! -x "$BIN/karpenter-kwok" ] || [ ! -f "$CRDS/.complete" ]; then
    check_proxy sigs.k8s.io/karpenter "$KARPENTER_VERSION" || exit 1
    W="$DIR/src/karpenter"
    rm -rf "$W" && mkdir -p "$W" && cd "$W"
    step "Karpenter $KARPENTER_VERSION (downloading modules)"
    quiet go mod init gna-karpenter-build
    # The package with the version: a bare package path would ask for the newest release instead.
    quiet go get "sigs.k8s.io/karpenter/kwok@$KARPENTER_VERSION"
    # Its source, copied out of the (read-only) module cache, with the disruption timers scaled.
    cp -r "$MOD" karpenter-src && chmod -R u+w karpenter-src
    scale_karpenter_waits karpenter-src
    quiet go mod edit -replace=sigs.k8s.io/karpenter=./karpenter-src
    if [ ! -x "$BIN/karpenter-kwok" ]; then
      step "karpenter-kwok $KARPENTER_VERSION (building; a few minutes on 2 cores)"
      t0=$(date +%s)
      quiet go build -trimpath -ldflags "-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version=$KARPENTER_VERSION" \
        -o "$BIN/karpenter-kwok.tmp" sigs.k8s.io/karpenter/kwok
      mv "$BIN/karpenter-kwok.tmp" "$BIN/karpenter-kwok"
      touch "$KARPENTER_STAMP"
      step "karpenter-kwok built in $(elapsed "$t0")"
    fi
    # The CRDs, from the module (read-only in the module cache): kwok/charts/crds has NodePool,
    # NodeClaim and the rest; its KWOKNodeClass is a symlink to kwok/apis/crds, which the module zip
    # drops, so that one is copied from kwok/apis/crds.
    for f in "$MOD"/kwok/charts/crds/*.yaml "$MOD"/kwok/apis/crds/*.yaml; do
      [ -f "$f" ] && cp -f "$f" "$CRDS/" && chmod 644 "$CRDS/$(basename "$f")"
    done
    for kind in karpenter.sh_nodepools karpenter.sh_nodeclaims karpenter.kwok.sh_kwoknodeclasses; do
      if [ ! -s "$CRDS/$kind.yaml" ]; then
        echo "error: $kind.yaml is not in sigs.k8s.io/karpenter@$KARPENTER_VERSION (kwok/charts/crds, kwok/apis/crds)" >&2
        exit 1
      fi
    done
    touch "$CRDS/.complete"
  fi
  # No --version flag (it logs the -X version at LOG_LEVEL=debug once it has a kubeconfig).
  step "karpenter-kwok: $(built_version "$BIN/karpenter-kwok" sigs.k8s.io/karpenter)"
  step "karpenter CRDs: $(cd "$CRDS" && ls ./*.yaml | xargs -n1 basename | tr '\n' ' ')"
fi

# --- Cluster Autoscaler, kwok provider only (-tags kwok): its go.mod replaces
# k8s.io/autoscaler/cluster-autoscaler/apis with ./apis (which a dependency cannot use) and pins the
# Kubernetes staging modules (and a few others) with replace lines, which only apply inside it. The
# wrapper requires cluster-autoscaler and cluster-autoscaler/apis at the same pseudo-version and
# copies every replace line that names a published version (the list read from the downloaded go.mod).
ca_ldflags="-s -w -X k8s.io/autoscaler/cluster-autoscaler/version.ClusterAutoscalerVersion=$CA_VERSION"
# The Cluster Autoscaler holds a scale-up while the oldest unschedulable pod is younger than 2 s (30 s
# when it asks for a GPU): constants of core/static_autoscaler.go that no flag sets. `anchors`
# compresses time, so this build turns the two into variables divided by the environment's
# GNA_TIME_SCALE (unset or 1: the release's values), as the harness divides every other duration.
# The stamp marks a binary built so; one built without it is rebuilt.
CA_STAMP="$BIN/.cluster-autoscaler-holds-scaled"
scale_ca_holds() { # the directory of the cluster-autoscaler module's source (writable)
  local f="$1/core/static_autoscaler.go" n
  n="$(grep -cE '^[[:space:]]*unschedulablePod(WithGpu)?TimeBuffer = ' "$f" || true)"
  if [ "$n" != 2 ]; then
    echo "error: $f: expected the constants unschedulablePodTimeBuffer and unschedulablePodWithGpuTimeBuffer (found $n); the time-scale patch no longer applies" >&2
    exit 1
  fi
  sed -i -E '/^[[:space:]]*unschedulablePod(WithGpu)?TimeBuffer = /d' "$f"
  write_scaled_go "$1/core/gna_time_scale.go" core "the release's two scale-up holds" \
    unschedulablePodTimeBuffer 2 unschedulablePodWithGpuTimeBuffer 30
}
if [ "$WANT_CA" = 1 ] && [ -x "$BIN/cluster-autoscaler" ] && [ ! -f "$CA_STAMP" ]; then
  step "cluster-autoscaler was built without its scale-up holds scaled: building it again"
  rm -f "$BIN/cluster-autoscaler" "$DIR/.complete"
fi
if [ "$WANT_CA" = 1 ] && [ ! -x "$BIN/cluster-autoscaler" ] && [ -n "${GNA_CA_SOURCE:-}" ]; then
  # From a clone: the release commit's cluster-autoscaler/ folder is the main module, so its own
  # replace lines (./apis, the staging modules) apply as they do in its release build.
  if ! git -C "$GNA_CA_SOURCE" cat-file -e "$CA_COMMIT^{commit}" 2>/dev/null; then
    echo "error: GNA_CA_SOURCE=$GNA_CA_SOURCE is not a git clone of github.com/kubernetes/autoscaler with commit $CA_COMMIT (tag cluster-autoscaler-$CA_VERSION)" >&2
    exit 1
  fi
  W="$DIR/src/ca-checkout"
  rm -rf "$W" && mkdir -p "$W"
  git -C "$GNA_CA_SOURCE" archive "$CA_COMMIT" cluster-autoscaler | tar -x -C "$W"
  scale_ca_holds "$W/cluster-autoscaler"
  step "cluster-autoscaler $CA_VERSION from $GNA_CA_SOURCE at ${CA_COMMIT:0:12} (building, kwok provider only; modules from the proxy; several minutes on 2 cores)"
  t0=$(date +%s)
  (cd "$W/cluster-autoscaler" && quiet go build -trimpath -tags kwok -ldflags "$ca_ldflags" \
    -o "$BIN/cluster-autoscaler.tmp" .)
  mv "$BIN/cluster-autoscaler.tmp" "$BIN/cluster-autoscaler"
  touch "$CA_STAMP"
  step "cluster-autoscaler built in $(elapsed "$t0")"
fi
if [ "$WANT_CA" = 1 ]; then
  if [ ! -x "$BIN/cluster-autoscaler" ]; then
    for m in k8s.io/autoscaler/cluster-autoscaler k8s.io/autoscaler/cluster-autoscaler/apis; do
      if ! check_proxy "$m" "$CA_PSEUDO"; then
        echo "       or build it from a clone: GNA_CA_SOURCE=<clone of github.com/kubernetes/autoscaler with $CA_COMMIT> $0 cluster-autoscaler" >&2
        exit 1
      fi
    done
    step "Cluster Autoscaler $CA_VERSION (downloading modules)"
    W="$DIR/src/cluster-autoscaler"
    rm -rf "$W" && mkdir -p "$W" && cd "$W"
    curl -fsS --max-time 60 -o ca.mod "$PROXY/k8s.io/autoscaler/cluster-autoscaler/@v/$CA_PSEUDO.mod"
    GO_LINE="$(grep -E '^go [0-9]' ca.mod)"
    cat >go.mod <<EOF
module gna-cluster-autoscaler-build

$GO_LINE

require (
	k8s.io/autoscaler/cluster-autoscaler $CA_PSEUDO
	k8s.io/autoscaler/cluster-autoscaler/apis $CA_PSEUDO
)
EOF
    # `replace A => B vX` (one-line or in a block); `=> ./local` ones are left out.
    sed -E 's/^replace[[:space:]]+//' ca.mod |
      awk '$2 == "=>" && $3 !~ /^\./ && NF == 4 {print $1 "=" $3 "@" $4}' |
      while read -r r; do
        quiet go mod edit -replace="$r"
      done
    # What the kwok build tag needs beyond this is resolved by go build (-mod=mod).
    quiet go get "k8s.io/autoscaler/cluster-autoscaler@$CA_PSEUDO" "k8s.io/autoscaler/cluster-autoscaler/apis@$CA_PSEUDO"
    # Its source, copied out of the (read-only) module cache, with the holds scaled.
    SRC="$(go mod download -json "k8s.io/autoscaler/cluster-autoscaler@$CA_PSEUDO" | sed -nE 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')"
    cp -r "$SRC" ca-src && chmod -R u+w ca-src && rm -f ca-src/go.mod.orig
    scale_ca_holds ca-src
    quiet go mod edit -replace=k8s.io/autoscaler/cluster-autoscaler=./ca-src
    step "cluster-autoscaler $CA_VERSION (building, kwok provider only; several minutes on 2 cores)"
    t0=$(date +%s)
    quiet go build -trimpath -tags kwok -ldflags "$ca_ldflags" \
      -o "$BIN/cluster-autoscaler.tmp" k8s.io/autoscaler/cluster-autoscaler
    mv "$BIN/cluster-autoscaler.tmp" "$BIN/cluster-autoscaler"
    touch "$CA_STAMP"
    step "cluster-autoscaler built in $(elapsed "$t0")"
  fi
  # No --version flag (it logs the -X version, "Cluster Autoscaler X.Y.Z", at --v=1 on start).
  step "cluster-autoscaler: $(built_version "$BIN/cluster-autoscaler" k8s.io/autoscaler/cluster-autoscaler)"
fi

rm -rf "$DIR/src"
if [ -f "$CA_STAMP" ] && [ -f "$KARPENTER_STAMP" ] && [ -x "$BIN/cluster-autoscaler" ] && [ -x "$BIN/karpenter-kwok" ] && [ -f "$CRDS/.complete" ]; then
  touch "$DIR/.complete"
fi
echo "$BIN"
