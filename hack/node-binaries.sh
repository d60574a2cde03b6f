#!/usr/bin/env bash
# Builds the container runtime of the real node (make e2e-node) from Go modules only: containerd,
# its runc shim and ctr, runc, and the CNI plugins of the node's pod network (cni/: bridge,
# host-local, loopback); and keeps them in the user's cache directory keyed by
# version, as hack/envtest-binaries.sh keeps the API server (which builds the node's kubelet,
# kube-scheduler and kube-controller-manager: ensure-node).
#
# Usage: hack/node-binaries.sh [ensure|path]
#   ensure  build whatever is missing or stale, then print the runtime's directory (default)
#   path    print that directory without building anything
#
# Environment:
#   CONTAINERD_VERSION, RUNC_VERSION, CNI_PLUGINS_VERSION  (default: hack/versions.env)
#   EXIT_GUARD_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard)
#
# runc is built with cgo and seccomp (a pod's RuntimeDefault profile): it needs gcc and the
# libseccomp headers (Debian's libseccomp-dev).
set -euo pipefail

# shellcheck source=versions.env
read -r d_containerd d_runc d_cni < <(. "$(dirname "$0")/versions.env" && echo "$CONTAINERD_VERSION $RUNC_VERSION $CNI_PLUGINS_VERSION")
CONTAINERD_VERSION=${CONTAINERD_VERSION:-$d_containerd}
RUNC_VERSION=${RUNC_VERSION:-$d_runc}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-$d_cni}
CACHE_ROOT=${EXIT_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard}
DIR="$CACHE_ROOT/node/containerd-${CONTAINERD_VERSION}-runc-${RUNC_VERSION}-$(go env GOOS)-$(go env GOARCH)"

log() { echo "node-binaries: $*" >&2; }
fail() {
  log "FAILED: $*"
  log "Rerun hack/node-binaries.sh and read the output above. It needs the Go module proxy,"
  log "gcc and libseccomp-dev (apt-get install libseccomp-dev), and about 6 minutes on 2 cores."
  exit 1
}
stamp_ok() { [ -x "$1" ] && [ -f "$1.version" ] && [ "$(cat "$1.version")" = "$2" ]; }

# build PKG VERSION NAME [go build flags...]: go install PKG@VERSION as DIR/NAME.
build() {
  local pkg=$1 version=$2 name=$3
  shift 3
  if stamp_ok "$DIR/$name" "$version"; then return 0; fi
  log "building $name $version..."
  local bin
  bin=$(mktemp -d)
  trap 'rm -rf "$bin"' RETURN
  GOBIN="$bin" go install -trimpath "$@" "$pkg@$version" >&2 || fail "$name $version did not build"
  mv "$bin/$(basename "$pkg")" "$DIR/$name"
  echo "$version" >"$DIR/$name.version"
  log "$name $version ready"
}

case "${1:-ensure}" in
  path) echo "$DIR" ;;
  ensure)
    mkdir -p "$DIR"
    cd "$DIR" # outside any module: go install pkg@version builds it alone
    for cmd in containerd containerd-shim-runc-v2 ctr; do
      CGO_ENABLED=0 build "github.com/containerd/containerd/v2/cmd/$cmd" "$CONTAINERD_VERSION" "$cmd" \
        -tags no_btrfs,no_devmapper,no_zfs \
        -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
    done
    if ! stamp_ok "$DIR/runc" "$RUNC_VERSION" && [ ! -f /usr/include/seccomp.h ]; then
      fail "runc needs the libseccomp headers: apt-get install libseccomp-dev"
    fi
    CGO_ENABLED=1 build github.com/opencontainers/runc "$RUNC_VERSION" runc -tags seccomp \
      -ldflags "-s -w -X main.version=${RUNC_VERSION#v}"
    mkdir -p "$DIR/cni"
    for p in main/loopback main/bridge ipam/host-local; do
      CGO_ENABLED=0 build "github.com/containernetworking/plugins/plugins/$p" "$CNI_PLUGINS_VERSION" "cni/$(basename "$p")" \
        -ldflags "-s -w"
    done
    echo "$DIR"
    ;;
  *) echo "usage: $0 [ensure|path]" >&2; exit 2 ;;
esac
