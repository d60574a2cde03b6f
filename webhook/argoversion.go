package webhook

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/exit-guard/exit-guard/internal/argorelease"
)

// What Argo Workflows release the pods the guard judges were made by, read from their executor
// image, held against the README's "Am I affected?" table, and said: on a metric
// (exit_guard_argo_exposure), in the log, and in the answer to a dry run (exit-guard check,
// helm test). It is observed only: no decision reads it, so a wrong reading changes what the
// guard says, never what it refuses or admits.

// exposure is what the "Am I affected?" table says of an Argo release (internal/argorelease).
type exposure = argorelease.Exposure

const (
	exposureExposed     = argorelease.Exposed
	exposureWriteBack   = argorelease.WriteBack
	exposureFixed       = argorelease.Fixed
	exposureOlder       = argorelease.Older
	exposureUnknown     = argorelease.Unknown
	maxArgoVersionsSeen = 16
)

// exposureWords say what an exposure means for the guard, in the log line and the dry run's
// warning.
var exposureWords = argorelease.Words

// exposureOf holds an Argo release (a tag such as v3.5.14) against the "Am I affected?" table.
func exposureOf(tag string) exposure { return argorelease.Of(tag) }

// executorTag is the tag of an executor image ("v3.5.14" of quay.io/argoproj/argoexec:v3.5.14),
// or "" for an image named by digest alone or without a tag.
func executorTag(image string) string { return argorelease.ImageTag(image) }

// argoVersions keeps the Argo releases seen on the pods judged (at most maxArgoVersionsSeen,
// the metric's series), their gauge, and the last image seen, so that the pod of the same
// image as the one before costs one atomic load. Only the pods the guard trusts to come from
// Argo's controller are observed (the pipeline's observedRelease): never a dry run, and, with
// Options.ExpectedRequester set, only that requester's. When the bound is reached, a release
// more exposed than the least exposed kept takes its place, so that no number of other tags can
// hide an exposed release; the summary says the most exposed release seen.
type argoVersions struct {
	log   logr.Logger
	gauge *prometheus.GaugeVec
	last  atomic.Pointer[string]
	// anyRequester: the guard has no Options.ExpectedRequester, so anyone who can create a pod
	// owned by a Workflow can add a release; the summary says so.
	anyRequester bool

	mu    sync.Mutex
	seen  map[string]exposure // by tag; "" for an image with none
	order map[string]int      // by tag: when it was first seen (a count)
	count int
}

// exposureRank orders exposures from the least to the most exposed: the summary says the
// highest seen, and the bound evicts the lowest first.
var exposureRank = argorelease.Rank

func newArgoVersions(log logr.Logger, anyRequester bool) *argoVersions {
	return &argoVersions{log: log, anyRequester: anyRequester, seen: map[string]exposure{}, order: map[string]int{},
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "exit_guard_argo_exposure",
			Help: "1 for each Argo Workflows release seen on the executor image of the pods the guard judged from Argo's controller (--expected-requester's pods when it is set; never a dry run) (version: the image's tag; unknown for an image without a release tag), by what the README's Am I affected? says of it (exposure: exposed, exposed-with-informer-write-back, fixed, older-than-supported, unknown). Observed only: no decision reads it."},
			[]string{"version", "exposure"})}
}

// seriesVersion is the version label of tag's series.
func seriesVersion(tag string, e exposure) string {
	if tag == "" || e == exposureUnknown {
		return "unknown"
	}
	return tag
}

// observe notes the executor image of a pod the guard judged ("" when it has none).
func (a *argoVersions) observe(image string) {
	if image == "" {
		return
	}
	if last := a.last.Load(); last != nil && *last == image {
		return
	}
	a.last.Store(&image)
	tag := executorTag(image)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.seen[tag]; ok {
		return
	}
	e := exposureOf(tag)
	if len(a.seen) >= maxArgoVersionsSeen {
		low, ok := a.leastExposed()
		if !ok || exposureRank[a.seen[low]] >= exposureRank[e] {
			return
		}
		lowExposure := a.seen[low]
		delete(a.seen, low)
		delete(a.order, low)
		if !a.keepsSeries(seriesVersion(low, lowExposure), lowExposure) {
			a.gauge.DeleteLabelValues(seriesVersion(low, lowExposure), string(lowExposure))
		}
	}
	a.count++
	a.seen[tag], a.order[tag] = e, a.count
	version := seriesVersion(tag, e)
	a.gauge.WithLabelValues(version, string(e)).Set(1)
	a.log.Info("Argo Workflows release seen on the pods the guard judges", "version", version, "image", image, "exposure", e, "meaning", exposureWords[e])
}

// leastExposed is the tag kept of the lowest exposure, the first seen among equals; a.mu is
// held.
func (a *argoVersions) leastExposed() (string, bool) {
	var low string
	found := false
	for tag, e := range a.seen {
		if !found || exposureRank[e] < exposureRank[a.seen[low]] || exposureRank[e] == exposureRank[a.seen[low]] && a.order[tag] < a.order[low] {
			low, found = tag, true
		}
	}
	return low, found
}

// keepsSeries says whether a tag kept shares the series of version and e (every tag without a
// release shares "unknown"); a.mu is held.
func (a *argoVersions) keepsSeries(version string, e exposure) bool {
	for tag, te := range a.seen {
		if te == e && seriesVersion(tag, te) == version {
			return true
		}
	}
	return false
}

// mostExposed is the tag kept of the highest exposure, the last seen among equals; a.mu is
// held.
func (a *argoVersions) mostExposed() string {
	var high string
	found := false
	for tag, e := range a.seen {
		if !found || exposureRank[e] > exposureRank[a.seen[high]] || exposureRank[e] == exposureRank[a.seen[high]] && a.order[tag] > a.order[high] {
			high, found = tag, true
		}
	}
	return high
}

// summary says what was seen, for the answer to a dry run: "" before any pod of Argo's. It
// names the most exposed release seen.
func (a *argoVersions) summary() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) == 0 {
		return ""
	}
	tag := a.mostExposed()
	e := a.seen[tag]
	version := tag
	if version == "" || e == exposureUnknown {
		version = "an executor image without a release tag"
	}
	s := fmt.Sprintf("exit-guard: Argo Workflows %s seen on the pods it judges: %s (%s)", version, e, exposureWords[e])
	if len(a.seen) > 1 {
		s += fmt.Sprintf("; %d releases seen since the guard started, the most exposed said (exit_guard_argo_exposure)", len(a.seen))
	}
	if a.anyRequester {
		s += "; read from pods of any requester: with guard.expectedRequester unset, anyone who can create a pod owned by a Workflow can add a release here"
	}
	return s
}
