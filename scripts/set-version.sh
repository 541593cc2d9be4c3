#!/usr/bin/env bash
# Sets the version everywhere it is written, from one argument: the workspace's version in
# Cargo.toml (every crate and `--version` take it), the Helm chart's version and appVersion, and
# the image tag of deploy/base. tests/it/helm.rs fails when these disagree. See docs/releasing.md.
#
#   bash scripts/set-version.sh 0.2.0
set -euo pipefail
# GNA_SET_VERSION_ROOT: another tree to write (the test's copy), whose Cargo.lock is left alone.
cd "${GNA_SET_VERSION_ROOT:-$(dirname "$0")/..}"
VERSION="${1:?usage: scripts/set-version.sh X.Y.Z}"
if ! [[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "error: '$VERSION' is not a semantic version (X.Y.Z or X.Y.Z-pre)" >&2
  exit 1
fi
sed -i "/^\[workspace.package\]/,/^\[/ s/^version = \".*\"/version = \"$VERSION\"/" Cargo.toml
CHART=deploy/helm/gpu-node-autoscaler/Chart.yaml
sed -i "s/^version: .*/version: $VERSION/; s/^appVersion: .*/appVersion: \"$VERSION\"/" "$CHART"
sed -i "s/^    newTag: .*/    newTag: $VERSION/" deploy/base/kustomization.yaml
[ -n "${GNA_SET_VERSION_ROOT:-}" ] || cargo update --workspace --quiet
echo "version $VERSION in Cargo.toml, Cargo.lock, $CHART and deploy/base/kustomization.yaml"
