#!/usr/bin/env bash
# Builds Argo's workflow-controller at the versions the end-to-end proof runs, from Go modules
# only, and keeps each in the user's cache directory keyed by version, with the minimal CRDs
# that its module ships (manifests/base/crds/minimal). A fresh clone reuses them.
#
# Usage: hack/argo-controllers.sh [ensure|path] [VERSION ...]
#   ensure  build what is missing, then print the cache folder (default)
#   path    print the cache folder
# Versions default to ARGO_VERSIONS (v3.4.17 v3.7.18 v4.0.5). A controller of VERSION is at
# <folder>/<VERSION>/workflow-controller, its CRDs in <folder>/<VERSION>/crds.
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
  if [ -x "$out/workflow-controller" ] && [ -d "$out/crds" ]; then return 0; fi
  mod=$(module_of "$version")
  log "building workflow-controller $version from $mod (3 to 8 minutes on 2 cores)..."
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
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/workflow-controller"\n' "$mod" >tools.go
    go mod tidy >&2
    CGO_ENABLED=0 go build -trimpath -o "$out/workflow-controller.tmp" "$mod/cmd/workflow-controller" >&2
    rm -rf "$out/crds" && cp -r "$moddir/manifests/base/crds/minimal" "$out/crds" && chmod -R u+w "$out/crds"
  ) || { log "FAILED to build workflow-controller $version; rerun 'make argo-controllers' and read the output above"; exit 1; }
  mv "$out/workflow-controller.tmp" "$out/workflow-controller"
  log "workflow-controller $version ready"
}

cmd=${1:-ensure}
shift || true
versions=("$@")
[ ${#versions[@]} -gt 0 ] || read -r -a versions <<<"${ARGO_VERSIONS:-v3.4.17 v3.7.18 v4.0.5}"
case "$cmd" in
  path) echo "$DIR" ;;
  ensure)
    mkdir -p "$DIR"
    for v in "${versions[@]}"; do build "$v"; done
    echo "$DIR"
    ;;
  *) echo "usage: $0 [ensure|path] [VERSION ...]" >&2; exit 2 ;;
esac
