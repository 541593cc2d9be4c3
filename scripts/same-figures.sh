#!/usr/bin/env bash
# Checks that a change leaves every simulated figure as it was: runs `simulate --compare --format
# json` (ours and both baselines) on every scenario under simulations/scenarios and on the three
# Alibaba traces the benchmarks use (simulations/traces), for seeds 1, 2 and 3, once with a release
# build of BASE (a git revision, default HEAD) and once with a release build of the working tree,
# and compares the outputs byte for byte with `wall_s` (wall time) taken out.
#
#   bash scripts/same-figures.sh [BASE] [--only SUBSTRING] [--seeds 1,2,3]
#
# Prints one line per input and seed (same / DIFFERENT), the first differing lines of each
# difference, and exits 1 when any figure differs. BASE is built in a git worktree with its own
# target directory in the cache (outside the repository), so the working tree's build is untouched.
# The outputs stay in $CACHE/same-figures/{base-REV,head}/ for a closer look; BASE's are reused.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

BASE=HEAD
ONLY=""
SEEDS="1,2,3"
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY="$2"; shift 2 ;;
    --seeds) SEEDS="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $1" >&2; exit 2 ;;
    *) BASE="$1"; shift ;;
  esac
done

CACHE="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
OUT="$CACHE/same-figures"
TRACES="$ROOT/simulations/traces/alibaba-gpu-v2023"
for t in default gpushare40 multigpu40; do
  [ -r "$TRACES/openb_pod_list_$t.csv" ] || {
    echo "error: $TRACES/openb_pod_list_$t.csv is missing (the traces ship in simulations/traces)" >&2
    exit 1
  }
done
command -v python3 >/dev/null || { echo "error: python3 is needed to take wall_s out of the JSON" >&2; exit 1; }

base_rev="$(git rev-parse --verify "$BASE^{commit}")"
WT="$OUT/worktree"
echo "== release build of $BASE ($base_rev) in $WT" >&2
if [ -d "$WT" ]; then
  git -C "$WT" checkout -q --detach "$base_rev"
else
  mkdir -p "$OUT"
  git worktree add -q --detach "$WT" "$base_rev"
fi
# The worktree's ../shared is the checkout's (the traces, for the trace default paths).
[ -e "$OUT/shared" ] || ln -s "$ROOT/../shared" "$OUT/shared"
(cd "$WT" && CARGO_TARGET_DIR="$OUT/target-base" cargo build --release --locked -q --bin gpu-node-autoscaler)
BASE_BIN="$OUT/target-base/release/gpu-node-autoscaler"

echo "== release build of the working tree" >&2
cargo build --release --locked -q --bin gpu-node-autoscaler
HEAD_BIN="$ROOT/target/release/gpu-node-autoscaler"

strip_wall() {
  python3 -c '
import json, sys
d = json.load(sys.stdin)
for s in d.get("strategies", []):
    s.pop("wall_s", None)
print(json.dumps(d, indent=1, sort_keys=True))
'
}

inputs=()
for f in "$ROOT"/simulations/scenarios/*.yaml; do inputs+=("scenario:$f"); done
for t in default gpushare40 multigpu40; do inputs+=("trace:$TRACES/openb_pod_list_$t.csv"); done

# BASE's outputs are kept per revision and reused (a revision's figures do not change).
BASE_OUT="$OUT/base-$base_rev"
rm -rf "$OUT/head"
mkdir -p "$BASE_OUT" "$OUT/head"
differ=0
count=0
for input in "${inputs[@]}"; do
  kind="${input%%:*}"
  path="${input#*:}"
  name="$(basename "$path")"
  if [ -n "$ONLY" ] && [[ "$name" != *"$ONLY"* ]]; then continue; fi
  for seed in ${SEEDS//,/ }; do
    if [ "$kind" = trace ]; then args=(--trace "$path"); else args=("$path"); fi
    b="$BASE_OUT/$name.seed$seed.json"
    h="$OUT/head/$name.seed$seed.json"
    if [ ! -s "$b" ]; then
      "$BASE_BIN" simulate "${args[@]}" --compare --format json --seed "$seed" </dev/null | strip_wall >"$b.tmp"
      mv "$b.tmp" "$b"
    fi
    "$HEAD_BIN" simulate "${args[@]}" --compare --format json --seed "$seed" </dev/null | strip_wall >"$h"
    count=$((count + 1))
    if cmp -s "$b" "$h"; then
      echo "same       $name seed $seed"
    else
      echo "DIFFERENT  $name seed $seed"
      diff "$b" "$h" | head -20 || true
      differ=$((differ + 1))
    fi
  done
done
echo "== $count runs compared ($BASE = $base_rev against the working tree): $differ differ"
[ "$differ" -eq 0 ]
