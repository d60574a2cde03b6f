#!/usr/bin/env bash
# Builds, publishes, signs and verifies a release of exit-guard: the binaries for linux/amd64
# and linux/arm64, the multi-arch image (hack/image: the Dockerfile's image, on no base image),
# an SPDX SBOM of each platform's image (syft) attested to it, the chart (helm package), pushed
# as OCI, and cosign signatures of the image, the chart and the checksums.
#
#   hack/release.sh publish    the release workflow, on a tag v<appVersion>: pushes to
#                              ghcr.io/exit-guard, signs keyless (the workflow's OIDC identity)
#   hack/release.sh snapshot   the same steps against the registry at $SNAPSHOT_REGISTRY
#                              (make release-snapshot starts one on loopback), signed with a
#                              key pair made for the run instead of keyless
#
# One version: the chart's appVersion, which must equal its version (and, to publish, the tag).
# The tools come from the environment: GO, HELM, COSIGN, SYFT (make builds them, pinned in
# hack/versions.env). Everything lands in $DIST (bin/release); release.env there names what
# was pushed.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "release: $*" >&2; exit 1; }
mode=${1:-}
: "${GO:=go}" "${HELM:?HELM: the helm binary}" "${COSIGN:?COSIGN: the cosign binary}" "${SYFT:?SYFT: the syft binary}"
dist=${DIST:-bin/release}
chart=charts/exit-guard
repo=github.com/exit-guard/exit-guard

version=$(sed -n 's/^appVersion: *"\(.*\)"$/\1/p' "$chart/Chart.yaml")
chart_version=$(sed -n 's/^version: *//p' "$chart/Chart.yaml")
[ -n "$version" ] || die "no appVersion in $chart/Chart.yaml"
[ "$version" = "$chart_version" ] || die "$chart/Chart.yaml: version $chart_version and appVersion $version differ; a release has one version"
default_image=$(sed -n '/^image:/,/^[^ ]/s/^  registry: *//p' "$chart/values.yaml")/$(sed -n '/^image:/,/^[^ ]/s/^  repository: *//p' "$chart/values.yaml")
[ "$default_image" = "ghcr.io/exit-guard/exit-guard" ] ||
  die "$chart/values.yaml: image.registry/image.repository is $default_image, not the image this release publishes (ghcr.io/exit-guard/exit-guard)"

case $mode in
publish)
  [ "${RELEASE_TAG:-}" = "v$version" ] || die "the tag ${RELEASE_TAG:-(none)} is not v$version, the chart's appVersion"
  registry=ghcr.io/exit-guard
  sign=(--yes)
  # The identity the keyless certificate names: the workflow that runs this, at its ref (as the
  # runner says it; docs/install.md gives users the same string).
  identity="https://$repo/.github/workflows/release.yaml@refs/tags/v$version"
  if [ -n "${GITHUB_WORKFLOW_REF:-}" ]; then
    identity="${GITHUB_SERVER_URL:-https://github.com}/$GITHUB_WORKFLOW_REF"
  fi
  verify=(--certificate-identity "$identity" --certificate-oidc-issuer https://token.actions.githubusercontent.com)
  plain_http=()
  if [ -n "${REGISTRY_PASSWORD:-}" ]; then
    # helm keeps its own registry credentials; the others read the docker config that the
    # workflow's login wrote.
    "$HELM" registry login ghcr.io --username "${REGISTRY_USER:?}" --password-stdin <<<"$REGISTRY_PASSWORD"
  fi
  ;;
snapshot)
  registry=${SNAPSHOT_REGISTRY:?SNAPSHOT_REGISTRY: the loopback registry host:port to push to (make release-snapshot starts one)}/exit-guard
  sign=(--yes --key "$dist/cosign.key" --tlog-upload=false --allow-http-registry)
  verify=(--key "$dist/cosign.pub" --insecure-ignore-tlog --allow-http-registry)
  plain_http=(--plain-http)
  ;;
*) die "usage: hack/release.sh snapshot|publish" ;;
esac
image=$registry/exit-guard
commit=${COMMIT:-$(git rev-parse HEAD)}
# The commit's date, not the clock's: the same commit builds the same binaries.
date=${BUILD_DATE:-$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ)}
ldflags="-X main.version=$version -X main.commit=$commit -X main.date=$date"

rm -rf "$dist"
mkdir -p "$dist"
if [ "$mode" = snapshot ]; then
  # A key pair for this run alone, in place of the workflow's keyless identity, with an empty
  # password (cosign reads it from the environment).
  export COSIGN_PASSWORD=''
  "$COSIGN" generate-key-pair --output-key-prefix "$dist/cosign" >/dev/null
fi

echo "== exit-guard $version ($commit), $("$GO" version): binaries and image"
"$GO" run ./hack/image build --out "$dist/image" --tag "$image:$version" --version "$version" \
  --ldflags "$ldflags" --arch amd64 --arch arm64
archives=()
for arch in amd64 arm64; do
  archive=exit-guard_${version}_linux_${arch}.tar.gz
  tar -C "$dist/image-build/linux-$arch" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    -cf - exit-guard | gzip -n >"$dist/$archive"
  archives+=("$archive")
done

echo "== SBOMs (syft)"
sboms=()
for arch in amd64 arm64; do
  sbom=exit-guard_${version}_linux_${arch}.sbom.spdx.json
  "$SYFT" scan "oci-dir:$dist/image" --platform "linux/$arch" --source-name "$image" \
    --source-version "$version" -o "spdx-json=$dist/$sbom" -q
  sboms+=("$sbom")
done

echo "== chart"
"$HELM" package "$chart" --destination "$dist" >/dev/null
chart_archive=exit-guard-$version.tgz
[ -f "$dist/$chart_archive" ] || die "helm package wrote no $chart_archive"

(cd "$dist" && sha256sum "${archives[@]}" "${sboms[@]}" "$chart_archive" >SHA256SUMS)

echo "== push to $registry"
"$GO" run ./hack/image push --layout "$dist/image" --to "$image:$version"
"$GO" run ./hack/image digests --layout "$dist/image" >"$dist/image.digests"
digest=$(sed -n 's/^index //p' "$dist/image.digests")
chart_digest=$("$HELM" push "$dist/$chart_archive" "oci://$registry/charts" "${plain_http[@]}" 2>&1 |
  tee /dev/stderr | sed -n 's/^Digest: //p')
[ -n "$digest" ] && [ -n "$chart_digest" ] || die "no digest for the image ($digest) or the chart ($chart_digest)"

echo "== sign and attest (cosign)"
"$COSIGN" sign "${sign[@]}" "$image@$digest"
for arch in amd64 arm64; do
  platform_digest=$(sed -n "s|^linux/$arch ||p" "$dist/image.digests")
  "$COSIGN" attest "${sign[@]}" --type spdxjson --predicate "$dist/exit-guard_${version}_linux_${arch}.sbom.spdx.json" \
    "$image@$platform_digest"
done
"$COSIGN" sign "${sign[@]}" "$registry/charts/exit-guard@$chart_digest"
blob_sign=("${sign[@]}")
if [ "$mode" = snapshot ]; then
  blob_sign=(--yes --key "$dist/cosign.key" --tlog-upload=false)
fi
"$COSIGN" sign-blob "${blob_sign[@]}" --bundle "$dist/SHA256SUMS.cosign.bundle" "$dist/SHA256SUMS" >/dev/null

echo "== verify, as a user would"
"$COSIGN" verify "${verify[@]}" "$image:$version" >/dev/null
for arch in amd64 arm64; do
  platform_digest=$(sed -n "s|^linux/$arch ||p" "$dist/image.digests")
  "$COSIGN" verify-attestation "${verify[@]}" --type spdxjson "$image@$platform_digest" >/dev/null
done
"$COSIGN" verify "${verify[@]}" "$registry/charts/exit-guard:$version" >/dev/null
blob_verify=("${verify[@]}")
if [ "$mode" = snapshot ]; then
  blob_verify=(--key "$dist/cosign.pub" --insecure-ignore-tlog)
fi
"$COSIGN" verify-blob "${blob_verify[@]}" --bundle "$dist/SHA256SUMS.cosign.bundle" "$dist/SHA256SUMS" >/dev/null

cat >"$dist/release.env" <<EOF
VERSION=$version
COMMIT=$commit
IMAGE=$image:$version
IMAGE_DIGEST=$digest
CHART=oci://$registry/charts/exit-guard
CHART_DIGEST=$chart_digest
EOF
echo "released exit-guard $version: $image@$digest, chart oci://$registry/charts/exit-guard $version"
