#!/usr/bin/env bash
# Builds the kube-apiserver and etcd binaries that envtest runs, from Go modules only (no
# download site), and keeps them in the user's cache directory keyed by version, the way
# setup-envtest keeps its binaries. A fresh clone reuses them; only the first run pays.
# kube-controller-manager (its garbage collector: what deletes a TaskSet whose Workflow is
# gone) is built beside them for the Argo proof, and kube-scheduler with it for the spread test.
#
# Usage: hack/envtest-binaries.sh [ensure|ensure-gc|ensure-kubectl|ensure-scheduler|ensure-node|path]
#   ensure          build whatever is missing or stale, then print the assets directory (default)
#   ensure-gc       the same, and kube-controller-manager too
#   ensure-kubectl  the same, and kubectl too (the tests that run the docs' kubectl recipes)
#   ensure-scheduler  the same, and kube-scheduler and kube-controller-manager too (the spread
#                   test: Deployments to Pods to Nodes as a cluster does it, without a kubelet)
#   ensure-node     the same, and kubelet, kube-scheduler, kube-controller-manager and kubectl
#                   (the real node of make e2e-node; hack/node-binaries.sh adds its runtime)
#   path       print the assets directory without building anything
#
# Environment:
#   KUBE_VERSION    kube-apiserver version (default: hack/versions.env)
#   ETCD_VERSION    etcd server version (default: hack/versions.env)
#   EXIT_GUARD_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard)
set -euo pipefail

# shellcheck source=versions.env
DEFAULTS=$(. "$(dirname "$0")/versions.env" && echo "$KUBE_VERSION $ETCD_VERSION")
KUBE_VERSION=${KUBE_VERSION:-${DEFAULTS% *}}
ETCD_VERSION=${ETCD_VERSION:-${DEFAULTS#* }}
CACHE_ROOT=${EXIT_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard}
GOOS=$(go env GOOS)
GOARCH=$(go env GOARCH)
ASSETS="$CACHE_ROOT/envtest/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}-${GOOS}-${GOARCH}"

log() { echo "envtest-binaries: $*" >&2; }

fail() {
  log "FAILED: $*"
  log "Rerun 'make envtest-binaries' (or hack/envtest-binaries.sh) and read the output above."
  log "It needs the Go module proxy and about 10 minutes on 2 cores the first time."
  exit 1
}

# stamp_ok FILE VERSION: the binary exists and was built for VERSION.
stamp_ok() { [ -x "$1" ] && [ -f "$1.version" ] && [ "$(cat "$1.version")" = "$2" ]; }

build_etcd() {
  local out="$ASSETS/etcd"
  if stamp_ok "$out" "$ETCD_VERSION"; then return 0; fi
  log "building etcd $ETCD_VERSION (under a minute)..."
  local dir
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  cat >"$dir/main.go" <<'GO'
// Command etcd runs the etcd server for envtest.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (
    cd "$dir"
    go mod init exit-guard.local/envtest-etcd >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2
    go mod tidy >&2
    CGO_ENABLED=0 go build -trimpath -o "$out.tmp" . >&2
  ) || fail "etcd $ETCD_VERSION did not build"
  mv "$out.tmp" "$out"
  echo "$ETCD_VERSION" >"$out.version"
  log "etcd $ETCD_VERSION ready"
}

# build_kube CMD: builds k8s.io/kubernetes/cmd/CMD at KUBE_VERSION into the assets directory.
build_kube() {
  local cmd=$1 out="$ASSETS/$1"
  if stamp_ok "$out" "$KUBE_VERSION"; then return 0; fi
  log "building $cmd $KUBE_VERSION from k8s.io/kubernetes (about 10 minutes the first time)..."
  local dir gomod staging minor major
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  # Staging modules are published as k8s.io/<name> v0.<minor>.<patch>.
  staging="v0.${KUBE_VERSION#v1.}"
  major=1
  minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
  (
    cd "$dir"
    go mod init "exit-guard.local/envtest-$cmd" >/dev/null 2>&1
    gomod=$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [ -f "$gomod" ] || { log "no go.mod for k8s.io/kubernetes@${KUBE_VERSION}"; exit 1; }
    # k8s.io/kubernetes replaces every staging module with a local path; a module that
    # requires it must replace them with the published versions instead.
    local names
    names=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod")
    [ -n "$names" ] || { log "found no staging replaces in $gomod"; exit 1; }
    for n in $names; do
      go mod edit -replace "$n=$n@$staging"
    done
    log "$(echo "$names" | wc -l) staging modules pinned to $staging"
    go mod edit -require "k8s.io/kubernetes@${KUBE_VERSION}"
    cat >tools.go <<GO
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/$cmd"
GO
    go mod tidy >&2
    local pkg=k8s.io/component-base/version
    CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X $pkg.gitVersion=${KUBE_VERSION} -X $pkg.gitMajor=${major} -X $pkg.gitMinor=${minor} -X $pkg.gitTreeState=clean" \
      -o "$out.tmp" "k8s.io/kubernetes/cmd/$cmd" >&2
  ) || fail "$cmd $KUBE_VERSION did not build"
  mv "$out.tmp" "$out"
  echo "$KUBE_VERSION" >"$out.version"
  log "$cmd $KUBE_VERSION ready"
}

case "${1:-ensure}" in
  path) echo "$ASSETS" ;;
  ensure)
    mkdir -p "$ASSETS"
    build_etcd
    build_kube kube-apiserver
    echo "$ASSETS"
    ;;
  ensure-gc)
    mkdir -p "$ASSETS"
    build_etcd
    build_kube kube-apiserver
    build_kube kube-controller-manager
    echo "$ASSETS"
    ;;
  ensure-kubectl)
    mkdir -p "$ASSETS"
    build_etcd
    build_kube kube-apiserver
    build_kube kubectl
    echo "$ASSETS"
    ;;
  ensure-scheduler)
    mkdir -p "$ASSETS"
    build_etcd
    build_kube kube-apiserver
    build_kube kube-controller-manager
    build_kube kube-scheduler
    echo "$ASSETS"
    ;;
  ensure-node)
    mkdir -p "$ASSETS"
    build_etcd
    build_kube kube-apiserver
    build_kube kube-controller-manager
    build_kube kube-scheduler
    build_kube kubectl
    build_kube kubelet
    echo "$ASSETS"
    ;;
  *) echo "usage: $0 [ensure|ensure-gc|ensure-kubectl|ensure-scheduler|ensure-node|path]" >&2; exit 2 ;;
esac
