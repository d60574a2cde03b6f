#!/usr/bin/env bash
# Builds the images of the real node (make e2e-node) without a container engine or a registry,
# as archives that `ctr images import` loads: the pause image (hack/node/pause) and the guard's
# image (hack/image build, as the release builds it).
#
# Usage: hack/node-images.sh DIR   (writes DIR/<name>.tar; names in test/support/node/images.go)
set -euo pipefail

out=${1:?usage: hack/node-images.sh DIR}
GO=${GO:-go}
mkdir -p "$out"
log() { echo "node-images: $*" >&2; }

CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$out/pause" ./hack/node/pause
"$GO" run ./hack/image files --out "$out/pause.layout" --tag exit-guard.local/pause:1 \
  --file /pause="$out/pause" --entrypoint /pause --user 65535:65535 --archive "$out/pause.tar" >&2

"$GO" run ./hack/image build --out "$out/exit-guard.layout" --tag exit-guard.local/exit-guard:node >&2
"$GO" run ./hack/image archive --layout "$out/exit-guard.layout" --out "$out/exit-guard.tar"
log "images in $out"
