# Shared by the scripts that build Go test infrastructure pinned from the Go module proxy
# (control-plane.sh, anchors.sh); sourced, not run. The caller sets LABEL (progress lines) and DIR
# (its cache directory, holding build.log).

# Go must be on PATH.
require_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "error: building $LABEL needs Go (https://go.dev/dl/); 'go' is not on PATH" >&2
    exit 1
  fi
}

# Asks the proxy for one module version's .info; a clear error (and status 1) when it cannot be had.
check_proxy() { # module version
  local proxy out
  proxy="$(go env GOPROXY | cut -d, -f1)"
  case "$proxy" in
    http*) ;;
    *) return 0 ;;
  esac
  if ! out="$(curl -sS --max-time 30 -w '\n%{http_code}' "$proxy/$1/@v/$2.info" 2>&1)" || [ "${out##*$'\n'}" != 200 ]; then
    echo "error: the Go module proxy $proxy cannot be reached or does not serve $1 $2, so $LABEL cannot be built;" >&2
    echo "       tried: curl $proxy/$1/@v/$2.info -> $(echo "$out" | tr '\n' ' ')" >&2
    return 1
  fi
}

# Static binaries, no VCS stamping, the machine's own Go, and bounded parallelism (a 2-core
# machine also runs the Rust build).
export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local
export GOMAXPROCS="${GOMAXPROCS:-2}"

step() { echo "$LABEL: $*" >&2; }

# Runs a go command with its chatter in $DIR/build.log, shown only when it fails.
quiet() {
  if ! "$@" >>"$DIR/build.log" 2>&1; then
    echo "error: $LABEL build step failed: $*" >&2
    tail -n 40 "$DIR/build.log" >&2
    exit 1
  fi
}
