package webhook

import (
	"context"
	"errors"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// storeState is what the guard's store holds for the workflow of a case.
type storeState int

const (
	storeEmpty storeState = iota
	storeRunning
	storeSucceeded
	storeFailed
	storeTombstone
	storeUnsettled          // seen by the metadata watch, labels that do not settle the phase
	storeSucceededTombstone // seen Succeeded, then deleted
)

// liveAnswer is what the live read of the workflow answers in a case.
type liveAnswer int

const (
	liveNone         liveAnswer = iota // the read must not be made
	liveRunning                        // same UID, Running
	liveUnknown                        // same UID, status.phase "" (a v4 retry)
	liveSucceeded                      // same UID, Succeeded
	liveFailed                         // same UID, Failed
	live404                            // not found
	liveOtherUID                       // another workflow holds the name
	liveOtherUIDDone                   // another workflow holds the name, and has completed
	liveFails                          // every attempt fails
	liveTimesOut                       // no answer within the budget
)

// nodesAnswer is what the whole read of the workflow that holds the name answers (row T6),
// about the tasks the write adds.
type nodesAnswer int

const (
	nodesNone               nodesAnswer = iota // the read must not be made
	nodesPending                               // the holder runs, each task its pending HTTP node
	nodesPendingExitHandler                    // the same, the node inside the holder\'s exit handler
	nodesNotWritten                            // the holder runs, its status lacks the nodes (its first pass)
	nodesDone                                  // the holder runs, the nodes have finished
	nodesOfPods                                // the holder runs, the nodes are pods
	nodesHolderDone                            // the holder has completed
	nodesAnotherHolder                         // yet another workflow holds the name now
	nodesFail                                  // the read fails
)

// cannedNodes is a whole read of the holder (uid-of-another, as liveOtherUID answers) that
// answers a about tasks, and counts its calls.
func cannedNodes(a nodesAnswer, tasks []string, calls *int) func(context.Context, string, string) (types.UID, argo.Phase, map[string]argo.Node, error) {
	return func(context.Context, string, string) (types.UID, argo.Phase, map[string]argo.Node, error) {
		*calls++
		uid, phase, nodes := types.UID("uid-of-another"), argo.PhaseRunning, map[string]argo.Node{}
		for _, id := range tasks {
			nodes[id] = argo.Node{Name: "notify[0].call", Type: argo.NodeTypeHTTP, Phase: "Pending"}
		}
		switch a {
		case nodesPending:
		case nodesPendingExitHandler:
			for id := range nodes {
				nodes[id] = argo.Node{Name: "notify.onExit[0].notify", Type: argo.NodeTypeHTTP, Phase: "Pending"}
			}
		case nodesNotWritten:
			nodes = nil
		case nodesDone:
			for id := range nodes {
				nodes[id] = argo.Node{Type: argo.NodeTypeHTTP, Phase: "Succeeded"}
			}
		case nodesOfPods:
			for id := range nodes {
				nodes[id] = argo.Node{Type: "Pod", Phase: "Pending"}
			}
		case nodesHolderDone:
			phase = argo.PhaseSucceeded
		case nodesAnotherHolder:
			uid = "uid-of-a-third"
		case nodesFail:
			return "", "", nil, errors.New("connection refused")
		default:
			return "", "", nil, errors.New("the whole read was made, and the case says it must not be")
		}
		return uid, phase, nodes, nil
	}
}

// tableWorkflow is the workflow every case is about.
var tableWorkflow = func() *unstructured.Unstructured {
	wf := fixture.Workflow("argo", "notify")
	wf.SetUID("uid-notify")
	return wf
}()

// cannedRead is a live read that answers a, and counts its calls.
func cannedRead(a liveAnswer, calls *int) func(context.Context, string, string, readPolicy) (*argo.Workflow, error) {
	return func(_ context.Context, namespace, name string, _ readPolicy) (*argo.Workflow, error) {
		*calls++
		wf := &argo.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: tableWorkflow.GetUID(), ResourceVersion: "42"}}
		switch a {
		case liveRunning:
			wf.Status.Phase = argo.PhaseRunning
		case liveUnknown:
		case liveSucceeded:
			wf.Status.Phase = argo.PhaseSucceeded
		case liveFailed:
			wf.Status.Phase = argo.PhaseFailed
		case live404:
			return nil, apierrors.NewNotFound(schema.GroupResource{Group: argo.Group, Resource: argo.Resource}, name)
		case liveOtherUID:
			wf.UID, wf.Status.Phase = "uid-of-another", argo.PhaseRunning
		case liveOtherUIDDone:
			wf.UID, wf.Status.Phase = "uid-of-another", argo.PhaseSucceeded
		case liveFails:
			return nil, errors.New("connection refused")
		case liveTimesOut:
			return nil, errors.Join(errLiveReadTimeout, context.DeadlineExceeded)
		default:
			return nil, errors.New("the live read was made, and the case says it must not be")
		}
		return wf, nil
	}
}

// podFacts are the facts the pod webhook reads from pod.
func podFacts(t *testing.T, pod any) facts {
	t.Helper()
	_, f, resp := readPodReview(reviewBody(admissionv1.AdmissionRequest{
		UID: "u", Operation: admissionv1.Create, Resource: podResource, Object: runtime.RawExtension{Raw: fixture.JSON(pod)},
	}))
	if resp != nil {
		t.Fatalf("reading a pod: answered %v", resp.Result)
	}
	return f
}

// taskSetFacts are the facts the TaskSet webhook reads from a write of wf's TaskSet: from an
// AdmissionReview with the object before (nil oldTasks: a CREATE) and after.
func taskSetFacts(t *testing.T, wf client.Object, oldTasks []string, oldCompleted string, newTasks []string, newCompleted string) facts {
	t.Helper()
	object := func(tasks []string, completed string) runtime.RawExtension {
		m := map[string]any{}
		for _, k := range tasks {
			m[k] = fixture.HTTPTask(k)
		}
		ts := fixture.TaskSet(wf, m)
		ts.SetLabels(map[string]string{argo.LabelCompleted: completed})
		return runtime.RawExtension{Raw: fixture.JSON(ts.Object)}
	}
	req := admissionv1.AdmissionRequest{
		UID: "u", Operation: admissionv1.Create, Namespace: wf.GetNamespace(), Name: wf.GetName(),
		Resource: taskSetResource, Object: object(newTasks, newCompleted),
	}
	if oldTasks != nil {
		req.Operation, req.OldObject = admissionv1.Update, object(oldTasks, oldCompleted)
	}
	_, f, resp := readTaskSetReview(reviewBody(req))
	if resp != nil {
		t.Fatalf("reading a TaskSet write: answered %v", resp.Result)
	}
	return f
}

// eventFacts are the facts the Event webhook reads from an Event about wf with reason.
func eventFacts(t *testing.T, wf client.Object, reason string) facts {
	t.Helper()
	ev := fixture.WorkflowEvent(wf, reason, "child 'x' failed")
	_, f, resp := readEventReview(reviewBody(admissionv1.AdmissionRequest{
		UID: "u", Operation: admissionv1.Create, Namespace: wf.GetNamespace(), Resource: eventResource, Object: runtime.RawExtension{Raw: fixture.JSON(ev)},
	}))
	if resp != nil {
		t.Fatalf("reading an Event: answered %v", resp.Result)
	}
	return f
}

// fakeClockStore is an empty store whose clock is the fake one it returns.
func fakeClockStore(t *testing.T) (*completionstore.Store, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	store, err := completionstore.New(completionstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return store, clk
}

// storeFor is a store that holds state for wf, and whose watch went stale if staleWatch.
func storeFor(t *testing.T, wf client.Object, state storeState, staleWatch bool) *completionstore.Store {
	t.Helper()
	store, clk := fakeClockStore(t)
	store.Progress("1")
	store.NoteLag(0)
	if staleWatch {
		clk.Step(time.Hour)
	}
	if state == storeEmpty {
		return store
	}
	o := completionstore.Observation{UID: wf.GetUID(), Namespace: wf.GetNamespace(), Name: wf.GetName(), ResourceVersion: "1"}
	switch state {
	case storeRunning:
		o.Phase = argo.PhaseRunning
	case storeSucceeded:
		o.Phase = argo.PhaseSucceeded
	case storeFailed:
		o.Phase = argo.PhaseFailed
	case storeTombstone:
		o.Phase, o.Deleted = argo.PhaseRunning, true
	case storeUnsettled:
		o.Phase = argo.PhaseUnsettled
	case storeSucceededTombstone:
		o.Phase, o.Deleted = argo.PhaseSucceeded, true
	}
	store.Observe(o)
	return store
}
