// Package argorelease holds an Argo Workflows release against the README's "Am I affected?"
// table: whether its controller sends stale passes, and the release that carries upstream's
// fix (argo-workflows#16357: 3.7.16, 4.0.7, 4.1.0). The guard says it of the executor images it
// sees (webhook, exit_guard_argo_exposure); `exit-guard affected` says it of the controllers it
// finds before anything is installed.
package argorelease

import (
	"regexp"
	"strconv"
	"strings"
)

// Exposure is what the "Am I affected?" table says of an Argo release.
type Exposure string

// The exposures: a line with no fix, 4.0.0 to 4.0.6 (exposed with INFORMER_WRITE_BACK=true), a
// release with the fix, a line older than the guard was proved on, a tag that is no release.
const (
	Exposed   Exposure = "exposed"
	WriteBack Exposure = "exposed-with-informer-write-back"
	Fixed     Exposure = "fixed"
	Older     Exposure = "older-than-supported"
	Unknown   Exposure = "unknown"
)

// Words say what an exposure means for the guard.
var Words = map[Exposure]string{
	Exposed:   "this line sends stale passes (README, Am I affected?): the guard refuses what they send",
	WriteBack: "exposed only when the controller runs with INFORMER_WRITE_BACK=true, which the guard cannot see; with 4.0's default the guard adds nothing measured",
	Fixed:     "this release carries upstream's fix: with one controller at a time the guard adds nothing measured; two controllers at once (LEADER_ELECTION_DISABLE=true, argo-workflows #16034) send false exit handlers on it too, which the guard refuses",
	Older:     "older than the lines the guard was proved on (3.4 and later): exposed, not measured",
	Unknown:   "the executor image's tag is not a release (a retagged, mirrored under another tag, or digest-only image): the guard cannot tell; compare your controller's version with the README's Am I affected?",
}

// Rank orders exposures from the least to the most exposed.
var Rank = map[Exposure]int{Fixed: 0, Unknown: 1, Older: 2, WriteBack: 3, Exposed: 4}

var releaseTag = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)`)

// Release is a release's numbers, read from a tag such as v3.5.14 (ok false for a tag that is
// not a release: latest, a branch, a digest).
func Release(tag string) (major, minor, patch int, ok bool) {
	m := releaseTag.FindStringSubmatch(tag)
	if m == nil {
		return 0, 0, 0, false
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	patch, _ = strconv.Atoi(m[3])
	return major, minor, patch, true
}

// Of holds an Argo release (a tag such as v3.5.14) against the "Am I affected?" table.
func Of(tag string) Exposure {
	major, minor, patch, ok := Release(tag)
	switch {
	case !ok:
		return Unknown
	case major < 3 || major == 3 && minor < 4:
		return Older
	case major == 3 && minor < 7, major == 3 && minor == 7 && patch <= 15:
		return Exposed
	case major == 3:
		return Fixed
	case major == 4 && minor == 0 && patch <= 6:
		return WriteBack
	default:
		return Fixed
	}
}

// FixedIn is the first release of tag's line with upstream's fix ("v3.7.16" for v3.7.3), or the
// releases to move to from a line that will have none (3.6 and older).
func FixedIn(tag string) string {
	major, minor, _, ok := Release(tag)
	switch {
	case !ok:
		return "v3.7.16, v4.0.7 or v4.1.0"
	case major == 3 && minor == 7:
		return "v3.7.16"
	case major == 4 && minor == 0:
		return "v4.0.7"
	case major == 3:
		return "v3.7.16 or v4.0.7 (no " + strconv.Itoa(major) + "." + strconv.Itoa(minor) + " release has the fix)"
	default:
		return "v4.1.0"
	}
}

// ImageTag is the tag of an image ("v3.5.14" of quay.io/argoproj/argoexec:v3.5.14), or "" for
// an image named by digest alone or without a tag.
func ImageTag(image string) string {
	image, _, _ = strings.Cut(image, "@")
	last := image[strings.LastIndex(image, "/")+1:]
	_, tag, ok := strings.Cut(last, ":")
	if !ok {
		return ""
	}
	return tag
}
