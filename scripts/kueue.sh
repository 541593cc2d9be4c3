#!/usr/bin/env bash
# Builds the real Kueue manager (sigs.k8s.io/kueue, cmd/kueue) the Kueue end-to-end test runs against,
# pinned, from the Go module proxy (no prebuilt download), and copies out of the module cache the
# CRDs that test installs: Kueue's own (config/components/crd/bases in the same module) and the
# ProvisioningRequest CRD from k8s.io/autoscaler/cluster-autoscaler/apis at the version Kueue's
# go.mod pins (the Cluster Autoscaler's published API module; never hand-written). Output: a cache
# directory outside the repository, keyed by the version, holding bin/kueue and crds/*.yaml; the
# last line printed is that directory (also what `--print-dir` prints, without building).
#
# Idempotent: a complete build is marked by a stamp file and never redone. Needs Go (>= the version
# Kueue's go.mod names) and the Go module proxy.
set -euo pipefail

KUEUE_VERSION=v0.17.0

CACHE_ROOT="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
DIR="$CACHE_ROOT/kueue/$KUEUE_VERSION"

if [ "${1:-}" = "--print-dir" ]; then
  echo "$DIR"
  exit 0
fi
if [ -f "$DIR/.complete" ]; then
  echo "$DIR"
  exit 0
fi

LABEL="kueue"
# shellcheck source=go-build.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/go-build.sh"
require_go
check_proxy sigs.k8s.io/kueue "$KUEUE_VERSION" || exit 1
mkdir -p "$DIR/bin" "$DIR/crds"
: >"$DIR/build.log"
step "$KUEUE_VERSION (building; long on 2 cores)"
# A wrapper module pins the version exactly (Kueue's go.mod has no replace lines to lose).
W="$DIR/src"
rm -rf "$W" && mkdir -p "$W" && cd "$W"
quiet go mod init gna-kueue-build
quiet go get "sigs.k8s.io/kueue@$KUEUE_VERSION"
KUEUE_SRC="$(go list -m -f '{{.Dir}}' "sigs.k8s.io/kueue")"
# The ProvisioningRequest API module at the version Kueue pins (read from Kueue's own go.mod).
CA_APIS_VERSION="$(go list -m -f '{{.Version}}' k8s.io/autoscaler/cluster-autoscaler/apis)"
quiet go mod download "k8s.io/autoscaler/cluster-autoscaler/apis@$CA_APIS_VERSION"
CA_APIS_SRC="$(go list -m -f '{{.Dir}}' k8s.io/autoscaler/cluster-autoscaler/apis)"
PR_CRD="$(grep -rlE '^\s+kind: ProvisioningRequest$' "$CA_APIS_SRC" --include='*.yaml' | head -1 || true)"
if [ -z "$PR_CRD" ]; then
  echo "error: no ProvisioningRequest CRD yaml in k8s.io/autoscaler/cluster-autoscaler/apis@$CA_APIS_VERSION ($CA_APIS_SRC)" >&2
  exit 1
fi
install -m 0644 "$PR_CRD" "$DIR/crds/provisioningrequests.autoscaling.x-k8s.io.yaml"
echo "k8s.io/autoscaler/cluster-autoscaler/apis $CA_APIS_VERSION ${PR_CRD#"$CA_APIS_SRC"/}" >"$DIR/crds/SOURCES"
for f in "$KUEUE_SRC"/config/components/crd/bases/*.yaml; do
  install -m 0644 "$f" "$DIR/crds/kueue.$(basename "$f")"
done
echo "sigs.k8s.io/kueue $KUEUE_VERSION config/components/crd/bases" >>"$DIR/crds/SOURCES"
quiet go build -trimpath -ldflags "-s -w" -o "$DIR/bin/kueue.tmp" sigs.k8s.io/kueue/cmd/kueue
# The binary must at least start and describe its flags.
HELP="$("$DIR/bin/kueue.tmp" --help 2>&1 || true)"
if ! grep -qE -- '^ +-config ' <<<"$HELP"; then
  echo "error: the built kueue does not start (its --help names no -config flag):" >&2
  tail -n 20 <<<"$HELP" >&2
  exit 1
fi
mv "$DIR/bin/kueue.tmp" "$DIR/bin/kueue"
rm -rf "$W"
touch "$DIR/.complete"
step "$KUEUE_VERSION built"
echo "$DIR"
