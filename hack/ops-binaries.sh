#!/usr/bin/env bash
# Builds the real Prometheus and Alertmanager that the day-2 suite runs (make e2e-ops), from Go
# modules only, into the user's cache directory keyed by version, as hack/envtest-binaries.sh
# does for the API server. A fresh clone reuses them; only the first run pays.
#
# Prometheus is built with the tag remove_all_sd (no service discovery but static targets and
# files, which is all the suite uses); its HTTP API works without the web UI's assets.
# Alertmanager is built in a module of its own (go install cannot build it from its module).
#
# Usage: hack/ops-binaries.sh [ensure|path]
#   ensure  build whatever is missing or stale, then print the directory (default)
#   path    print the directory without building anything
#
# Environment:
#   PROMETHEUS_VERSION, ALERTMANAGER_VERSION  (default: hack/versions.env)
#   EXIT_GUARD_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard)
set -euo pipefail

# shellcheck source=versions.env
DEFAULTS=$(. "$(dirname "$0")/versions.env" && echo "$PROMETHEUS_VERSION $ALERTMANAGER_VERSION")
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-${DEFAULTS% *}}
ALERTMANAGER_VERSION=${ALERTMANAGER_VERSION:-${DEFAULTS#* }}
CACHE_ROOT=${EXIT_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard}
DIR="$CACHE_ROOT/ops/prometheus-${PROMETHEUS_VERSION}-alertmanager-${ALERTMANAGER_VERSION}-$(go env GOOS)-$(go env GOARCH)"

log() { echo "ops-binaries: $*" >&2; }

fail() {
  log "FAILED: $*"
  log "Rerun 'make ops-binaries' (or hack/ops-binaries.sh) and read the output above."
  log "It needs the Go module proxy and a few minutes on 2 cores the first time."
  exit 1
}

stamp_ok() { [ -x "$1" ] && [ -f "$1.version" ] && [ "$(cat "$1.version")" = "$2" ]; }

build_prometheus() {
  local out="$DIR/prometheus"
  if stamp_ok "$out" "$PROMETHEUS_VERSION"; then return 0; fi
  log "building prometheus $PROMETHEUS_VERSION (a few minutes the first time)..."
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -tags remove_all_sd \
    "github.com/prometheus/prometheus/cmd/prometheus@${PROMETHEUS_VERSION}" >&2 ||
    fail "prometheus $PROMETHEUS_VERSION did not build"
  mv "$tmp/prometheus" "$out"
  echo "$PROMETHEUS_VERSION" >"$out.version"
  log "prometheus $PROMETHEUS_VERSION ready"
}

build_alertmanager() {
  local out="$DIR/alertmanager"
  if stamp_ok "$out" "$ALERTMANAGER_VERSION"; then return 0; fi
  log "building alertmanager $ALERTMANAGER_VERSION..."
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  (
    cd "$tmp"
    go mod init exit-guard.local/ops-alertmanager >/dev/null 2>&1
    cat >tools.go <<'GO'
//go:build tools

package tools

import _ "github.com/prometheus/alertmanager/cmd/alertmanager"
GO
    # (errexit does not hold in a subshell left of ||: each step says so itself.)
    go get "github.com/prometheus/alertmanager@${ALERTMANAGER_VERSION}" >&2 || exit 1
    go mod tidy >&2 || exit 1
    CGO_ENABLED=0 go build -trimpath -o "$out.tmp" github.com/prometheus/alertmanager/cmd/alertmanager >&2 || exit 1
  ) || fail "alertmanager $ALERTMANAGER_VERSION did not build"
  mv "$out.tmp" "$out"
  echo "$ALERTMANAGER_VERSION" >"$out.version"
  log "alertmanager $ALERTMANAGER_VERSION ready"
}

case "${1:-ensure}" in
  path) echo "$DIR" ;;
  ensure)
    mkdir -p "$DIR"
    build_prometheus
    build_alertmanager
    echo "$DIR"
    ;;
  *) echo "usage: $0 [ensure|path]" >&2; exit 2 ;;
esac
