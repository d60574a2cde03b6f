//go:build envtest

package webhook

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// waitStore polls until the store's record of wf has the phase.
func waitStore(t *testing.T, s *completionstore.Store, wf *unstructured.Unstructured, phase argo.Phase) {
	t.Helper()
	waitRecord(t, s, wf, "reach "+string(phase), func(r completionstore.Record) bool { return r.Phase == phase })
}

// waitTombstone polls until the store holds a tombstone of wf.
func waitTombstone(t *testing.T, s *completionstore.Store, wf *unstructured.Unstructured) {
	t.Helper()
	waitRecord(t, s, wf, "deleted", func(r completionstore.Record) bool { return r.Deleted })
}

func waitRecord(t *testing.T, s *completionstore.Store, wf *unstructured.Unstructured, what string, cond func(completionstore.Record) bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) {
			r, ok := s.Get(wf.GetUID())
			return ok && cond(r), nil
		}); err != nil {
		t.Fatalf("the store never saw %s %s", wf.GetName(), what)
	}
}

// countEvents counts the occurrences of Events about wf: the events library folds Events with
// the same regarding object, reason, action and reporter into one with a series count.
func countEvents(t *testing.T, namespace string, wf client.Object) int {
	t.Helper()
	return testenv.CountEvents(t.Context(), t, env.Client, testenv.EventsAbout{Namespace: namespace, Name: wf.GetName(), UID: wf.GetUID()})
}

// eventsStayAtMost watches the occurrences of Events about wf for a while (Events are sent
// asynchronously) and says whether they stayed at most n.
func eventsStayAtMost(t *testing.T, namespace string, wf client.Object, n int) bool {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 3*time.Second, true,
		func(context.Context) (bool, error) { return countEvents(t, namespace, wf) > n, nil })
	return err != nil
}
