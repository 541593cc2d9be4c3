#!/usr/bin/env bash
# Builds the binary with the container image's feature set (read from the Dockerfile, so the two
# cannot drift) and checks that what the image promises works in it: `--help` names `run` and both
# clouds, and `check-policy --provider aws` reaches EC2 (an address that refuses connections
# stands in for the account: the error must be EC2's, not "this build has no aws support").
#
# In the workspace's own target directory, before the test suite is built: the dependencies it
# compiles are the ones the suite needs anyway, and the suite's build (`--all-features`) then
# rebuilds the binary with every feature before any test runs it. Run it on its own, and the next
# `cargo build --all-features` does the same. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

FEATURES="$(sed -n 's/.*--no-default-features --features \([a-z0-9_,-]*\).*/\1/p' Dockerfile)"
if [ -z "$FEATURES" ]; then
  echo "error: no '--no-default-features --features ...' in Dockerfile's cargo build" >&2
  exit 1
fi
echo "== the image's feature set ($FEATURES)"
BIN="$(cargo build --locked --bin gpu-node-autoscaler --no-default-features --features "$FEATURES" \
  --message-format json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*gpu-node-autoscaler\)".*/\1/p' | tail -1)"
if [ ! -x "$BIN" ]; then
  echo "error: cargo build printed no gpu-node-autoscaler executable" >&2
  exit 1
fi

# What --help says the build can do: run, AWS and Alibaba Cloud, no simulator.
built="$("$BIN" --help | grep '^Built with:')"
if [ "$built" != "Built with: no simulate (build with --features simulator), run and AWS, Alibaba Cloud." ]; then
  echo "error: the image's build says: $built" >&2
  exit 1
fi

POLICY="$(mktemp --suffix=.yaml)"
trap 'rm -f "$POLICY"' EXIT
cat >"$POLICY" <<'YAML'
clusterName: image-check
region: us-east-1
zones: [us-east-1a]
pools:
  - name: a10g
    provider: aws
    instanceTypes: [g5.xlarge]
    maxNodes: 2
    aws:
      launchTemplate: {id: lt-0123456789abcdef0}
      subnets: {us-east-1a: subnet-0123456789abcdef0}
YAML
set +e
out="$(AWS_ACCESS_KEY_ID=image-check AWS_SECRET_ACCESS_KEY=image-check AWS_EC2_METADATA_DISABLED=true \
  timeout 120 "$BIN" check-policy "$POLICY" --provider aws --aws-endpoint-url http://127.0.0.1:1 2>&1)"
set -e
if ! grep -q "EC2: DescribeInstanceTypeOfferings failed" <<<"$out"; then
  echo "error: check-policy --provider aws in the image's build did not reach EC2:" >&2
  echo "$out" >&2
  exit 1
fi
echo "the image's build checks AWS pools against the account (EC2 reached: $(head -c 80 <<<"$out")...)"
