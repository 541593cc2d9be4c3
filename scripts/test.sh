#!/usr/bin/env bash
# Runs every check and test of the project on a fresh machine: installs what is missing (pinned),
# then formatting, lints and the whole test suite. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

NEXTEST_VERSION=0.9.143

if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest --version "$NEXTEST_VERSION"
fi

# Chart text (simulate --plot) needs a TrueType font; Debian's DejaVu is the one looked for first.
if [ ! -r /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq fonts-dejavu-core >/dev/null; }; then
    echo "warning: could not install fonts-dejavu-core; set SIM_PLOT_FONT to a TrueType font for the chart tests" >&2
  fi
fi

# The AWS provider's tests run against moto_server, an EC2 API emulator (pinned; they fail without it).
MOTO_VERSION=5.1.22
if [ "$(python3 -c 'import moto; print(moto.__version__)' 2>/dev/null)" != "$MOTO_VERSION" ]; then
  python3 -m pip install --quiet "moto[server]==$MOTO_VERSION"
fi

# tests/it/deploy.rs validates the rendered deploy/ manifests against the Kubernetes schemas
# with kubernetes-validate (pinned; the test fails without it).
KUBERNETES_VALIDATE_VERSION=1.37.0
if [ "$(python3 -m kubernetes_validate --version 2>/dev/null)" != "$KUBERNETES_VALIDATE_VERSION" ]; then
  python3 -m pip install --quiet "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== tests"
cargo nextest run --workspace --locked --no-fail-fast
