#!/usr/bin/env bash
# Runs the chart's install tests (test/chart, COMPAT_RUN) on a real kube-apiserver of each
# Kubernetes version given, each built from Go modules by hack/envtest-binaries.sh into the user
# cache, and prints a Markdown table of the results: the compatibility matrix's Kubernetes rows
# (docs/evidence/compatibility.md; make compat writes it).
#
# Usage: hack/compat.sh VERSION ...   (e.g. v1.30.14 v1.37.2)
# Environment: HELM, PROMTOOL (the tools make builds), COMPAT_RUN (a go test -run pattern);
# HELM3, optional: a Helm 3 binary, run on the last VERSION too as a row of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HELM:?HELM: the helm binary}" "${PROMTOOL:?PROMTOOL: the promtool binary}" "${COMPAT_RUN:?COMPAT_RUN: the tests to run}"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
rows=()
failed=0
# With HELM3, the tests include those that need it (the helm3 tag).
tags=envtest
if [ -n "${HELM3:-}" ]; then
  tags=envtest,helm3
fi
# row VERSION HELM: the tests on kube-apiserver VERSION with that helm, as a row of the table.
row() {
  local v=$1 helm=$2 hv log
  # The pinned version, from the binary's name (helm-vX.Y.Z): a helm built with go install
  # reports only its minor.
  hv=$(basename "$helm")
  hv=${hv#helm-}
  log="$logs/$v-$hv.log"
  echo "compat: kube-apiserver $v, helm $hv" >&2
  assets=$(KUBE_VERSION=$v hack/envtest-binaries.sh ensure)
  start=$(date +%s)
  rc=0
  KUBEBUILDER_ASSETS=$assets KUBE_VERSION=$v HELM=$helm PROMTOOL=$PROMTOOL \
    go test -tags "$tags" -count=1 -v -run "$COMPAT_RUN" ./test/chart >"$log" 2>&1 || rc=$?
  secs=$(($(date +%s) - start))
  pass=$(grep -c '^--- PASS: ' "$log" || true)
  fails=$(sed -n 's/^--- FAIL: \([^ ]*\).*/\1/p' "$log" | paste -sd, - | sed 's/,/, /g')
  if [ "$rc" -ne 0 ]; then
    failed=1
    grep -E '^(--- FAIL|FAIL|panic)|_test\.go:[0-9]+:' "$log" | head -40 >&2
  fi
  rows+=("| ${v%.*} | $v | $hv | $pass | ${fails:-none} | $((secs / 60))m$((secs % 60))s |")
}
for v in "$@"; do
  row "$v" "$HELM"
done
if [ -n "${HELM3:-}" ]; then
  row "${!#}" "$HELM3"
fi
cat <<MD
# The chart on each Kubernetes minor

Written by \`make compat\` (hack/compat.sh); do not edit. Each row is the chart's install tests
(test/chart) run against a real kube-apiserver and etcd of that version, built from Go modules.

MD
echo "| Kubernetes minor | kube-apiserver run | Helm | tests passed | failed | time |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
cat <<MD

Command: \`make compat COMPAT_KUBE_VERSIONS="$*"\` ($(go env GOOS)/$(go env GOARCH), $(nproc) cores; the
first run builds each API server, about 5 minutes a version on 2 cores).

The tests (COMPAT_RUN), each a test of test/chart:

$(echo "$COMPAT_RUN" | tr -d '^()$' | tr '|' '\n' | sed 's/^/- /')
MD
exit "$failed"
