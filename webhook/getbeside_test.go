package webhook

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// slowListReader answers a LIST after listAfter (or at release, when set) with labels of
// listPhase (empty: no labels, so the phase is unsettled), and a GET at once with getPhase, or
// getErr.
type slowListReader struct {
	listAfter time.Duration
	release   chan struct{}
	listPhase argo.Phase
	getPhase  argo.Phase
	getErr    error
	gets      atomic.Int32
}

func (r *slowListReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.gets.Add(1)
	if r.getErr != nil {
		return r.getErr
	}
	wf := obj.(*argo.Workflow)
	wf.Namespace, wf.Name, wf.UID, wf.ResourceVersion, wf.Status.Phase = key.Namespace, key.Name, "uid", "9", r.getPhase
	return nil
}

func (r *slowListReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	var wait <-chan time.Time
	if r.release == nil {
		wait = time.After(r.listAfter)
	}
	select {
	case <-wait:
	case <-r.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	var lo client.ListOptions
	lo.ApplyOptions(opts)
	name, _ := lo.FieldSelector.RequiresExactMatch("metadata.name")
	labels := map[string]string{}
	if r.listPhase != "" {
		labels[argo.LabelPhase] = string(r.listPhase)
		labels[argo.LabelCompleted] = "false"
		if r.listPhase.Terminal() {
			labels[argo.LabelCompleted] = "true"
		}
	}
	list.(*metav1.PartialObjectMetadataList).Items = []metav1.PartialObjectMetadata{{ObjectMeta: metav1.ObjectMeta{
		Namespace: lo.Namespace, Name: name, UID: "uid", ResourceVersion: "8", Labels: labels}}}
	return nil
}

// TestGetBesideASlowList: a LIST that has not answered within getAfter gets a GET of the whole
// workflow beside it, and the first answer wins; a quick LIST costs no GET; a failed GET leaves
// the LIST to answer; with getAfter negative there is no GET.
func TestGetBesideASlowList(t *testing.T) {
	refuses := map[argo.Phase]bool{argo.PhaseSucceeded: true}
	serverError := apierrors.NewInternalError(errors.New("etcd is away"))
	for _, tc := range []struct {
		name     string
		reader   *slowListReader
		getAfter time.Duration
		// releaseAfter frees a LIST held on release this long after the read starts.
		releaseAfter time.Duration
		wantPhase    argo.Phase
		wantGets     int32
		wantBeside   float64
		// spent: the GETs beside have used their share of the LISTs.
		spent bool
	}{
		{"a slow LIST: the GET beside it answers", &slowListReader{release: make(chan struct{}), listPhase: argo.PhaseRunning, getPhase: argo.PhaseSucceeded},
			10 * time.Millisecond, 2 * time.Second, argo.PhaseSucceeded, 1, 1, false},
		{"a quick LIST: no GET", &slowListReader{listAfter: 0, listPhase: argo.PhaseRunning, getPhase: argo.PhaseSucceeded},
			time.Second, 0, argo.PhaseRunning, 0, 0, false},
		{"a slow LIST and a failed GET: the LIST answers", &slowListReader{release: make(chan struct{}), listPhase: argo.PhaseRunning, getErr: serverError},
			10 * time.Millisecond, 100 * time.Millisecond, argo.PhaseRunning, 1, 1, false},
		{"a slow LIST whose labels do not settle the phase, the GET failed: a GET after it decides", &slowListReader{release: make(chan struct{}), getErr: serverError},
			10 * time.Millisecond, 100 * time.Millisecond, "", 2, 1, false},
		{"no GET beside the LIST when getAfter is negative", &slowListReader{listAfter: 50 * time.Millisecond, listPhase: argo.PhaseRunning, getPhase: argo.PhaseSucceeded},
			-1, 0, argo.PhaseRunning, 0, 0, false},
		{"no GET beside a slow LIST once the GETs have used their share of the LISTs", &slowListReader{listAfter: 50 * time.Millisecond, listPhase: argo.PhaseRunning, getPhase: argo.PhaseSucceeded},
			10 * time.Millisecond, 0, argo.PhaseRunning, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := newGuard(tc.reader, storeFor(t, tableWorkflow, storeEmpty, false), Options{GetBesideListAfter: tc.getAfter})
			if err != nil {
				t.Fatal(err)
			}
			if tc.spent {
				// Each LIST earns a twentieth of a GET: a burst of GETs spends them.
				for g.getBudget.spend() {
				}
				g.getBudget.earn()
			}
			if tc.reader.release != nil && tc.releaseAfter > 0 {
				time.AfterFunc(tc.releaseAfter, func() { close(tc.reader.release) })
			}
			wf, err := g.readWorkflow(t.Context(), "ns", "wf", false, readPolicy{getAfter: g.opts.GetBesideListAfter, refuses: refuses})
			switch {
			case tc.wantPhase == "" && err == nil:
				t.Fatalf("read %v, want the GET's error", wf.Status.Phase)
			case tc.wantPhase == "":
			case err != nil:
				t.Fatal(err)
			case wf.Status.Phase != tc.wantPhase:
				t.Errorf("phase %q, want %q", wf.Status.Phase, tc.wantPhase)
			}
			if got := tc.reader.gets.Load(); got != tc.wantGets {
				t.Errorf("%d GETs, want %d", got, tc.wantGets)
			}
			if got := value(t, g.metrics.liveReadAttempts.WithLabelValues("get-beside-list")); got != tc.wantBeside {
				t.Errorf("exit_guard_live_read_retries_total{cause=get-beside-list} = %v, want %v", got, tc.wantBeside)
			}
			// The GET gives its token back once it has answered.
			if wait.PollUntilContextTimeout(t.Context(), time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
				return len(g.extraReads) == 0, nil
			}) != nil {
				t.Errorf("%d further-attempt tokens still held a second after the read", len(g.extraReads))
			}
		})
	}
}
