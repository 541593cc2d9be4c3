#!/usr/bin/env bash
# Installs the real Prometheus the end-to-end tests read GPU metrics through (gpuMetrics), and its
# promtool, which checks the alert rules of deploy/: Debian's package, pinned, unpacked into a
# cache outside the repository (no system install, no root needed when the package lists are
# present). The last line printed is the path of the `prometheus` binary (also what `--print-bin`
# prints, without installing); promtool is beside it.
#
# Idempotent: an unpacked binary is never fetched again.
set -euo pipefail

PROMETHEUS_DEB_VERSION="2.42.0+ds-5+deb12u1"

CACHE_ROOT="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
DIR="$CACHE_ROOT/prometheus/$PROMETHEUS_DEB_VERSION"
BIN="$DIR/prometheus"

if [ "${1:-}" = "--print-bin" ]; then
  echo "$BIN"
  exit 0
fi
if [ -x "$BIN" ] && [ -x "$DIR/promtool" ]; then
  echo "$BIN"
  exit 0
fi

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "error: installing Prometheus for the tests needs $tool (Debian's package prometheus=$PROMETHEUS_DEB_VERSION)" >&2
    exit 1
  }
done
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "prometheus: downloading Debian's prometheus=$PROMETHEUS_DEB_VERSION" >&2
if ! (cd "$WORK" && apt-get download -q "prometheus=$PROMETHEUS_DEB_VERSION" >&2); then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq >&2
    (cd "$WORK" && apt-get download -q "prometheus=$PROMETHEUS_DEB_VERSION" >&2)
  else
    echo "error: 'apt-get download prometheus=$PROMETHEUS_DEB_VERSION' failed; run 'apt-get update' as root first" >&2
    exit 1
  fi
fi
dpkg-deb -x "$WORK"/prometheus_*.deb "$WORK/root"
"$WORK/root/usr/bin/prometheus" --version >/dev/null
mkdir -p "$DIR"
cp "$WORK/root/usr/bin/promtool" "$DIR/promtool.tmp"
mv "$DIR/promtool.tmp" "$DIR/promtool"
cp "$WORK/root/usr/bin/prometheus" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "prometheus: installed in $BIN" >&2
echo "$BIN"
