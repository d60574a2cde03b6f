//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// finishedAt is the workflow's status.finishedAt (to the second), or the zero time.
func finishedAt(ctx context.Context, c client.Client, wf *unstructured.Unstructured) time.Time {
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(argo.WorkflowGVK)
	if err := c.Get(ctx, client.ObjectKeyFromObject(wf), cur); err != nil {
		return time.Time{}
	}
	s, _, _ := unstructured.NestedString(cur.Object, "status", "finishedAt")
	at, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}
	}
	return at
}

func phase(ctx context.Context, c client.Client, wf *unstructured.Unstructured) argo.Phase {
	got := &argo.Workflow{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(wf), got); err != nil {
		return ""
	}
	return got.Status.Phase
}

// denials counts the guard's refusals for wf (Event occurrences: the recorder folds a repeat
// into the first Event's series and writes counts past the second only on its periodic
// refresh, so a workflow shows at most 2 within minutes), those of WorkflowTaskSet writes among
// them, and of those the updates.
func denials(ctx context.Context, t *testing.T, c client.Client, wf *unstructured.Unstructured) (all, taskSets, taskSetUpdates int) {
	var list eventsv1.EventList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Regarding.UID == wf.GetUID() && e.Reason == contract.EventReasonDenied {
			n := 1
			if e.Series != nil {
				n = int(e.Series.Count)
			}
			all += n
			if strings.HasSuffix(e.Action, "WorkflowTaskSet") {
				taskSets += n
			}
			if e.Action == "UpdateWorkflowTaskSet" {
				taskSetUpdates += n
			}
		}
	}
	return all, taskSets, taskSetUpdates
}

// refusalsLogged counts the refusals of the workflow of uid in the guard's log (a line each)
// and the time from the first to the last.
func refusalsLogged(out *testenv.Output, uid types.UID) (int, time.Duration) {
	var first, last time.Time
	lines := out.Lines(`"verdict":"denied"`, `"workflowUID":"`+string(uid)+`"`)
	for _, l := range lines {
		var entry struct {
			TS time.Time `json:"ts"`
		}
		if json.Unmarshal([]byte(l), &entry) != nil || entry.TS.IsZero() {
			continue
		}
		if first.IsZero() || entry.TS.Before(first) {
			first = entry.TS
		}
		if entry.TS.After(last) {
			last = entry.TS
		}
	}
	return len(lines), last.Sub(first)
}

// failedEvents counts the occurrences of WorkflowFailed Events about wf (core/v1, as Argo's
// controller records them; a repeat is a PATCH that raises count).
func failedEvents(ctx context.Context, t *testing.T, c client.Client, wf *unstructured.Unstructured) int {
	return testenv.CountEvents(ctx, t, c, testenv.EventsAbout{Namespace: namespace, Name: wf.GetName(), UID: wf.GetUID(), Reason: argo.EventReasonWorkflowFailed})
}
