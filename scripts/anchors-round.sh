#!/usr/bin/env bash
# The repeated round of docs/benchmarks.md ("Three repetitions, one cluster at a time"):
# gpu-node-autoscaler, Karpenter and the Cluster Autoscaler on every shipped scenario and four generated ones (seeds 1-4, the
# first of the reported range), three repetitions each, release builds, one cluster at a time and
# each run started only once the machine is quiet. A round takes days of a 2-core machine (about
# 140 hours of scenario time, nine runs each, at 20x), so it is run a repetition at a time into
# one JSON file each and resumes where it stopped; the table is made from those files alone.
#
#   scripts/anchors-round.sh            run (or resume) the round of the repository's HEAD
#   scripts/anchors-round.sh --table    print the table of the runs done so far
#
# The round's directory is $GNA_CACHE_DIR/anchors-round/<commit> (GNA_ROUND_DIR overrides it):
# a clone of the repository at that commit (what runs is what was committed, never a dirty tree),
# copies of its release builds, the written generated scenarios, json/<scenario>.rep<N>.json per run and
# round.log. The Cluster Autoscaler must be built (scripts/anchors.sh, GNA_CA_SOURCE) and the
# test tools installed (bash scripts/test.sh installs kubectl into the cache's virtualenv).
# GNA_ROUND_QUIET (default 1.0): a run starts once the 1-minute load average is below it. A file
# named `stop` in the round's directory ends the round before its next run (run again to resume).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${GNA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-autoscaler}"
COMMIT="$(git -C "$REPO" rev-parse --short=12 HEAD)"
DIR="${GNA_ROUND_DIR:-$CACHE/anchors-round/$COMMIT}"
REPEAT=3
SCALE=20
QUIET="${GNA_ROUND_QUIET:-1.0}"
SEEDS=(1 2 3 4)
SRC="$DIR/src"
# The round's own copies of the release builds (a shared CARGO_TARGET_DIR may be rebuilt meanwhile).
BIN="$DIR/release"

table() {
  shopt -s nullglob
  local files=("$DIR"/json/*.json)
  if [ "${#files[@]}" -eq 0 ]; then
    echo "error: no finished run in $DIR/json yet" >&2
    exit 1
  fi
  "$BIN/anchors" --table-from "${files[@]}"
}

case "${1:-}" in
  --table) table; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--table]" >&2; exit 2 ;;
esac

mkdir -p "$DIR/json"
log() { echo "$(date -u +%FT%TZ) $*" | tee -a "$DIR/round.log"; }

# What runs is the commit, cloned: later commits or edits in the repository change nothing here.
if [ ! -d "$SRC/.git" ]; then
  git clone -q "$REPO" "$SRC"
  git -C "$SRC" checkout -q "$COMMIT"
fi
VENV="$CACHE/venv"
if [ ! -x "$VENV/bin/kubectl" ]; then
  echo "error: $VENV/bin/kubectl is missing: bash scripts/test.sh installs the test tools" >&2
  exit 1
fi
export PATH="$VENV/bin:$PATH"
GNA_CONTROL_PLANE_BIN="$(bash "$SRC/scripts/control-plane.sh")"
export GNA_CONTROL_PLANE_BIN
bash "$SRC/scripts/anchors.sh" karpenter cluster-autoscaler >/dev/null
if [ ! -x "$BIN/anchors" ] || [ ! -x "$BIN/gpu-node-autoscaler" ]; then
  (cd "$SRC" && cargo build --release --locked --features controller \
    -p gpu-node-autoscaler -p gpu-node-autoscaler-anchors)
  mkdir -p "$BIN"
  built="${CARGO_TARGET_DIR:-$SRC/target}/release"
  cp "$built/gpu-node-autoscaler" "$built/anchors" "$BIN/"
fi

# The generated scenarios, written out as files the harness replays.
SCENARIOS=("$SRC"/simulations/scenarios/*.yaml)
for s in "${SEEDS[@]}"; do
  f="$DIR/generated-$s.yaml"
  [ -f "$f" ] || "$BIN/gpu-node-autoscaler" simulate --generate "$s" --write-scenario "$f"
  SCENARIOS+=("$f")
done
# Shortest first (the simulator's span of ours), so that whole scenarios are done early.
ORDERED=()
while read -r _ f; do ORDERED+=("$f"); done < <(
  for f in "${SCENARIOS[@]}"; do
    span="$("$BIN/gpu-node-autoscaler" simulate "$f" --format json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["strategies"][0]["span_s"])')"
    echo "$span $f"
  done | sort -g)

quiet() {
  local waited=0
  while awk -v q="$QUIET" '{ exit !($1 >= q) }' /proc/loadavg; do
    if [ $((waited % 300)) -eq 0 ]; then
      log "waiting for a quiet machine (load average $(cut -d' ' -f1 /proc/loadavg), below $QUIET wanted)"
    fi
    sleep 15
    waited=$((waited + 15))
  done
}

for f in "${ORDERED[@]}"; do
  name="$(basename "$f" .yaml)"
  for rep in $(seq 1 "$REPEAT"); do
    out="$DIR/json/$name.rep$rep.json"
    [ -f "$out" ] && continue
    if [ -e "$DIR/stop" ]; then
      log "stopped: $DIR/stop exists (remove it and run again to resume)"
      exit 0
    fi
    quiet
    log "$name, repetition $rep of $REPEAT: the three autoscalers in turn"
    work="$DIR/work/$name.rep$rep"
    rm -rf "$work"
    if "$BIN/anchors" "$f" --repeat 1 --time-scale "$SCALE" --format json \
      --ours-bin "$BIN/gpu-node-autoscaler" --work-dir "$work" >"$out.tmp" 2>"$DIR/$name.rep$rep.err"; then
      mv "$out.tmp" "$out"
      rm -rf "$work" "$DIR/$name.rep$rep.err"
      log "$name, repetition $rep: done"
    else
      log "$name, repetition $rep: anchors failed (kept: $work, $DIR/$name.rep$rep.err); stopping"
      exit 1
    fi
  done
done
log "round complete"
table | tee "$DIR/table.md"
