#!/usr/bin/env bash
# Builds the two parts of Argo CD that the GitOps proof runs (make e2e-argocd): the application
# controller and the repo server, from Go modules only, into one binary in the user's cache
# directory keyed by version, with Argo CD's CRDs beside it. A fresh clone reuses them.
#
# Argo CD's module cannot be built with go install: its go.mod replaces its gitops-engine module
# by a folder of its repository, and replace directives of a dependency are ignored. A small
# wrapper module requires both modules at the release's version and copies Argo CD's other
# replace directives; its main runs one of the two commands, named by its first argument. Argo
# CD's go.mod asks for go 1.27, so the build runs with GOTOOLCHAIN=ARGOCD_GOTOOLCHAIN, which
# the go command takes from the module proxy like a module.
#
# Usage: hack/argocd-binaries.sh [ensure|path]
#   ensure  build what is missing, then print the folder (default)
#   path    print the folder without building anything
# The folder holds argocd (argocd application-controller|repo-server [flags]), crds/, and
# git-verify-wrapper.sh, which the repo server runs from its PATH.
#
# Environment:
#   ARGOCD_VERSION, ARGOCD_GOTOOLCHAIN  (default: hack/versions.env)
#   EXIT_GUARD_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard)
set -euo pipefail

# shellcheck source=versions.env
DEFAULTS=$(. "$(dirname "$0")/versions.env" && echo "$ARGOCD_VERSION $ARGOCD_GOTOOLCHAIN")
ARGOCD_VERSION=${ARGOCD_VERSION:-${DEFAULTS% *}}
ARGOCD_GOTOOLCHAIN=${ARGOCD_GOTOOLCHAIN:-${DEFAULTS#* }}
CACHE_ROOT=${EXIT_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard}
DIR="$CACHE_ROOT/argocd/${ARGOCD_VERSION}-$(go env GOOS)-$(go env GOARCH)"
MOD=github.com/argoproj/argo-cd/v3
ENGINE=github.com/argoproj/argo-cd/gitops-engine/v3
# The wrapper's revision: a build of an older one is made again.
WRAPPER=3

log() { echo "argocd-binaries: $*" >&2; }

fail() {
  log "FAILED: $*"
  log "Rerun 'make argocd-binaries' (or hack/argocd-binaries.sh) and read the output above."
  log "It needs the Go module proxy (for Go $ARGOCD_GOTOOLCHAIN too) and about 10 minutes on 2 cores the first time."
  exit 1
}

build() {
  if [ -x "$DIR/argocd" ] && [ -f "$DIR/argocd.version" ] && [ "$(cat "$DIR/argocd.version")" = "$ARGOCD_VERSION $WRAPPER" ] &&
    [ -f "$DIR/crds/application-crd.yaml" ] && [ -x "$DIR/git-verify-wrapper.sh" ]; then
    return 0
  fi
  log "building Argo CD $ARGOCD_VERSION's application controller and repo server with $ARGOCD_GOTOOLCHAIN (about 10 minutes the first time)..."
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$DIR/crds"
  (
    export GOTOOLCHAIN=$ARGOCD_GOTOOLCHAIN GOFLAGS=-mod=mod
    cd "$tmp"
    read -r gomod moddir < <(go mod download -json "$MOD@$ARGOCD_VERSION" |
      sed -n 's/^[[:space:]]*"\(GoMod\|Dir\)": "\(.*\)",$/\2/p' | tr '\n' ' ')
    [ -f "$gomod" ] && [ -d "$moddir" ] || { log "could not download $MOD@$ARGOCD_VERSION"; exit 1; }
    go mod init exit-guard.local/argocd >/dev/null 2>&1
    go mod edit -go="$(sed -n 's/^go //p' "$gomod")"
    # Argo CD's replace directives to a version (not the one to its own folder).
    awk '
      /^replace[[:space:]]*\(/ { block = 1; next }
      block && /^\)/ { block = 0; next }
      block || /^replace[[:space:]]/ {
        line = $0; sub(/^replace[[:space:]]+/, "", line); sub(/\/\/.*/, "", line); sub(/^[[:space:]]+/, "", line)
        n = split(line, f, /[[:space:]]+/)
        for (i = 1; i <= n; i++) if (f[i] == "=>") arrow = i
        if (arrow && n >= arrow + 2 && f[arrow + 2] != "") print f[1] "=" f[arrow + 1] "@" f[arrow + 2]
        arrow = 0
      }' "$gomod" | while read -r r; do go mod edit -replace "$r" || exit 1; done || exit 1
    go mod edit -require "$MOD@$ARGOCD_VERSION" -require "$ENGINE@$ARGOCD_VERSION" || exit 1
    cat >main.go <<'GO'
// Command argocd runs one of two parts of Argo CD, named by its first argument:
// application-controller or repo-server; the other arguments are that command's flags.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func main() {
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
	// Argo CD's own main turns off gRPC's DNS SRV lookups, which its gRPC load balancer
	// (grpclb, imported by its CLI) turns on; neither command links grpclb, so they are off.
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd application-controller|repo-server [flags]")
		os.Exit(2)
	}
	var command *cobra.Command
	switch os.Args[1] {
	case "application-controller":
		command = appcontroller.NewCommand()
	case "repo-server":
		command = reposerver.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	command.SetArgs(os.Args[2:])
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
GO
    # (errexit does not hold in a subshell left of ||: each step says so itself.)
    go mod tidy >&2 || exit 1
    go build -trimpath -o "$DIR/argocd.tmp" . >&2 || exit 1
    cp "$moddir/manifests/crds/application-crd.yaml" "$moddir/manifests/crds/appproject-crd.yaml" "$DIR/crds/" || exit 1
    # The repo server runs this script of its image (on its PATH) for every revision it reads.
    cp "$moddir/hack/git-verify-wrapper.sh" "$DIR/" && chmod 0755 "$DIR/git-verify-wrapper.sh" || exit 1
  ) || fail "Argo CD $ARGOCD_VERSION did not build"
  mv "$DIR/argocd.tmp" "$DIR/argocd"
  echo "$ARGOCD_VERSION $WRAPPER" >"$DIR/argocd.version"
  log "Argo CD $ARGOCD_VERSION ready"
}

case "${1:-ensure}" in
  path) echo "$DIR" ;;
  ensure)
    build
    echo "$DIR"
    ;;
  *) echo "usage: $0 [ensure|path]" >&2; exit 2 ;;
esac
