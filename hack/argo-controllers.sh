#!/usr/bin/env bash
# Builds Argo's workflow-controller and argoexec (whose `agent` command runs HTTP and plugin
# templates) at the versions the end-to-end proof runs, from Go modules only, and keeps each in
# the user's cache directory keyed by version, with the minimal CRDs that its module ships
# (manifests/base/crds/minimal). A fresh clone reuses them.
#
# Usage: hack/argo-controllers.sh [ensure|path] [VERSION ...]
#   ensure  build what is missing, then print the cache folder (default)
#   path    print the cache folder
# Versions default to ARGO_VERSIONS (v3.4.17 v3.5.14 v3.6.18 v3.7.15 v3.7.18 v4.0.5 v4.0.7). A controller of VERSION is at
# <folder>/<VERSION>/workflow-controller, its argoexec beside it, its CRDs in <folder>/<VERSION>/crds.
set -euo pipefail

CACHE_ROOT=${EXIT_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard}
DIR="$CACHE_ROOT/argo/$(go env GOOS)-$(go env GOARCH)"
log() { echo "argo-controllers: $*" >&2; }

module_of() {
  case "$1" in
    v3.*) echo github.com/argoproj/argo-workflows/v3 ;;
    v4.*) echo github.com/argoproj/argo-workflows/v4 ;;
    *) log "unknown major version in $1"; exit 2 ;;
  esac
}

build() {
  local version=$1 out="$DIR/$1" mod dir gomod moddir
  if [ -x "$out/workflow-controller" ] && [ -x "$out/argoexec" ] && [ -d "$out/crds" ]; then return 0; fi
  mod=$(module_of "$version")
  log "building workflow-controller and argoexec $version from $mod (5 to 15 minutes on 2 cores)..."
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  mkdir -p "$out"
  (
    cd "$dir"
    go mod init exit-guard.local/argo-controller >/dev/null 2>&1
    read -r gomod moddir < <(go mod download -json "$mod@$version" |
      sed -n 's/^[[:space:]]*"\(GoMod\|Dir\)": "\(.*\)",$/\2/p' | tr '\n' ' ')
    [ -f "$gomod" ] && [ -d "$moddir" ] || { log "could not download $mod@$version"; exit 1; }
    # Replace directives of a dependency are ignored: copy Argo's own (those to a version).
    awk '
      /^replace[[:space:]]*\(/ { block = 1; next }
      block && /^\)/ { block = 0; next }
      block || /^replace[[:space:]]/ {
        line = $0; sub(/^replace[[:space:]]+/, "", line)
        n = split(line, f, /[[:space:]]+/)
        for (i = 1; i <= n; i++) if (f[i] == "=>") arrow = i
        if (arrow && n == arrow + 2) print f[1] "=" f[arrow + 1] "@" f[arrow + 2]
        arrow = 0
      }' "$gomod" | while read -r r; do go mod edit -replace "$r"; done
    go mod edit -require "$mod@$version"
    # Argo's repository has workflow/executor/os-specific/signal_linux.go (osspecific/ from
    # v3.5) as a symbolic link to signal_darwin.go; module zips drop symbolic links, so argoexec
    # does not build for Linux from the module as served. Restore the file as the link has it,
    # in a copy of the module.
    for osdir in workflow/executor/os-specific workflow/executor/osspecific; do
      if [ -f "$moddir/$osdir/signal_darwin.go" ] && [ ! -e "$moddir/$osdir/signal_linux.go" ]; then
        log "restoring $osdir/signal_linux.go (a symbolic link in Argo's repository) in a copy of the module"
        [ -d src ] || { cp -r "$moddir" src && chmod -R u+w src; }
        cp "src/$osdir/signal_darwin.go" "src/$osdir/signal_linux.go"
        go mod edit -replace "$mod=./src"
      fi
    done
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/argoexec"\n\t_ "%s/cmd/workflow-controller"\n)\n' "$mod" "$mod" >tools.go
    go mod tidy >&2
    if [ ! -x "$out/workflow-controller" ]; then
      CGO_ENABLED=0 go build -trimpath -o "$out/workflow-controller.tmp" "$mod/cmd/workflow-controller" >&2 &&
        mv "$out/workflow-controller.tmp" "$out/workflow-controller"
    fi
    CGO_ENABLED=0 go build -trimpath -o "$out/argoexec.tmp" "$mod/cmd/argoexec" >&2 &&
      mv "$out/argoexec.tmp" "$out/argoexec"
    rm -rf "$out/crds" && cp -r "$moddir/manifests/base/crds/minimal" "$out/crds" && chmod -R u+w "$out/crds"
  ) && [ -x "$out/workflow-controller" ] && [ -x "$out/argoexec" ] && [ -d "$out/crds" ] ||
    # (set -e does not stop a subshell whose status is tested: the files are the test.)
    { log "FAILED to build workflow-controller and argoexec $version; rerun 'make argo-controllers' and read the output above"; exit 1; }
  log "workflow-controller and argoexec $version ready"
}

cmd=${1:-ensure}
shift || true
versions=("$@")
[ ${#versions[@]} -gt 0 ] || read -r -a versions <<<"${ARGO_VERSIONS:-v3.4.17 v3.5.14 v3.6.18 v3.7.15 v3.7.18 v4.0.5 v4.0.7}"
case "$cmd" in
  path) echo "$DIR" ;;
  ensure)
    mkdir -p "$DIR"
    for v in "${versions[@]}"; do build "$v"; done
    echo "$DIR"
    ;;
  *) echo "usage: $0 [ensure|path] [VERSION ...]" >&2; exit 2 ;;
esac
